"""Math word-problem task ("math"): GSM8K / MATH-style data graded with math-verify.

Data comes from a local ``.jsonl`` / ``.json`` (a list of objects) / ``.parquet``
file, a local dataset folder, or a Hugging Face dataset id (the last two through
the optional ``datasets`` package, imported only when needed). Each row is mapped
to a :class:`~teamrl.tasks.base.Problem`: the question from "question", "problem"
or "prompt"; the gold answer from "answer" (GSM8K's "... #### 42" becomes "42"),
"final_answer" (a list gives its first item) or "solution" (the last ``\\boxed{}``).

Grading runs ``math_verify.verify(parse(gold), parse(prediction))`` under a hard
time limit. On the main thread a SIGALRM timer interrupts it; anywhere else (or
with ``grade_backend: process``) the grade runs in a long-lived helper process
that is killed and replaced when it overruns, which also stops hangs inside C
code that a signal cannot interrupt. A grade that times out or crashes scores
0.0 and logs one warning. The helper-process path needs a POSIX system.

Left out: partial credit, answer-type-specific rules (units, multiple-choice
letters beyond what math-verify does), and prompt templates.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import logging
import math
import os
import random
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from types import FrameType
from typing import Any

from teamrl.tasks.base import Problem, check_split, config_from, last_number, register_task

__all__ = [
    "GRADE_BACKENDS",
    "MathConfig",
    "MathTask",
    "gold_answer",
    "grade_answer",
    "last_boxed",
    "load_rows",
]

logger = logging.getLogger(__name__)

GRADE_BACKENDS: tuple[str, ...] = ("auto", "process")
"""Ways to bound grading time: "auto" (timer signal on the main thread, helper
process elsewhere) or "process" (always the helper process)."""

QUESTION_KEYS: tuple[str, ...] = ("question", "problem", "prompt")
"""Row fields tried, in order, for the question text."""
ANSWER_KEYS: tuple[str, ...] = ("answer", "final_answer", "solution")
"""Row fields tried, in order, for the gold answer."""

_LOCAL_SUFFIXES: tuple[str, ...] = (".jsonl", ".json", ".parquet")
_WORKER_STARTUP_TIMEOUT_S = 120.0
_ALARM_REPEAT_S = 0.05


@dataclass(kw_only=True)
class MathConfig:
    """Where the math problems come from and how answers are graded."""

    train_path: str | None = None
    """Train data: .jsonl/.json/.parquet file, dataset folder, or Hugging Face id ("openai/gsm8k")."""
    test_path: str | None = None
    """Test data, in the same forms as train_path."""
    hf_config: str | None = None
    """Config name for Hugging Face ids and dataset folders (e.g. "main" for openai/gsm8k)."""
    train_split: str = "train"
    """Split read from a Hugging Face id or dataset folder for the train problems."""
    test_split: str = "test"
    """Split read from a Hugging Face id or dataset folder for the test problems."""
    question_key: str | None = None
    """Row field with the question ("a.b" = nested); None = first of question, problem, prompt."""
    answer_key: str | None = None
    """Row field with the answer ("a.b" = nested); None = first of answer, final_answer, solution."""
    skip_bad_rows: bool = False
    """Skip rows lacking a usable question or answer (one warning with the count); else fail."""
    limit_train: int = 0
    """Use at most this many train problems after shuffling; 0 = all."""
    limit_test: int = 0
    """Use the first this many test problems; 0 = all."""
    seed: int = 0
    """Seed for the order of the train problems (the test order is the file order)."""
    grade_timeout_s: float = 5.0
    """Seconds one grade may take before it scores 0.0."""
    grade_backend: str = "auto"
    """How the grading time limit is enforced: "auto" or "process" (see GRADE_BACKENDS)."""


# --------------------------------------------------------------------------- answers


_BOXED_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def _braced(text: str, start: int) -> str | None:
    """Content of the brace group opening at ``text[start] == "{"``, or None if unclosed."""
    depth = 0
    i = start
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``.

    Braces are matched with nesting, escaped braces (``\\{``) do not count, and
    the brace-less form ``\\boxed 5`` is read up to the next space or ``$``.

    Args:
        text: A model reply or a worked solution.

    Returns:
        The stripped content, or None when there is no complete box.

    >>> last_boxed(r"so \\boxed{1} or rather \\boxed{\\frac{1}{2}}.")
    '\\\\frac{1}{2}'
    >>> last_boxed("no box") is None
    True
    """
    for match in reversed(list(_BOXED_RE.finditer(text))):
        rest = match.end()
        while rest < len(text) and text[rest].isspace():
            rest += 1
        if rest < len(text) and text[rest] == "{":
            content = _braced(text, rest)
            if content is not None:
                return content.strip()
        elif rest > match.end():
            token = re.match(r"[^\s$]+", text[rest:])
            if token:
                return token.group(0).strip()
    return None


