"""Limits, the record of one sandboxed run, and the process runner that enforces wall time and output caps.

:func:`execute` starts a command line (the sandbox's launcher, built by :mod:`teamrl.sandbox.bwrap`)
in its own session, feeds it stdin, reads stdout and stderr with a cap, stops it at the wall-time
limit or when the cap is passed (SIGTERM to its process group, which the per-run reaper turns into
killing and reaping the whole run; SIGKILL two seconds later if the launcher is still there), and
turns what happened into a :class:`Run` with one verdict. It never raises for anything the program does.

Left out: choosing the isolation mechanism and building the command (``bwrap.py``, ``sandbox.py``).
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["VERDICTS", "Limits", "Run", "execute", "trim"]

VERDICTS: tuple[str, ...] = ("ok", "error", "timeout", "memory", "output_limit", "killed")
"""ok: exit 0; error: non-zero exit; timeout: CPU or wall limit; memory: MemoryError under the
memory limit; output_limit: stdout+stderr passed ``output_bytes``; killed: ended by a signal
(segfault, abort, SIGKILL from inside)."""

_SIGXCPU = int(signal.SIGXCPU)
_MEMORY_MARKS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Resource limits of one run. All are enforced by the kernel except wall time and output bytes.

    >>> Limits().cpu_seconds
    5.0
    """

    cpu_seconds: float = 5.0
    """CPU time (RLIMIT_CPU; rounded up to whole seconds by the kernel, SIGKILL 1 s later)."""
    wall_seconds: float = 10.0
    """Wall-clock time from start to verdict; the process tree is killed when it passes."""
    memory_bytes: int = 512 * 2**20
    """Address space (RLIMIT_AS) of every process in the sandbox."""
    processes: int = 16
    """Processes and threads the program may start besides itself (RLIMIT_NPROC of the run's own host user as
    root, of the run's own user namespace otherwise)."""
    open_files: int = 64
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    output_bytes: int = 1 << 20
    """stdout + stderr bytes read before the run is killed with verdict ``output_limit``."""
    disk_bytes: int = 16 * 2**20
    """Size of the writable in-memory folder (tmpfs) the program runs in; also the largest file."""

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "wall_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Limits.{name} must be > 0 seconds, got {getattr(self, name)!r}")
        for name in ("memory_bytes", "processes", "open_files", "output_bytes", "disk_bytes"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"Limits.{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.memory_bytes < 32 * 2**20:
            raise ValueError(f"Limits.memory_bytes={self.memory_bytes} is below 32 MiB, too small to start Python; "
                             "raise it")
        if self.open_files < 8:
            raise ValueError(f"Limits.open_files={self.open_files} is too few for Python to start; use >= 8")


@dataclass(frozen=True)
class Run:
    """What one program run did.

    >>> Run("ok", 0, "hi\\n", "", 0.01).ok
    True
    """

    verdict: str
    """One of :data:`VERDICTS`."""
    exit_code: int | None
    """Exit status: the program's own, ``128 + s`` when signal ``s`` ended it; None when the runner killed it
    (wall time, output cap)."""
    stdout: str
    """Standard output (up to ``output_bytes``; decoded as UTF-8 with replacement)."""
    stderr: str
    """Standard error, same cap."""
    seconds: float
    """Wall time from start to verdict."""

    @property
    def ok(self) -> bool:
        """True when the program exited with status 0."""
        return self.verdict == "ok"


def trim(text: str, limit: int = 600) -> str:
    """``text`` cut to at most about ``limit`` characters, keeping its head and tail.

    >>> trim("abcdefghij", 6)
    'abc\\n...[4 characters cut]...\\nhij'
    """
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n...[{len(text) - 2 * half} characters cut]...\n{text[len(text) - half:]}"


def verdict_of(code: int, stderr: str, *, seconds: float, limits: Limits, timed_out: bool,
               over_output: bool) -> str:
    """The verdict of a finished run.

    Args:
        code: Exit status of the launcher (the sandbox passes the program's own status through; a
            program killed by signal ``s`` shows as ``128 + s``, or ``-s`` when the launcher itself was).
        stderr: Its standard error (a MemoryError there under a non-zero exit means ``memory``).
        seconds: Wall time of the run (a SIGKILL after at least ``limits.cpu_seconds`` is taken as the
            kernel's hard CPU limit, reached by a program that ignores SIGXCPU: ``timeout``).
        limits: The run's limits.
        timed_out: The runner killed it at the wall-time limit.
        over_output: The runner killed it for passing the output cap.

    >>> verdict_of(1, "Traceback ...\\nMemoryError\\n", seconds=0.1, limits=Limits(), timed_out=False,
    ...            over_output=False)
    'memory'
    >>> verdict_of(128 + 24, "", seconds=5.0, limits=Limits(), timed_out=False, over_output=False)
    'timeout'
    >>> verdict_of(128 + 11, "", seconds=0.1, limits=Limits(), timed_out=False, over_output=False)
    'killed'
    """
    if over_output:
        return "output_limit"
    if timed_out:
        return "timeout"
    if code == 0:
        return "ok"
    signum = -code if code < 0 else code - 128 if code > 128 else 0
    if signum == _SIGXCPU or (signum == int(signal.SIGKILL) and seconds >= limits.cpu_seconds):
        return "timeout"
    if any(mark in stderr[-2000:] for mark in _MEMORY_MARKS):
        return "memory"
    return "killed" if signum else "error"


_GRACE = 2.0  # seconds a launcher has after SIGTERM before its group gets SIGKILL


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def execute(argv: Sequence[str], *, stdin: bytes, limits: Limits, pass_fds: Sequence[int] = (),
            user: int | None = None, cwd: str | None = None) -> Run:
    """Run ``argv`` to its end or its limits and return the :class:`Run`.

    Args:
        argv: The launcher's command line.
        stdin: Bytes written to its standard input (then closed).
        limits: Wall time and output bytes are enforced here; the rest by the launcher.
        pass_fds: File descriptors the launcher inherits (memfd copies of the program's files).
        user: Host uid (and gid) the launcher runs as; None keeps the current one.
        cwd: Folder it starts in (None: this process's).

    Returns:
        The run's record; never raises for what the program does.
    """
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            pass_fds=tuple(pass_fds), start_new_session=True, env={}, cwd=cwd,
                            user=user, group=user, extra_groups=[] if user is not None else None)
    deadline = start + limits.wall_seconds
    stdout, stderr, timed_out, over_output = _pump(proc, stdin, limits, deadline)
    status = _reap(proc, deadline, kill_now=timed_out or over_output)
    seconds = time.monotonic() - start
    timed_out = timed_out or status is None
    code = 128 + int(signal.SIGKILL) if status is None else os.waitstatus_to_exitcode(status)
    err_text = stderr.decode("utf-8", "replace")
    verdict = verdict_of(code, err_text, seconds=seconds, limits=limits, timed_out=timed_out,
                         over_output=over_output)
    return Run(verdict, None if (timed_out or over_output) else code, stdout.decode("utf-8", "replace"),
               err_text, seconds)


