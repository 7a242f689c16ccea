"""Time-bounded grading of math answers with math-verify.

:func:`grade_answer` scores 1.0 when ``math_verify.verify(parse(gold), parse(prediction))``
finds the two answers equivalent and 0.0 otherwise. Both sides are read as
``\\boxed{...}`` (``$`` delimiters dropped) with e-notation numbers (``4.5e33``, which
math-verify reads as ``4.5*E*33``) rewritten as ``4.5\\times 10^{33}``. Identical
text is settled without math-verify, and so are two answers that are each one number
(plain, e-notation or LaTeX scientific notation such as ``4.5 \\times 10^{33}``): they
compare as numbers, exactly when either is written as an integer and otherwise within
a relative tolerance of :data:`NUMBER_REL_TOL`.

Every grade runs under a hard time limit. On the main thread a repeating SIGALRM
timer interrupts it; anywhere else (or with ``backend="process"``) the grade runs
in a long-lived helper process from a shared pool (:mod:`teamrl.tasks.grading_worker`),
which is killed and replaced when it overruns, so hangs inside C code that a signal
cannot interrupt stop too.
A grade that times out or crashes scores 0.0 and logs one warning. The
helper-process path needs a POSIX system; the helper's address space is capped at
:data:`teamrl.tasks.grading_worker.WORKER_MEMORY_BYTES`.

Nothing an answer says can end a run: an answer longer than :data:`MAX_ANSWER_CHARS`
is refused before any regular expression reads it, a number whose exponent is beyond
±:data:`MAX_EXPONENT` is refused before it becomes a ``Decimal``, and any other
exception scores 0.0. Each such grade logs one warning and is counted by
:func:`teamrl.tasks.base.grading_errors` (``rollout/grading_errors`` in the metrics).

Left out: reading answers out of replies or data rows (see :mod:`teamrl.domains.math.math`),
partial credit, and answer-type-specific rules (units, multiple-choice letters
beyond what math-verify does).
"""

from __future__ import annotations

import importlib.util
import logging
import re
import signal
import threading
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal, localcontext
from types import FrameType
from typing import Any

from teamrl.tasks.base import count_grading_error
from teamrl.tasks.grading_worker import WorkerError, pool

__all__ = ["GRADE_BACKENDS", "MAX_ANSWER_CHARS", "MAX_EXPONENT", "NUMBER_REL_TOL", "grade_answer", "parse_number"]

# Logged under the math task's name so that logging settings for the task cover grading too.
logger = logging.getLogger("teamrl.domains.math.math")

GRADE_BACKENDS: tuple[str, ...] = ("auto", "process")
"""Ways to bound grading time: "auto" (timer signal on the main thread, helper
process elsewhere) or "process" (always the helper process)."""

_ALARM_REPEAT_S = 0.05

MAX_ANSWER_CHARS = 1000
"""Longest answer text (gold or prediction, after stripping) that is graded; a longer one scores 0.0
with a warning before any regular expression reads it. Math answers are far shorter (the longest
gold answer of the MATH test set is under 200 characters)."""

MAX_EXPONENT = 10**15
"""Largest ``|k|`` of a number ``m e k`` / ``m \\times 10^{k}`` that :func:`parse_number` reads
(``decimal`` itself stops near 10**18); a larger one raises ValueError, so the grade scores 0.0."""