def _scalar_text(value: Any) -> str | None:
    """Text of a scalar answer value; integral floats lose their ".0"."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, str):
        return value.strip()
    return None


def gold_answer(key: str, value: Any) -> str:
    """Gold answer text from a row field, following the field's usual layout.

    "solution" fields give their last ``\\boxed{}`` content; any other field gives
    its value, where a list gives its first item, text after the last "####" is
    taken (GSM8K, with thousands commas dropped) and 27.0 becomes "27".

    Args:
        key: The field name the value came from.
        value: The field's value.

    Returns:
        The gold answer text.

    Raises:
        ValueError: when no answer text can be had (None, empty, no box, wrong type).

    >>> gold_answer("answer", "Janet sells 9 eggs.\\n#### 1,080")
    '1080'
    >>> gold_answer("final_answer", ["$2n$"])
    '$2n$'
    """
    leaf = key.rsplit(".", 1)[-1]
    if leaf == "solution":
        items = value if isinstance(value, list) else [value]
        for item in reversed(items):
            if isinstance(item, str):
                boxed = last_boxed(item)
                if boxed:
                    return boxed
        raise ValueError(f"{key!r} has no \\boxed{{...}} answer")
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{key!r} is an empty list")
        value = value[0]
    text = _scalar_text(value)
    if text is None:
        kind = type(value).__name__
        raise ValueError(f"{key!r} is {kind} {_short(value)}, expected text or a number")
    if "####" in text:
        text = re.sub(r"(?<=\d),(?=\d)", "", text.rsplit("####", 1)[1]).strip()
    if not text:
        raise ValueError(f"{key!r} is empty")
    return text


def _question_text(key: str, value: Any) -> str:
    """Question text from a field: a string, or the last user message of a chat list."""
    if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        users = [m for m in value if m.get("role", "user") == "user"] or value
        value = users[-1].get("content")
    if not isinstance(value, str):
        raise ValueError(f"{key!r} is {type(value).__name__} {_short(value)}, expected text")  # noqa: TRY004 (bad data)
    if not value.strip():
        raise ValueError(f"{key!r} is empty")
    return value.strip()


def _lookup(row: dict[str, Any], key: str) -> tuple[bool, Any]:
    """(found, value) for ``key`` in ``row``; dotted keys reach into nested objects."""
    if key in row:
        return True, row[key]
    node: Any = row
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _pick(
    row: dict[str, Any],
    override: str | None,
    candidates: tuple[str, ...],
    convert: Callable[[str, Any], str],
    what: str,
) -> tuple[str, str]:
    """(key used, converted text) for the question or the answer of a row."""
    keys = (override,) if override else candidates
    present = [k for k in keys if _lookup(row, k)[0]]
    if not present:
        looked = repr(override) if override else ", ".join(candidates)
        raise ValueError(f"no {what} field (looked for {looked})")
    first_error: ValueError | None = None
    for key in present:
        try:
            return key, convert(key, _lookup(row, key)[1])
        except ValueError as exc:
            first_error = first_error or exc
    raise ValueError(f"unusable {what}: {first_error}")


def _short(value: Any, limit: int = 60) -> str:
    """Short repr for messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------- loading


class _BadLine:
    """Placeholder for a line that is not valid JSON."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _looks_like_path(source: str) -> bool:
    """Whether a missing ``source`` is meant as a local path rather than a dataset id."""
    return (
        source.lower().endswith(_LOCAL_SUFFIXES)
        or source.startswith(("/", "./", "../", "~", "\\"))
        or source.count("/") > 1
        or (os.sep != "/" and os.sep in source)
    )


def _read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, object or _BadLine) for each non-blank line of a JSONL file."""
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                yield number, _BadLine(f"invalid JSON ({exc.msg} at column {exc.colno})")