def _reap(proc: subprocess.Popen, deadline: float, *, kill_now: bool) -> int | None:
    """Wait for the launcher, stopping it at ``deadline``; its wait status, None if the runner stopped it.

    Stopping is SIGTERM to the launcher's process group (the per-run reaper of :mod:`teamrl.sandbox.reaper`
    then kills the run and reaps all of it), and SIGKILL to that group :data:`_GRACE` seconds later if
    the launcher is still there.
    """
    stopped_at = None
    if kill_now:
        _signal_group(proc.pid, signal.SIGTERM)
        stopped_at = time.monotonic()
    while True:
        pid, raw = os.waitpid(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(raw)
            return None if stopped_at is not None else raw
        now = time.monotonic()
        if stopped_at is None and now >= deadline:
            _signal_group(proc.pid, signal.SIGTERM)
            stopped_at = now
        elif stopped_at is not None and now - stopped_at >= _GRACE:
            _signal_group(proc.pid, signal.SIGKILL)
        time.sleep(0.002)


def _pump(proc: subprocess.Popen, stdin: bytes, limits: Limits, deadline: float) -> tuple[bytes, bytes, bool, bool]:
    """Feed stdin and read both outputs until they close, the wall limit or the output cap."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    sel = selectors.DefaultSelector()
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    chunks: dict[int, list[bytes]] = {out_fd: [], err_fd: []}
    for stream in (proc.stdout, proc.stderr):
        os.set_blocking(stream.fileno(), False)
        sel.register(stream, selectors.EVENT_READ)
    pending = memoryview(stdin)
    if pending:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    total, timed_out, over = 0, False, False
    while sel.get_map() and not (timed_out or over):
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        for key, _ in sel.select(timeout=min(left, 1.0)):
            if key.fileobj is proc.stdin:
                try:
                    pending = pending[os.write(key.fd, pending[:65536]):]
                except OSError:
                    pending = pending[:0]
                if not pending:
                    sel.unregister(proc.stdin)
                    proc.stdin.close()
                continue
            data = os.read(key.fd, 65536)
            if not data:
                sel.unregister(key.fileobj)
                continue
            chunks[key.fd].append(data)
            total += len(data)
            if total > limits.output_bytes:
                over = True
                break
    sel.close()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if not stream.closed:
            stream.close()
    cap = limits.output_bytes
    return b"".join(chunks[out_fd])[:cap], b"".join(chunks[err_fd])[:cap], timed_out, over
