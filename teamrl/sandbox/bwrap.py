"""The bubblewrap command line of one run: what the program sees, and the rlimits it runs under.

:func:`probe_interpreter` asks the interpreter (once, outside the sandbox) where its executable,
standard library and shared libraries are; :func:`launcher_argv` turns that into
``[nice] prlimit ... -- bwrap ... python -E -s -B main.py``:

* new user, PID, network, IPC, UTS and cgroup namespaces (``--unshare-all --unshare-user``), no
  further user namespaces (``--disable-userns``), a new session (no terminal injection), killed with
  the runner (``--die-with-parent``), all capabilities dropped, empty environment (``--clearenv``
  then ``HOME``, ``LANG``, ``PATH`` only), seccomp filter (:mod:`teamrl.sandbox.seccomp`);
* a root of its own holding only, read-only, the interpreter, its standard library (minus
  ``site-packages``, hidden under an empty tmpfs) and the shared libraries it and the standard
  library's extension modules link (as ``ldd`` lists them); ``/proc`` of its own PID namespace,
  a minimal ``/dev``; ``/work`` (cwd, ``HOME``) and ``/tmp`` as size-capped in-memory folders, the
  program and its files copied in from memfds;
* rlimits set by ``prlimit`` on the launcher and inherited: CPU seconds, address space,
  processes, open files, file size, no core dumps; ``nice`` 10 so rollout and update keep the CPU.

Left out: running the command (``run.py``) and choosing the mechanism (``sandbox.py``).
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from teamrl.sandbox.run import Limits

__all__ = ["Interpreter", "launcher_argv", "probe_interpreter", "rlimit_args"]

_PROBE = ("import json, sys, sysconfig; p = sysconfig.get_paths(); "
          "print(json.dumps([sys.executable, p['stdlib'], p['platstdlib'], sys.version.split()[0]]))")
_LDD_LINE = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x")
WORKDIR = "/work"
"""The program's folder (cwd and HOME) inside the sandbox."""


@dataclass(frozen=True)
class Interpreter:
    """Where a Python interpreter's files are, as the sandbox must show them."""

    executable: str
    """Absolute path of the interpreter binary (symlinks resolved)."""
    version: str
    """``sys.version`` number, e.g. "3.11.2"."""
    ro_binds: tuple[tuple[str, str], ...]
    """(host path, sandbox path) pairs mounted read-only."""
    hidden: tuple[str, ...]
    """Folders inside the binds covered by an empty tmpfs (site-packages)."""


def _ldd_paths(paths: list[str]) -> set[str]:
    """Shared-library paths (as the loader names them) the binaries in ``paths`` link."""
    ldd = shutil.which("ldd")
    if ldd is None or not paths:
        return set()
    out = subprocess.run([ldd, *paths], capture_output=True, text=True, timeout=60).stdout
    return {m.group(1) for line in out.splitlines() if (m := _LDD_LINE.search(line))}


def probe_interpreter(python: str) -> Interpreter:
    """Find what ``python`` needs to start and import its standard library.

    Args:
        python: Path of a Python 3 interpreter.

    Returns:
        Its :class:`Interpreter` record.
    """
    exe = shutil.which(python) or python
    if not os.path.isfile(exe):
        raise ValueError(f"sandbox interpreter {python!r} not found; name an installed Python 3 (e.g. /usr/bin/python3)")
    done = subprocess.run([exe, "-E", "-s", "-c", _PROBE], capture_output=True, text=True, timeout=60, env={})
    if done.returncode != 0:
        raise ValueError(f"sandbox interpreter {exe!r} failed to start: {done.stderr.strip()[-300:]}")
    executable, stdlib, platstdlib, version = json.loads(done.stdout)
    executable = os.path.realpath(executable or exe)
    binaries = [executable, *glob.glob(os.path.join(platstdlib, "lib-dynload", "*.so"))]
    binds: dict[str, str] = {executable: executable}
    for root in {os.path.realpath(stdlib), os.path.realpath(platstdlib)}:
        binds[root] = root
    for lib in _ldd_paths(binaries):
        folder = os.path.dirname(lib)
        real = os.path.realpath(folder)
        binds[folder] = real
        binds[real] = real
    hidden = tuple(sorted({os.path.join(os.path.realpath(d), "site-packages") for d in (stdlib, platstdlib)
                           if os.path.isdir(os.path.join(d, "site-packages"))}))
    pairs = tuple(sorted(((host, where) for where, host in binds.items()), key=lambda p: p[1]))
    return Interpreter(executable, version, pairs, hidden)


def rlimit_args(limits: Limits, *, processes: bool) -> list[str]:
    """``prlimit`` options for ``limits``.

    Args:
        limits: The run's limits.
        processes: Whether to set RLIMIT_NPROC (only meaningful when the run has a host user of its own).

    >>> rlimit_args(Limits(cpu_seconds=2.5, memory_bytes=2**28, processes=8, open_files=32, disk_bytes=2**20),
    ...             processes=True)  # doctest: +NORMALIZE_WHITESPACE
    ['--cpu=3:4', '--as=268435456', '--nofile=32', '--fsize=1048576', '--core=0', '--nproc=11']
    """
    cpu = max(1, math.ceil(limits.cpu_seconds))
    args = [f"--cpu={cpu}:{cpu + 1}", f"--as={limits.memory_bytes}", f"--nofile={limits.open_files}",
            f"--fsize={limits.disk_bytes}", "--core=0"]
    if processes:
        args.append(f"--nproc={limits.processes + 3}")  # + bwrap's monitor and init, + the interpreter itself
    return args


def launcher_argv(interp: Interpreter, limits: Limits, *, files: dict[str, int], args: list[str],
                  seccomp_fd: int | None, processes: bool, prefix: list[str], bwrap: str) -> list[str]:
    """The full command line of one sandboxed run.

    Args:
        interp: The probed interpreter.
        limits: The run's limits.
        files: Sandbox-relative file name -> readable file descriptor holding its bytes (``main.py`` first).
        args: Arguments after the interpreter (e.g. ``["main.py"]``).
        seccomp_fd: Descriptor holding the seccomp program, or None for none.
        processes: Whether to set RLIMIT_NPROC.
        prefix: Programs the launcher starts with (``nice -n 10``, ``prlimit``), resolved paths.
        bwrap: Path of the bubblewrap binary.

    Returns:
        The argv list.
    """
    argv = [*prefix, *rlimit_args(limits, processes=processes), "--", bwrap,
            "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--clearenv",
            "--setenv", "HOME", WORKDIR, "--setenv", "LANG", "C.UTF-8", "--setenv", "PATH", "/usr/bin:/bin"]
    for host, where in interp.ro_binds:
        argv += ["--ro-bind", host, where]
    for folder in interp.hidden:
        argv += ["--tmpfs", folder]
    argv += ["--proc", "/proc", "--dev", "/dev",
             "--size", str(limits.disk_bytes), "--tmpfs", "/tmp",
             "--size", str(limits.disk_bytes), "--tmpfs", WORKDIR]
    for name, fd in files.items():
        argv += ["--perms", "0644", "--file", str(fd), f"{WORKDIR}/{name}"]
    argv += ["--remount-ro", "/", "--chdir", WORKDIR]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return [*argv, interp.executable, "-E", "-s", "-B", *args]