def _read_json(path: Path) -> Iterator[tuple[int, Any]]:
    """(1-based row number, object) for a JSON file holding a list of objects."""
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":  # a JSONL file with a .json name
            yield from _read_jsonl(path)
            return
        raise ValueError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}); fix the file") from exc
    if not isinstance(data, list):
        if isinstance(data, dict):
            shape = f"an object with keys {sorted(data)[:10]}"
        else:
            shape = type(data).__name__
        raise ValueError(  # noqa: TRY004 (bad data)
            f"{path} holds {shape}, expected a list of objects; store the rows as a JSON list or as JSONL"
        )
    yield from enumerate(data, start=1)


def _read_parquet(path: Path) -> Iterator[tuple[int, Any]]:
    """(1-based row number, object) for each row of a Parquet file."""
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ImportError(
            f"reading {path} needs the optional pyarrow package: pip install pyarrow (or convert the file to .jsonl)"
        ) from exc
    yield from enumerate(pq.read_table(path).to_pylist(), start=1)


def _read_datasets(source: str, split: str, hf_config: str | None) -> Iterator[tuple[int, Any]]:
    """(1-based row number, object) for a dataset folder or Hugging Face dataset id."""
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(
            f"loading {source!r} needs the optional datasets package: pip install datasets "
            "(or point the path at a local .jsonl/.json/.parquet file)"
        ) from exc
    folder = Path(source).expanduser()
    saved = ("dataset_dict.json", "state.json")  # written by save_to_disk
    if folder.is_dir() and any((folder / name).exists() for name in saved):
        loaded = datasets.load_from_disk(str(folder))
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise ValueError(
                    f"{source} has splits {sorted(loaded)}, not {split!r}; set train_split/test_split to one of them"
                )
            loaded = loaded[split]
    else:
        target = str(folder) if folder.is_dir() else source
        loaded = datasets.load_dataset(target, hf_config, split=split)
    yield from enumerate(loaded, start=1)


def load_rows(source: str, *, split: str = "train", hf_config: str | None = None) -> Iterator[tuple[int, Any]]:
    """Raw rows of a data source, each with its 1-based row number (line number for JSONL).

    Args:
        source: A .jsonl/.json/.parquet file, a local dataset folder, or a Hugging Face dataset id.
        split: Split to read from a dataset folder or id (ignored for single files).
        hf_config: Dataset config name for folders and ids.

    Returns:
        An iterator of (row number, row); a JSONL line that is not valid JSON comes as a
        placeholder that the task reports as a bad row.

    Raises:
        FileNotFoundError: when ``source`` looks like a local path and does not exist.
        ValueError: for an unsupported file type or a JSON file that is not a list.
    """
    path = Path(source).expanduser()
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            return _read_jsonl(path)
        if suffix == ".json":
            return _read_json(path)
        if suffix == ".parquet":
            return _read_parquet(path)
        raise ValueError(
            f"unsupported data file {path} (suffix {suffix!r}); use one of "
            f"{', '.join(_LOCAL_SUFFIXES)}, a dataset folder, or a Hugging Face dataset id"
        )
    if not path.is_dir() and _looks_like_path(source):
        raise FileNotFoundError(f"data file not found: {source} (resolved to {path.resolve()}); check the path")
    return _read_datasets(source, split, hf_config)


# --------------------------------------------------------------------------- grading


class _Deadline(BaseException):
    """Raised by the timer signal handler; a BaseException so library code does not swallow it."""


class _WorkerError(Exception):
    """The grading helper process failed, died or answered garbage."""


_MV_FILTER_INSTALLED = False


