"""The sandbox: isolation mechanism chosen once, a pool of run slots, and ``run_python``.

``Sandbox(mechanism="auto")`` decides how programs are isolated when it is built and logs it:

* ``bwrap``: bubblewrap namespaces, rlimits and seccomp (:mod:`teamrl.sandbox.bwrap`). As root,
  each run also gets a host user of its own (uids from ``2000000``, no home, no groups, 256 per
  sandbox in rotation), so RLIMIT_NPROC bounds that run's processes, the program cannot signal
  anything else even through a hole in the PID namespace, and whatever it leaves behind is killed
  as that user after the run; as another user the runs keep that user and RLIMIT_NPROC
  is not set (it would count the user's own processes), which is logged;
* ``unsafe_no_isolation``: rlimits and an empty environment only, in a host temporary folder;
  for machines without bubblewrap where the user accepts that model-written code can read and
  write their files and use the network. Chosen only by name, and warned about at every start.

``auto`` is ``bwrap`` when the ``bwrap`` binary is installed and a self-test program runs under
it; otherwise building the sandbox raises :class:`SandboxUnavailable` with the fix (install the
Debian package ``bubblewrap``; ``scripts/setup.sh`` does). ``TEAMRL_SANDBOX`` in the environment
names the mechanism for :func:`default_sandbox`; ``TEAMRL_SANDBOX_PYTHON`` the interpreter.

Runs execute on ``workers`` threads (default: the number of CPUs); each waits in a child process,
so the trainer's Python threads stay free, and programs run at ``nice`` 10.

Left out: a ``unshare(1)`` fallback (bubblewrap is in every major distribution's packages),
cgroup limits (per-run users give the process limit; memory is RLIMIT_AS) and languages other
than Python.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from teamrl.sandbox.bwrap import Interpreter, launcher_argv, probe_interpreter, rlimit_args
from teamrl.sandbox.run import Limits, Run, execute
from teamrl.sandbox.seccomp import filter_bytes
from teamrl.suggest import did_you_mean

__all__ = ["MECHANISMS", "Job", "Sandbox", "SandboxUnavailable", "default_sandbox", "run_python"]

log = logging.getLogger(__name__)

MECHANISMS: tuple[str, ...] = ("auto", "bwrap", "unsafe_no_isolation")
"""Accepted values of ``Sandbox(mechanism=...)`` and ``TEAMRL_SANDBOX``."""

_UID_BASE = 2_000_000
_UIDS_PER_SANDBOX = 256
_instances = itertools.count()
_default: Sandbox | None = None
_default_lock = threading.Lock()
_FIX = "install bubblewrap (apt-get install bubblewrap; scripts/setup.sh does it)"


class SandboxUnavailable(ValueError):
    """No isolation mechanism works on this machine; the message names the fix."""


@dataclass(frozen=True)
class Job:
    """One program to run: its source, standard input, extra files and limits."""

    source: str
    stdin: str | bytes | None = None
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)


def _default_python() -> str:
    if os.environ.get("TEAMRL_SANDBOX_PYTHON"):
        return os.environ["TEAMRL_SANDBOX_PYTHON"]
    return "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else os.path.realpath(sys.executable)


def _processes_of(uid: int) -> tuple[int, int]:
    """(live, zombie) processes of host user ``uid`` (a scan of /proc)."""
    live = zombies = 0
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                with open(f"/proc/{entry.name}/stat", "rb") as fh:
                    state = fh.read().rsplit(b")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            if state in (b"Z", b"X"):
                zombies += 1
            else:
                live += 1
    return live, zombies


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name.replace("/", "_"), 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _check_name(name: str) -> str:
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts) or name == "main.py":
        raise ValueError(f"sandbox file name {name!r} must be a relative path without '..' and not main.py")
    return name


class Sandbox:
    """Runs Python programs in isolation, several at a time.

    Args:
        mechanism: One of :data:`MECHANISMS`.
        python: Interpreter the programs run on (default: ``/usr/bin/python3``, else this one).
        workers: Runs at the same time (default: the number of CPUs).
    """

    def __init__(self, *, mechanism: str = "auto", python: str | None = None, workers: int | None = None) -> None:
        if mechanism not in MECHANISMS:
            raise ValueError(f"unknown sandbox mechanism {mechanism!r}{did_you_mean(mechanism, MECHANISMS)}; "
                             f"use one of {', '.join(MECHANISMS)}")
        self.workers = int(workers or os.cpu_count() or 1)
        if self.workers < 1:
            raise ValueError(f"sandbox workers must be >= 1, got {workers!r}")
        self._bwrap = shutil.which("bwrap")
        if mechanism == "auto":
            if self._bwrap is None:
                raise SandboxUnavailable(f"no sandbox for model-written code: bwrap not found; {_FIX} "
                                         "(or name the mechanism 'unsafe_no_isolation' to run it unisolated)")
            mechanism = "bwrap"
        if mechanism == "bwrap" and self._bwrap is None:
            raise SandboxUnavailable(f"sandbox mechanism 'bwrap' asked for but bwrap is not installed; {_FIX}")
        self.mechanism = mechanism
        self.interpreter: Interpreter = probe_interpreter(python or _default_python())
        self._as_root = os.geteuid() == 0
        nice = shutil.which("nice")
        self._prefix = [nice, "-n", "10"] if nice else []
        prlimit = shutil.which("prlimit")
        if prlimit is None:
            raise SandboxUnavailable("prlimit not found; install util-linux (apt-get install util-linux)")
        self._prefix.append(prlimit)
        self._kill = shutil.which("kill") or "/bin/kill"
        self._seccomp = filter_bytes() if mechanism == "bwrap" else None
        self._slots: queue.SimpleQueue[int] = queue.SimpleQueue()
        for slot in range(self.workers):
            self._slots.put(slot)
        base = _UID_BASE + (os.getpid() % 7000) * 1024 + (next(_instances) % 4) * _UIDS_PER_SANDBOX
        self._uids = itertools.cycle(range(base, base + _UIDS_PER_SANDBOX))
        self._uid_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="sandbox")
        self._self_test()
        log.info("%s", self.describe())
        if mechanism == "unsafe_no_isolation":
            log.warning("SANDBOX DISABLED (unsafe_no_isolation): model-written code runs with rlimits only and can "
                        "read and write this machine's files and use its network")

    def describe(self) -> str:
        """One line naming the mechanism, interpreter and parallelism."""
        parts = [f"sandbox: {self.mechanism}", f"python {self.interpreter.version} ({self.interpreter.executable})",
                 f"{self.workers} workers"]
        if self.mechanism == "bwrap":
            parts.append("seccomp on" if self._seccomp else "seccomp unavailable on this architecture")
        parts.append("per-run users + RLIMIT_NPROC" if self._as_root else "no RLIMIT_NPROC (not root)")
        return ", ".join(parts)

    def _self_test(self) -> None:
        run = self.run("print(6 * 7)", limits=Limits(cpu_seconds=10, wall_seconds=30))
        if run.verdict != "ok" or run.stdout.strip() != "42":
            raise SandboxUnavailable(f"sandbox self-test under {self.mechanism} failed ({run.verdict}, exit "
                                     f"{run.exit_code}): {run.stderr.strip()[-300:]!r}; {_FIX} and check that user "
                                     "namespaces are enabled (sysctl user.max_user_namespaces > 0)")

    def run(self, source: str, *, stdin: str | bytes | None = None, files: Mapping[str, str | bytes] | None = None,
            limits: Limits | None = None) -> Run:
        """Run ``source`` as ``main.py`` and wait for its verdict (blocks while all slots are busy).

        Args:
            source: The program.
            stdin: Its standard input.
            files: Extra files placed beside it, relative name -> content.
            limits: Its limits (default :class:`Limits`).

        Returns:
            The :class:`Run`.
        """
        limits = limits or Limits()
        data = {"main.py": source.encode()}
        for name, content in (files or {}).items():
            data[_check_name(name)] = content.encode() if isinstance(content, str) else bytes(content)
        raw_in = stdin.encode() if isinstance(stdin, str) else (stdin or b"")
        slot = self._slots.get()
        uid = self._take_uid() if self._as_root else None
        try:
            if self.mechanism == "bwrap":
                return self._run_bwrap(data, raw_in, limits, uid)
            return self._run_unsafe(data, raw_in, limits, uid)
        finally:
            if uid is not None:
                self._clear(uid)
            self._slots.put(slot)

    def _take_uid(self) -> int:
        """The next host user of the rotation with no process left (not even a zombie to be reaped).

        Each run has its own user, so RLIMIT_NPROC counts that run's processes only. The sandbox's init
        can stay a zombie for a moment after a run (reaped by the machine's init), so users rotate.
        """
        with self._uid_lock:
            uid = next(self._uids)
            for _ in range(_UIDS_PER_SANDBOX - 1):
                if _processes_of(uid) == (0, 0):
                    break
                uid = next(self._uids)
            return uid

    def _clear(self, uid: int) -> None:
        """Kill every process left of run user ``uid`` (as that user) until none is alive.

        The kernel kills a run's PID namespace when its init exits, but not at once; a fork bomb's
        processes can outlive the run by a moment.
        """
        deadline = time.monotonic() + 5.0
        while _processes_of(uid)[0] and time.monotonic() < deadline:
            subprocess.run([self._kill, "-9", "-1"], user=uid, group=uid, extra_groups=[], env={},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
            time.sleep(0.005)

    def _run_bwrap(self, data: dict[str, bytes], stdin: bytes, limits: Limits, uid: int | None) -> Run:
        """One run under bubblewrap as host user ``uid`` (None: this process's user)."""
        fds = {name: _memfd(name, content) for name, content in data.items()}
        sec = _memfd("seccomp", self._seccomp) if self._seccomp else None
        try:
            argv = launcher_argv(self.interpreter, limits, files=fds, args=["main.py"], seccomp_fd=sec,
                                 processes=uid is not None, prefix=self._prefix, bwrap=str(self._bwrap))
            passed = [*fds.values(), *([sec] if sec is not None else [])]
            return execute(argv, stdin=stdin, limits=limits, pass_fds=passed, user=uid)
        finally:
            for fd in [*fds.values(), *([sec] if sec is not None else [])]:
                os.close(fd)

    def _run_unsafe(self, data: dict[str, bytes], stdin: bytes, limits: Limits, uid: int | None) -> Run:
        with tempfile.TemporaryDirectory(prefix="teamrl-unsafe-") as folder:
            for name, content in data.items():
                path = os.path.join(folder, name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as fh:
                    fh.write(content)
            if uid is not None:
                for root, dirs, names in os.walk(folder):
                    for entry in [root, *(os.path.join(root, n) for n in dirs + names)]:
                        os.chown(entry, uid, uid)
            argv = [*self._prefix, *rlimit_args(limits, processes=uid is not None), "--",
                    self.interpreter.executable, "-E", "-s", "-B", os.path.join(folder, "main.py")]
            return execute(argv, stdin=stdin, limits=limits, user=uid, cwd=folder)

    def submit(self, job: Job) -> Future[Run]:
        """Queue ``job`` on the pool; the future's result is its :class:`Run`."""
        return self._pool.submit(self.run, job.source, stdin=job.stdin, files=job.files, limits=job.limits)

    def map(self, jobs: Iterable[Job]) -> list[Run]:
        """Run every job on the pool and return their runs in order."""
        return [f.result() for f in [self.submit(job) for job in jobs]]

    def close(self) -> None:
        """Stop the pool after the queued runs end."""
        self._pool.shutdown(wait=True)


def default_sandbox() -> Sandbox:
    """The process-wide sandbox, built on first use from ``TEAMRL_SANDBOX`` (default ``auto``)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Sandbox(mechanism=os.environ.get("TEAMRL_SANDBOX", "auto"))
        return _default


def run_python(source: str, *, stdin: str | bytes | None = None, files: Mapping[str, str | bytes] | None = None,
               limits: Limits | None = None, sandbox: Sandbox | None = None) -> Run:
    """Run a Python program in the sandbox and return its :class:`Run` (see :meth:`Sandbox.run`).

    Args:
        source: The program, run as ``main.py`` in an empty folder.
        stdin: Its standard input.
        files: Extra files beside it.
        limits: Its limits.
        sandbox: The sandbox to use (default :func:`default_sandbox`).
    """
    return (sandbox or default_sandbox()).run(source, stdin=stdin, files=files, limits=limits)
