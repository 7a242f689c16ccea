"""The helper processes of :func:`teamrl.tasks.grading.grade_answer`: math-verify in a long-lived child process
per concurrent grade, killed and replaced when a grade overruns its time limit, so hangs inside C code
that a signal cannot interrupt stop too (POSIX). Each helper's address space is capped at
:data:`WORKER_MEMORY_BYTES`, so an answer whose parse or simplification grows without bound ends in a
MemoryError in the helper (a grade of 0.0), not in the trainer's memory."""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time

__all__ = ["WORKER_MEMORY_BYTES", "Worker", "WorkerError", "WorkerPool", "pool"]

_WORKER_STARTUP_TIMEOUT_S = 120.0

WORKER_MEMORY_BYTES = 2 * 1024**3
"""Address-space limit (RLIMIT_AS) of one grading helper: 2 GiB, several times what math-verify and
sympy take (about 300 MB)."""


class WorkerError(Exception):
    """The helper process could not start, died, or answered garbage."""


WORKER_SOURCE = r"""
import json, logging, os, resource, sys, threading, time
logging.disable(logging.CRITICAL)
from math_verify import parse, verify
_, hard = resource.getrlimit(resource.RLIMIT_AS)
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit if hard < 0 else min(limit, hard), hard))

def exit_when_orphaned(parent=os.getppid()):
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)

threading.Thread(target=exit_when_orphaned, daemon=True).start()
out = sys.stdout
out.write("ready\n")
out.flush()
for line in sys.stdin:
    try:
        gold, pred = json.loads(line)
        gold, pred = parse(gold, parsing_timeout=None), parse(pred, parsing_timeout=None)
        ok = verify(gold, pred, timeout_seconds=None)
        reply = {"ok": bool(ok)}
    except BaseException as exc:  # MemoryError, RecursionError, ...: this grade fails, the helper lives on
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        reply = {"error": type(exc).__name__ + ": " + str(exc)[:200]}
    out.write(json.dumps(reply) + "\n")
    out.flush()
"""


class Worker:
    """One helper process that grades (gold, prediction) pairs sent as JSON lines."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONIOENCODING="utf-8", PYTHONUNBUFFERED="1")
        self._proc = subprocess.Popen(
            [sys.executable, "-c", WORKER_SOURCE, str(WORKER_MEMORY_BYTES)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,  # a Ctrl-C in the terminal is the parent's to handle
        )
        self._buffer = b""
        try:
            line = self._readline(_WORKER_STARTUP_TIMEOUT_S)
        except WorkerError:
            self.close()
            raise
        if line != b"ready":
            self.close()
            raise WorkerError(f"grading helper did not start (got {line!r})")

    def _readline(self, timeout_s: float) -> bytes | None:
        """Next output line, or None when none arrives within ``timeout_s``."""
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise WorkerError("grading helper closed its output (it exited)")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.strip()

    def grade(self, gold_latex: str, pred_latex: str, timeout_s: float) -> bool | None:
        """True/False from math-verify, or None on timeout."""
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write((json.dumps([gold_latex, pred_latex]) + "\n").encode("utf-8"))
            self._proc.stdin.flush()
        except OSError as exc:
            raise WorkerError(f"grading helper is gone ({exc})") from exc
        line = self._readline(timeout_s)
        if line is None:
            return None
        try:
            reply = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkerError(f"grading helper sent {line[:80]!r}") from exc
        if "error" in reply:
            raise ValueError(reply["error"])
        return bool(reply["ok"])

    def alive(self) -> bool:
        """Whether the helper process is still running."""
        return self._proc.poll() is None

    def close(self) -> None:
        """Kill the helper process and reap it."""
        if self._proc.poll() is None:
            self._proc.kill()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


class WorkerPool:
    """Idle helper processes shared by all threads; a busy thread gets its own."""

    def __init__(self) -> None:
        self._idle: list[Worker] = []
        self._lock = threading.Lock()
        self._checked = False
        atexit.register(self.close)

    def grade(self, gold_latex: str, pred_latex: str, timeout_s: float) -> bool | None:
        """True/False from math-verify in a helper process; None when it overran ``timeout_s`` (that helper is
        killed). Raises :class:`WorkerError` when no helper could start or the helper died (it is dropped), and
        ``ValueError`` when math-verify raised (the helper is kept)."""
        worker = self._acquire()
        if worker is None:
            try:
                worker = Worker()
            except (WorkerError, OSError) as exc:
                raise WorkerError(f"could not start the grading helper: {exc}") from exc
        try:
            ok = worker.grade(gold_latex, pred_latex, timeout_s)
        except WorkerError:
            worker.close()
            raise
        except ValueError:
            self._release(worker)
            raise
        if ok is None:
            worker.close()
            return None
        self._release(worker)
        return ok

    def _acquire(self) -> Worker | None:
        """A live idle helper, or None when a new one is needed."""
        while True:
            with self._lock:
                worker = self._idle.pop() if self._idle else None
            if worker is None or worker.alive():
                return worker
            worker.close()

    def _release(self, worker: Worker) -> None:
        with self._lock:
            self._idle.append(worker)

    def close(self) -> None:
        """Stop all idle helper processes."""
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.close()


_POOL: WorkerPool | None = None
_POOL_LOCK = threading.Lock()


def pool() -> WorkerPool:
    """The process-wide helper pool, created on first use."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = WorkerPool()
        return _POOL