class _DropNoTimeoutNotice(logging.Filter):
    """Hide math-verify's notice that its own timeouts are off (the time limit is enforced here)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


def _math_verify() -> Any:
    """Import math_verify (once), with a clear error if it is missing."""
    global _MV_FILTER_INSTALLED
    try:
        import math_verify
    except ImportError as exc:
        raise ImportError("grading the math task needs math-verify: pip install math-verify") from exc
    if not _MV_FILTER_INSTALLED:
        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).addFilter(_DropNoTimeoutNotice())
        _MV_FILTER_INSTALLED = True
    return math_verify


def _verify_latex(math_verify: Any, gold_latex: str, pred_latex: str) -> bool:
    """math-verify equivalence with its own (signal-based) timeouts turned off."""
    gold = math_verify.parse(gold_latex, parsing_timeout=None)
    pred = math_verify.parse(pred_latex, parsing_timeout=None)
    return bool(math_verify.verify(gold, pred, timeout_seconds=None))


def _as_latex(answer: str) -> str:
    """Answer text as math-verify reads it best: ``\\boxed{...}`` without ``$`` delimiters."""
    text = answer.strip()
    if "\\boxed" in text:
        return text
    text = re.sub(r"(?<!\\)\$", "", text).strip()
    return "\\boxed{" + text + "}"


_PLAIN_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")


def _quick_grade(gold: str, pred: str) -> float | None:
    """1.0/0.0 when plain text settles the grade (same text, or two plain numbers), else None."""
    g, p = gold.strip(), pred.strip()
    if g and g == p:
        return 1.0
    if _PLAIN_NUMBER_RE.fullmatch(g) and _PLAIN_NUMBER_RE.fullmatch(p):
        if Decimal(g) == Decimal(p):
            return 1.0
        if "." not in g and "." not in p:  # two different integers
            return 0.0
    return None


def _warn(reason: str, gold: str, pred: str) -> None:
    """The one warning logged for a grade that could not finish."""
    logger.warning("math grade %s; scored 0.0 (gold=%s, prediction=%s)", reason, _short(gold), _short(pred))


def _alarm_usable() -> bool:
    """Whether a SIGALRM timer can bound the grade here (main thread, POSIX, timer free)."""
    return (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getitimer(signal.ITIMER_REAL)[0] == 0.0
    )


def _grade_with_alarm(gold: str, pred: str, timeout_s: float) -> float | None:
    """Grade in this process under a repeating SIGALRM timer; None if no timer could be set."""
    mv = _math_verify()
    state = {"fired": False}
    own_code = _grade_with_alarm.__code__

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        state["fired"] = True
        # Never raise inside this function's own frame: that is the clean-up path.
        if frame is not None and frame.f_code is own_code:
            return
        raise _Deadline

    try:
        previous = signal.signal(signal.SIGALRM, on_alarm)
    except ValueError:
        return None
    ok = False
    error: Exception | None = None
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout_s, _ALARM_REPEAT_S)
        try:
            ok = _verify_latex(mv, _as_latex(gold), _as_latex(pred))
        except _Deadline:
            state["fired"] = True
        except Exception as exc:  # noqa: BLE001 (a crashing grade scores 0.0)
            error = exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    if state["fired"]:
        _warn(f"timed out after {timeout_s:g}s", gold, pred)
        return 0.0
    if error is not None:
        _warn(f"failed ({type(error).__name__}: {error})", gold, pred)
        return 0.0
    return 1.0 if ok else 0.0


_WORKER_SOURCE = r"""
import json, logging, os, sys, threading, time
logging.disable(logging.CRITICAL)
from math_verify import parse, verify

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
    except Exception as exc:
        reply = {"error": type(exc).__name__ + ": " + str(exc)[:200]}
    out.write(json.dumps(reply) + "\n")
    out.flush()
"""


class _Worker:
    """One helper process that grades (gold, prediction) pairs sent as JSON lines."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONIOENCODING="utf-8", PYTHONUNBUFFERED="1")
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_SOURCE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,  # a Ctrl-C in the terminal is the parent's to handle
        )
        self._buffer = b""
        try:
            line = self._readline(_WORKER_STARTUP_TIMEOUT_S)
        except _WorkerError:
            self.close()
            raise
        if line != b"ready":
            self.close()
            raise _WorkerError(f"grading helper did not start (got {line!r})")

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
                raise _WorkerError("grading helper closed its output (it exited)")
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
            raise _WorkerError(f"grading helper is gone ({exc})") from exc
        line = self._readline(timeout_s)
        if line is None:
            return None
        try:
            reply = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _WorkerError(f"grading helper sent {line[:80]!r}") from exc
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