def _short(value: Any, limit: int = 60) -> str:
    """Short repr for messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Deadline(BaseException):
    """Raised by the timer signal handler; a BaseException so library code does not swallow it."""


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


_E_NOTATION_RE = re.compile(r"(?<![\w.\\])(\d+(?:\.\d*)?|\.\d+)[eE]([-+]?\d+)(?![\w.])")
"""A number in e-notation ("4.5e33", "1E-5") not inside a word or a longer number."""


def _as_latex(answer: str) -> str:
    """Answer text as math-verify reads it best: ``\\boxed{...}`` without ``$`` delimiters,
    e-notation numbers written as ``m\\times 10^{k}``.

    >>> _as_latex("$(4.5e33, 1E-5)$")
    '\\\\boxed{(4.5\\\\times 10^{33}, 1\\\\times 10^{-5})}'
    """
    text = _E_NOTATION_RE.sub(lambda m: f"{m[1]}\\times 10^{{{int(m[2])}}}", answer.strip())
    if "\\boxed" in text:
        return text
    text = re.sub(r"(?<!\\)\$", "", text).strip()
    return "\\boxed{" + text + "}"


NUMBER_REL_TOL = 1e-4
"""Relative tolerance for two answers that are each one number, unless either is written
as an integer (then they must be equal): ``|a - b| <= NUMBER_REL_TOL * max(|a|, |b|)``.
It is the ``rel_tol`` of the Qwen2.5-Math evaluation grader that the simpleRL-reason
benchmark files are scored with (``math_equal``): it absorbs rounding in the last of
five significant digits (gold ``2.7778e-6``, answer ``2.778 \\times 10^{-6}``) and
float round-off, while a change in any of the first four digits (``4.5e33`` vs
``4.6e33``) or a factor of ten (``45`` vs ``4.5``) fails. math-verify's own float
comparison rounds to 6 decimal places instead, which passes ``1.2e-8`` for ``1.3e-8``."""

_MANTISSA = r"(?:\d+(?:\.\d*)?|\.\d+)"
_NUMBER_RE = re.compile(
    rf"(?P<sign>-?)\s*(?:"
    rf"(?P<plain>{_MANTISSA})(?:[eE](?P<e>[-+]?\d+))?"  # 42, 0.5, 4.5e33
    rf"|(?:(?P<m>{_MANTISSA})\s*(?:\\times|\\cdot|\u00d7|\u22c5)\s*)?"  # 4.5 \times, 4.5\cdot
    rf"10\s*\^\s*(?:\{{\s*(?P<k>[-+]?\s*\d+)\s*\}}|(?P<k1>\d))"  # 10^{33}, 10^5
    rf")"
)


def parse_number(text: str) -> tuple[Decimal, bool] | None:
    """The number an answer is, when it is exactly one real number literal.

    Read forms: plain (``-42``, ``0.5``), e-notation (``4.5e33``, ``4.5E+33``) and LaTeX
    scientific notation (``4.5 \\times 10^{33}``, ``4.5\\cdot10^{-3}``, ``10^{5}``), with
    or without ``$`` delimiters.

    Args:
        text: An answer, e.g. "4.5e33".

    Returns:
        (value, written as an integer), or None when the text is anything else.

    Raises:
        ValueError: the exponent is beyond ±MAX_EXPONENT (e.g. ``1e99999999999999999999``).

    >>> parse_number("$4.5 \\\\times 10^{33}$")
    (Decimal('4.5E+33'), False)
    >>> parse_number("-12")
    (Decimal('-12'), True)
    >>> parse_number("x + 1") is None
    True
    """
    body = re.sub(r"(?<!\\)\$", "", text).strip()
    match = _NUMBER_RE.fullmatch(body)
    if match is None:
        return None
    if match["plain"] is not None:
        mantissa, exponent = match["plain"], match["e"] or "0"
    else:
        mantissa, exponent = match["m"] or "1", re.sub(r"\s", "", match["k"] or match["k1"])
    integer = match["plain"] is not None and match["e"] is None and "." not in mantissa
    digits = exponent.lstrip("+-").lstrip("0")
    if len(digits) > len(str(MAX_EXPONENT)) or int(digits or "0") > MAX_EXPONENT:
        raise ValueError(f"exponent {_short(exponent, 30)} is beyond ±{MAX_EXPONENT:.0e}")
    return Decimal(f"{match['sign']}{mantissa}e{exponent}"), integer


def _numbers_match(gold: tuple[Decimal, bool], pred: tuple[Decimal, bool]) -> bool:
    """Whether two parsed numbers match: exactly if either is an integer, else within NUMBER_REL_TOL."""
    (a, a_int), (b, b_int) = gold, pred
    with localcontext(Context(prec=50, Emax=MAX_EMAX, Emin=MIN_EMIN, traps=[])):  # no overflow errors
        if a == b:
            return True
        if a_int or b_int:
            return False
        return abs(a - b) <= Decimal(str(NUMBER_REL_TOL)) * max(abs(a), abs(b))


def _quick_grade(gold: str, pred: str) -> float | None:
    """1.0/0.0 when plain text settles the grade (same text, or two numbers), else None."""
    g, p = gold.strip(), pred.strip()
    if g and g == p:
        return 1.0
    g_number, p_number = parse_number(g), parse_number(p)
    if g_number is None or p_number is None:
        return None
    return 1.0 if _numbers_match(g_number, p_number) else 0.0


def _warn(reason: str, gold: str, pred: str) -> None:
    """The one warning logged (and counted) for a grade that could not finish."""
    count_grading_error()
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


def _grade_in_helper(gold: str, pred: str, timeout_s: float) -> float:
    """Grade in a helper process (:mod:`teamrl.tasks.grading_worker`); 0.0 and one warning on a timeout or failure."""
    global _HELPER_CHECKED
    if not _HELPER_CHECKED:
        if importlib.util.find_spec("math_verify") is None:
            _math_verify()  # raises the install hint
        _HELPER_CHECKED = True
    try:
        ok = pool().grade(_as_latex(gold), _as_latex(pred), timeout_s)
    except (WorkerError, ValueError) as exc:
        _warn(f"failed ({exc})", gold, pred)
        return 0.0
    if ok is None:
        _warn(f"timed out after {timeout_s:g}s", gold, pred)
        return 0.0
    return 1.0 if ok else 0.0


_HELPER_CHECKED = False


def grade_answer(gold: str, pred: str, *, timeout_s: float = 5.0, backend: str = "auto") -> float:
    """1.0 if math-verify finds ``pred`` equivalent to ``gold``, else 0.0, within ``timeout_s``.

    Both sides are parsed as ``\\boxed{...}`` (``$`` delimiters dropped, e-notation
    rewritten as ``\\times 10^{k}``). Identical text and two single numbers are settled
    without math-verify; numbers compare as numbers (see :data:`NUMBER_REL_TOL`). A grade
    that runs past ``timeout_s`` or raises, or an answer longer than :data:`MAX_ANSWER_CHARS`,
    scores 0.0 and logs one warning (counted by :func:`teamrl.tasks.base.grading_errors`).

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
    >>> grade_answer("4.5e33", "4.5 \\\\times 10^{33}"), grade_answer("4.5e33", "4.6e33")
    (1.0, 0.0)
    """
    if backend not in GRADE_BACKENDS:
        raise ValueError(f"unknown grade backend {backend!r}; use one of {', '.join(GRADE_BACKENDS)}")
    if not timeout_s > 0:
        raise ValueError(f"grade timeout must be > 0 seconds, got {timeout_s!r}")
    for side, text in (("gold answer", gold), ("prediction", pred)):
        if len(text) > MAX_ANSWER_CHARS and len(text.strip()) > MAX_ANSWER_CHARS:
            _warn(f"refused: the {side} has {len(text.strip())} characters (most: {MAX_ANSWER_CHARS})", gold, pred)
            return 0.0
    try:
        quick = _quick_grade(gold, pred)
        if quick is not None:
            return quick
        if backend == "auto" and _alarm_usable():
            result = _grade_with_alarm(gold, pred, timeout_s)
            if result is not None:
                return result
        return _grade_in_helper(gold, pred, timeout_s)
    except Exception as exc:  # noqa: BLE001 (nothing an answer says may end the run)
        _warn(f"failed ({type(exc).__name__}: {str(exc)[:120]})", gold, pred)
        return 0.0
