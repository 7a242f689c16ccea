"""The bubblewrap command line of one run: what the program sees, and the rlimits it runs under.

:func:`probe_interpreter` asks the interpreter (once, outside the sandbox) where its executable,
standard library and shared libraries are; :func:`launcher_argv` turns that into
``bwrap ... python -E -s -B main.py``, which the run's reaper executes at ``nice`` 10 under the rlimits
of :func:`rlimit_args`:

* new user, PID, network, IPC, UTS and cgroup namespaces (``--unshare-all --unshare-user``), no
  further user namespaces (``--disable-userns``), a new session (no terminal injection), killed with
  the runner (``--die-with-parent``), all capabilities dropped, empty environment (``--clearenv``
  then ``HOME``, ``LANG``, ``PATH`` only), seccomp filter (:mod:`teamrl.sandbox.seccomp`);
* a root of its own holding only, read-only, the interpreter, its standard library (minus
  ``site-packages``, hidden under an empty tmpfs) and the shared libraries it and the standard
  library's extension modules link (as ``ldd`` lists them); ``/proc`` of its own PID namespace,
  a minimal ``/dev``; ``/work`` (cwd, ``HOME``) and ``/tmp`` as size-capped in-memory folders, the
  program and its files copied in from memfds;
* rlimits set on the launcher and inherited: CPU seconds, address space, processes (as root; as a
  normal user inside the run's user namespace, :func:`nproc_inside`), open files, file size, no core
  dumps; ``nice`` 10 so rollout and update keep the CPU.

Left out: running the command (``run.py``) and choosing the mechanism (``sandbox.py``).
"""

from __future__ import annotations

import functools
import glob
import json
import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from teamrl.sandbox.run import Limits

__all__ = ["Interpreter", "launcher_argv", "nproc_inside", "probe_interpreter", "rlimit_args"]

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


def rlimit_args(limits: Limits, *, processes: bool, own_tasks: int = 3) -> list[str]:
    """The rlimits of a run, as ``prlimit`` options (:mod:`teamrl.sandbox.reaper` sets them before its exec).

    Args:
        limits: The run's limits.
        processes: Whether to set RLIMIT_NPROC (only meaningful when the run has a host user of its own).
        own_tasks: Tasks of that user before the program starts any (bubblewrap's monitor and init and the
            interpreter: 3; the interpreter alone without bubblewrap: 1); RLIMIT_NPROC is this plus
            ``limits.processes``.

    >>> rlimit_args(Limits(cpu_seconds=2.5, memory_bytes=2**28, processes=8, open_files=32, disk_bytes=2**20),
    ...             processes=True)  # doctest: +NORMALIZE_WHITESPACE
    ['--cpu=3:4', '--as=268435456', '--nofile=32', '--fsize=1048576', '--core=0', '--nproc=11']
    """
    cpu = max(1, math.ceil(limits.cpu_seconds))
    args = [f"--cpu={cpu}:{cpu + 1}", f"--as={limits.memory_bytes}", f"--nofile={limits.open_files}",
            f"--fsize={limits.disk_bytes}", "--core=0"]
    if processes:
        args.append(f"--nproc={limits.processes + own_tasks}")
    return args


def nproc_inside(limits: Limits) -> int:
    """RLIMIT_NPROC the program sets on itself inside its user namespace (see :func:`launcher_argv`).

    Linux >= 5.14 counts RLIMIT_NPROC per user namespace and uid (and in every namespace above
    it against that namespace creator's limit), so a limit set inside the run's own namespace
    bounds the run's processes and threads whatever else its host user runs. The namespace holds
    bubblewrap's init and the interpreter:

    >>> nproc_inside(Limits(processes=8))
    10
    """
    return limits.processes + 2


def launcher_argv(interp: Interpreter, limits: Limits, *, files: dict[str, int], args: list[str],
                  seccomp_fd: int | None, bwrap: str, inside_nproc: int | None = None,
                  prlimit: str = "/usr/bin/prlimit") -> list[str]:
    """The bubblewrap command line of one sandboxed run (its rlimits and ``nice`` are set by the run's
    reaper before it executes this: :func:`rlimit_args`, :mod:`teamrl.sandbox.reaper`).

    Args:
        interp: The probed interpreter.
        limits: The run's limits.
        files: Sandbox-relative file name -> readable file descriptor holding its bytes (``main.py`` first).
        args: Arguments after the interpreter (e.g. ``["main.py"]``).
        seccomp_fd: Descriptor holding the seccomp program, or None for none.
        inside_nproc: RLIMIT_NPROC set inside the sandbox, in the run's own user namespace, before the
            interpreter starts (``prlimit --nproc=N -- python ...``, the host's ``prlimit`` mounted read-only
            at the same path), None for none.
        bwrap: Path of the bubblewrap binary.
        prlimit: Path of the host's ``prlimit`` (util-linux), for ``inside_nproc``.

    Returns:
        The argv list.
    """
    argv = [bwrap,
            "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--clearenv",
            "--setenv", "HOME", WORKDIR, "--setenv", "LANG", "C.UTF-8", "--setenv", "PATH", "/usr/bin:/bin"]
    binds = list(interp.ro_binds)
    if inside_nproc is not None:
        binds += [(prlimit, prlimit), *((d, d) for d in _lib_folders([prlimit]) if (d, d) not in binds)]
    for host, where in binds:
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
    command = [interp.executable, "-E", "-s", "-B", *args]
    if inside_nproc is not None:
        return [*argv, prlimit, f"--nproc={inside_nproc}", "--", *command]
    return [*argv, *command]


@functools.lru_cache(maxsize=8)
def _lib_folders_cached(paths: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted({os.path.realpath(os.path.dirname(lib)) for lib in _ldd_paths(list(paths))}))


def _lib_folders(paths: list[str]) -> tuple[str, ...]:
    """Folders (symlinks resolved) of the shared libraries ``paths`` link (``ldd``, once per set of paths)."""
    return _lib_folders_cached(tuple(paths))