class _WorkerPool:
    """Idle helper processes shared by all threads; a busy thread gets its own."""

    def __init__(self) -> None:
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._checked = False
        atexit.register(self.close)

    def grade(self, gold: str, pred: str, timeout_s: float) -> float:
        """Grade in a helper process, killing it when it overruns ``timeout_s``."""
        if not self._checked:
            if importlib.util.find_spec("math_verify") is None:
                _math_verify()  # raises the install hint
            self._checked = True
        worker = self._acquire()
        if worker is None:
            try:
                worker = _Worker()
            except (_WorkerError, OSError) as exc:
                _warn(f"failed (could not start the grading helper: {exc})", gold, pred)
                return 0.0
        try:
            ok = worker.grade(_as_latex(gold), _as_latex(pred), timeout_s)
        except _WorkerError as exc:
            worker.close()
            _warn(f"failed ({exc})", gold, pred)
            return 0.0
        except ValueError as exc:
            self._release(worker)
            _warn(f"failed ({exc})", gold, pred)
            return 0.0
        if ok is None:
            worker.close()
            _warn(f"timed out after {timeout_s:g}s", gold, pred)
            return 0.0
        self._release(worker)
        return 1.0 if ok else 0.0

    def _acquire(self) -> _Worker | None:
        """A live idle helper, or None when a new one is needed."""
        while True:
            with self._lock:
                worker = self._idle.pop() if self._idle else None
            if worker is None or worker.alive():
                return worker
            worker.close()

    def _release(self, worker: _Worker) -> None:
        with self._lock:
            self._idle.append(worker)

    def close(self) -> None:
        """Stop all idle helper processes."""
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.close()


