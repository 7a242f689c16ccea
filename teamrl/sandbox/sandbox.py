"""The sandbox: isolation mechanism chosen once, a pool of run slots, and ``run_python``.

``Sandbox(mechanism="auto")`` decides how programs are isolated when it is built and logs it:

* ``bwrap``: bubblewrap namespaces, rlimits and seccomp (:mod:`teamrl.sandbox.bwrap`). A run's
  processes and threads are bounded per run (``Limits.processes``), whoever starts the trainer:

  - as root, each run gets a host user of its own (uids from ``2000000``, no home, no groups, 256
    per sandbox in rotation) under RLIMIT_NPROC, so the program cannot signal anything else even
    through a hole in the PID namespace, and whatever it leaves behind is killed as that user;
  - as a normal user, the program sets RLIMIT_NPROC on itself inside the run's own user namespace,
    where Linux >= 5.14 counts it for that namespace only: a fork bomb stops at its limit and the
    user's own processes and threads keep starting. The self-test checks that the kernel counts it
    so; where it does not, the start-up line says ``processes: NOT bounded per run`` with a warning
    naming what to change;
* ``unsafe_no_isolation``: rlimits and an empty environment only, in a host temporary folder;
  for machines without bubblewrap where the user accepts that model-written code can read and
  write their files and use the network. Chosen only by name, and warned about at every start.

Every run starts under a reaper of its own (:mod:`teamrl.sandbox.reaper`, a child subreaper), so
nothing a run leaves, not even the zombie of its namespace's init, reaches the trainer or PID 1:
runs leave no zombie also as PID 1 of a container that never reaps.

``auto`` is ``bwrap`` when the ``bwrap`` binary is installed and a self-test program runs under
it; otherwise building the sandbox raises :class:`SandboxUnavailable` with the fix (install the
Debian package ``bubblewrap``; allow user namespaces where a container or the host forbids them).
``TEAMRL_SANDBOX`` in the environment names the mechanism for :func:`default_sandbox`;
``TEAMRL_SANDBOX_PYTHON`` the interpreter.

Runs execute on ``workers`` threads (default: the number of CPUs); each waits in a child process,
so the trainer's Python threads stay free, and programs run at ``nice`` 10.

Left out: a ``unshare(1)`` fallback (bubblewrap is in every major distribution's packages),
cgroup limits (a cgroup of its own needs a delegated cgroup tree, which neither a plain login nor
most containers give; the user-namespace count works without one; memory is RLIMIT_AS) and
languages other than Python.
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
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from teamrl.sandbox.bwrap import Interpreter, launcher_argv, nproc_inside, probe_interpreter, rlimit_args
from teamrl.sandbox.reaper import reaper_argv
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
_PROBE_PROCESSES = 4
_NICE = 10  # programs yield the CPU to rollout and update
_SELF_TEST = f"""
import os, time
print(6 * 7)
started = []
for _ in range({_PROBE_PROCESSES + 4}):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    started.append(pid)
for pid in started:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
print(len(started))
"""
_NO_PROCESS_LIMIT = ("processes are NOT bounded per run: this kernel does not count RLIMIT_NPROC per user namespace "
                     "(Linux >= 5.14 does) and the trainer does not run as root (which gives each run a host user "
                     "of its own), so a fork bomb can take every process this user may start until its wall limit; "
                     "run on Linux >= 5.14 or as root, or bound the whole trainer, e.g. "
                     "systemd-run --user --scope -p TasksMax=4096 teamrl train ...")


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


def process_states() -> Iterator[tuple[int, bytes]]:
    """(host uid, state letter) of every process in this PID namespace (a scan of /proc; ``Z``: a zombie)."""
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                uid = entry.stat(follow_symlinks=False).st_uid
                with open(f"/proc/{entry.name}/stat", "rb") as fh:
                    yield uid, fh.read().rsplit(b")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue


def _processes_of(uid: int) -> tuple[int, int]:
    """(live, zombie) processes of host user ``uid``."""
    states = [state for owner, state in process_states() if owner == uid]
    zombies = sum(state in (b"Z", b"X") for state in states)
    return len(states) - zombies, zombies


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
        # How a run's processes are bounded: per-run host users (root), RLIMIT_NPROC inside the run's
        # own user namespace (a normal user; the self-test checks the kernel counts it there), or not.
        self.process_limit = "users" if self._as_root else "userns" if mechanism == "bwrap" else "none"
        self._kill = shutil.which("kill") or "/bin/kill"
        self._prlimit = shutil.which("prlimit")
        if self.process_limit == "userns" and self._prlimit is None:
            raise SandboxUnavailable("prlimit not found (it sets each run's process limit); install util-linux "
                                     "(apt-get install util-linux)")
        self._seccomp = filter_bytes() if mechanism == "bwrap" else None
        self._slots: queue.SimpleQueue[int] = queue.SimpleQueue()
        for slot in range(self.workers):
            self._slots.put(slot)
        base = _UID_BASE + (os.getpid() % 7000) * 1024 + (next(_instances) % 4) * _UIDS_PER_SANDBOX
        self._uids = itertools.cycle(range(base, base + _UIDS_PER_SANDBOX))
        self.uid_range = range(base, base + _UIDS_PER_SANDBOX) if self.process_limit == "users" else range(0)
        """The host users this sandbox's runs get (as root; empty otherwise)."""
        self._uid_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="sandbox")
        self._self_test()
        log.info("%s", self.describe())
        if self.process_limit == "none":
            log.warning("sandbox: %s", _NO_PROCESS_LIMIT)
        if mechanism == "unsafe_no_isolation":
            log.warning("SANDBOX DISABLED (unsafe_no_isolation): model-written code runs with rlimits only and can "
                        "read and write this machine's files and use its network")

    def describe(self) -> str:
        """One line naming the mechanism, interpreter and parallelism."""
        parts = [f"sandbox: {self.mechanism}", f"python {self.interpreter.version} ({self.interpreter.executable})",
                 f"{self.workers} workers"]
        if self.mechanism == "bwrap":
            parts.append("seccomp on" if self._seccomp else "seccomp unavailable on this architecture")
        parts.append({"users": "processes: a host user per run + RLIMIT_NPROC",
                      "userns": "processes: RLIMIT_NPROC in each run's user namespace",
                      "none": "processes: NOT bounded per run"}[self.process_limit])
        parts.append("leftovers reaped per run")
        return ", ".join(parts)

    def _self_test(self) -> None:
        """Run a program that prints 42 and starts processes until refused; the limit must hold at exactly
        ``processes`` (a kernel that counts RLIMIT_NPROC per host user only would refuse the first)."""
        limits = Limits(cpu_seconds=10, wall_seconds=30, processes=_PROBE_PROCESSES)
        run = self.run(_SELF_TEST, limits=limits)
        if run.verdict != "ok" or run.stdout.split()[:1] != ["42"]:
            raise SandboxUnavailable(_self_test_failure(self.mechanism, run))
        started = int(run.stdout.split()[1])
        if self.process_limit != "none" and started != _PROBE_PROCESSES:
            if self.process_limit == "users":
                raise SandboxUnavailable(f"sandbox self-test: the per-run process limit let {started} processes "
                                         f"start where {_PROBE_PROCESSES} were allowed")
            self.process_limit = "none"  # the kernel does not count RLIMIT_NPROC per user namespace

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
        uid = self._take_uid() if self.process_limit == "users" else None
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
            inside = nproc_inside(limits) if self.process_limit == "userns" else None
            argv = launcher_argv(self.interpreter, limits, files=fds, args=["main.py"], seccomp_fd=sec,
                                 bwrap=str(self._bwrap), inside_nproc=inside, prlimit=str(self._prlimit))
            passed = [*fds.values(), *([sec] if sec is not None else [])]
            reaper = reaper_argv(self.interpreter.executable, argv, user=uid, nice=_NICE,
                                 rlimits=rlimit_args(limits, processes=uid is not None))
            return execute(reaper, stdin=stdin, limits=limits, pass_fds=passed)
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
            argv = [self.interpreter.executable, "-E", "-s", "-B", os.path.join(folder, "main.py")]
            reaper = reaper_argv(self.interpreter.executable, argv, user=uid, nice=_NICE,
                                 rlimits=rlimit_args(limits, processes=uid is not None, own_tasks=1))
            return execute(reaper, stdin=stdin, limits=limits, cwd=folder)

    def submit(self, job: Job) -> Future[Run]:
        """Queue ``job`` on the pool; the future's result is its :class:`Run`."""
        return self._pool.submit(self.run, job.source, stdin=job.stdin, files=job.files, limits=job.limits)

    def map(self, jobs: Iterable[Job]) -> list[Run]:
        """Run every job on the pool and return their runs in order."""
        return [f.result() for f in [self.submit(job) for job in jobs]]

    def close(self) -> None:
        """Stop the pool after the queued runs end."""
        self._pool.shutdown(wait=True)


def _self_test_failure(mechanism: str, run: Run) -> str:
    """The one-line refusal when the self-test program does not run, naming the likely cause."""
    err = run.stderr.strip()
    head = f"sandbox self-test under {mechanism} failed ({run.verdict}, exit {run.exit_code}): {err[-300:]!r}; "
    if mechanism == "bwrap" and ("namespace" in err or "Operation not permitted" in err or "setting up uid map" in err):
        return head + ("bubblewrap cannot create user namespaces here. In a container: allow them "
                       "(docker run --security-opt seccomp=unconfined --security-opt apparmor=unconfined, or a "
                       "profile allowing unshare/clone with CLONE_NEWUSER; podman allows them by default); on the "
                       "host: sysctl user.max_user_namespaces > 0 (and kernel.unprivileged_userns_clone=1 or "
                       "kernel.apparmor_restrict_unprivileged_userns=0 where those exist). Or name the mechanism "
                       "'unsafe_no_isolation' to run model-written code without isolation")
    return head + f"{_FIX} and check that user namespaces are enabled (sysctl user.max_user_namespaces > 0)"


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