_POOL: _WorkerPool | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> _WorkerPool:
    """The process-wide helper pool, created on first use."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = _WorkerPool()
        return _POOL


def grade_answer(gold: str, pred: str, *, timeout_s: float = 5.0, backend: str = "auto") -> float:
    """1.0 if math-verify finds ``pred`` equivalent to ``gold``, else 0.0, within ``timeout_s``.

    Both sides are parsed as ``\\boxed{...}`` (``$`` delimiters dropped). Identical
    text and plain numbers are settled without math-verify. A grade that runs past
    ``timeout_s`` or raises scores 0.0 and logs one warning.

    Args:
        gold: Gold answer text, e.g. "\\frac{1}{2}".
        pred: Predicted answer text, e.g. "0.5".
        timeout_s: Most seconds one grade may take.
        backend: "auto" (SIGALRM on the main thread, a helper process elsewhere) or
            "process" (always a helper process).

    Returns:
        1.0 or 0.0.

    >>> grade_answer("42", "42.0")
    1.0
    >>> grade_answer("\\\\frac{1}{2}", "0.5")
    1.0
    """
    if backend not in GRADE_BACKENDS:
        raise ValueError(f"unknown grade backend {backend!r}; use one of {', '.join(GRADE_BACKENDS)}")
    if not timeout_s > 0:
        raise ValueError(f"grade timeout must be > 0 seconds, got {timeout_s!r}")
    quick = _quick_grade(gold, pred)
    if quick is not None:
        return quick
    if backend == "auto" and _alarm_usable():
        result = _grade_with_alarm(gold, pred, timeout_s)
        if result is not None:
            return result
    return _pool().grade(gold, pred, timeout_s)


# --------------------------------------------------------------------------- task


def _validate(cfg: MathConfig) -> None:
    """Raise ValueError for an inconsistent config."""
    for name in ("limit_train", "limit_test"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"math {name}={getattr(cfg, name)} must be >= 0 (0 = all)")
    if not cfg.grade_timeout_s > 0:
        raise ValueError(f"math grade_timeout_s={cfg.grade_timeout_s} must be > 0 seconds")
    if cfg.grade_backend not in GRADE_BACKENDS:
        raise ValueError(f"math grade_backend={cfg.grade_backend!r} is unknown; use one of {', '.join(GRADE_BACKENDS)}")
    if cfg.train_path is None and cfg.test_path is None:
        raise ValueError(
            "math task needs data: set train_path and/or test_path "
            "(a file, a dataset folder or a Hugging Face dataset id)"
        )


@register_task("math")
class MathTask:
    """Math problems from files or datasets, graded by math-verify.

    >>> task = MathTask(MathConfig(test_path="data/gsm8k/test.jsonl"))
    >>> task.extract_answer("so the total is \\\\boxed{18}.")
    '18'
    """

    name: str = "math"
    answer_format: str = "Put the final answer in \\boxed{}."

    def __init__(self, cfg: MathConfig | dict[str, Any] | None = None) -> None:
        """Check the config; data is read on the first ``problems()`` call of each split.

        Args:
            cfg: A MathConfig or a mapping of its fields; a data path is required.
        """
        self.cfg: MathConfig = config_from(MathConfig, cfg)
        _validate(self.cfg)
        self._cache: dict[str, list[Problem]] = {}

    def problems(self, split: str) -> list[Problem]:
        """Problems of a split: train shuffled by ``seed``, test in file order; then limited.

        Args:
            split: "train" or "test".

        Returns:
            A new list of Problems (the same ones on every call).
        """
        check_split(split)
        if split not in self._cache:
            self._cache[split] = self._load(split)
        return list(self._cache[split])

    def _load(self, split: str) -> list[Problem]:
        """Read, map and order the problems of a split."""
        cfg = self.cfg
        source = cfg.train_path if split == "train" else cfg.test_path
        if source is None:
            raise ValueError(
                f"math task has no {split}_path; set {split}_path to a data file, "
                "a dataset folder or a Hugging Face dataset id"
            )
        source_split = cfg.train_split if split == "train" else cfg.test_split
        rows = load_rows(str(source), split=source_split, hf_config=cfg.hf_config)
        problems = self._map_rows(str(source), split, rows)
        if split == "train":
            random.Random(cfg.seed).shuffle(problems)
        limit = cfg.limit_train if split == "train" else cfg.limit_test
        return problems[:limit] if limit else problems

    def _map_rows(self, source: str, split: str, rows: Iterable[tuple[int, Any]]) -> list[Problem]:
        """Problems from raw rows, failing on (or skipping) bad rows."""
        problems: list[Problem] = []
        skipped: list[str] = []
        for index, (number, row) in enumerate(rows):
            try:
                problems.append(self._problem(source, split, index, number, row))
            except ValueError as exc:
                keys = sorted(row) if isinstance(row, dict) else []
                where = "line" if source.lower().endswith(".jsonl") else "row"
                message = f"{source} {where} {number}: {exc}; keys present: {keys}"
                if not self.cfg.skip_bad_rows:
                    raise ValueError(
                        f"{message}. Fix the row, set question_key/answer_key to the right fields, "
                        "or set skip_bad_rows: true to skip such rows"
                    ) from None
                skipped.append(message)
        if skipped:
            logger.warning("skipped %d bad row(s) of %s; first: %s", len(skipped), source, skipped[0])
        if not problems:
            raise ValueError(f"{source} gave no usable {split} problems; check the file and the field names")
        return problems

    def _problem(self, source: str, split: str, index: int, number: int, row: Any) -> Problem:
        """One Problem from one raw row (ValueError when the row is unusable)."""
        if isinstance(row, _BadLine):
            raise ValueError(row.reason)  # noqa: TRY004 (bad data)
        if not isinstance(row, dict):
            raise ValueError(f"row is {type(row).__name__} {_short(row)}, expected an object")  # noqa: TRY004
        cfg = self.cfg
        q_key, question = _pick(row, cfg.question_key, QUESTION_KEYS, _question_text, "question")
        _, answer = _pick(row, cfg.answer_key, ANSWER_KEYS, gold_answer, "answer")
        fields = {k: v for k, v in row.items() if k != q_key}
        return Problem(
            id=f"{split}-{index}",
            question=question,
            answer=answer,
            meta={"source": source, "row": number, "fields": fields},
        )

    def extract_answer(self, response: str) -> str | None:
        """The last ``\\boxed{}`` content of ``response``, else its last number, else None.

        Args:
            response: A model reply.

        Returns:
            The answer text, e.g. "\\frac{1}{2}" or "1234"; a full stop right after
            a number at the end of the box is dropped.
        """
        boxed = last_boxed(response)
        if boxed is not None:
            boxed = re.sub(r"(?<=\d)\.$", "", boxed)  # "\boxed{104.}" -> "104"
            return boxed or None
        return last_number(response)

    def score(self, problem: Problem, response: str) -> float:
        """1.0 if the extracted answer is equivalent to the gold answer (math-verify), else 0.0.

        Args:
            problem: The problem answered.
            response: The final reply.

        Returns:
            1.0 or 0.0; a grade past ``grade_timeout_s`` scores 0.0.
        """
        pred = self.extract_answer(response)
        if pred is None:
            return 0.0
        return grade_answer(problem.answer, pred, timeout_s=self.cfg.grade_timeout_s, backend=self.cfg.grade_backend)
