"""Tests for time-bounded grading with math-verify: equivalent forms, time limits on
and off the main thread, helper-process replacement and crashing grades."""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

import pytest

import teamrl.tasks.grading as grading
import teamrl.tasks.grading_worker as grading_worker
from teamrl.tasks.grading import grade_answer
from tests.conftest import HANG_S


@pytest.mark.parametrize(
    ("gold", "pred", "expected"),
    [
        ("\\frac{1}{2}", "0.5", 1.0),
        ("0.5", "\\frac{1}{2}", 1.0),
        ("42", "42.0", 1.0),
        ("$2n$", "2n", 1.0),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)", 1.0),
        ("\\sqrt{2}", "2^{1/2}", 1.0),
        ("3", "4", 0.0),
        ("\\frac{1}{3}", "0.5", 0.0),
    ],
)
def test_grade_equivalent_forms(gold: str, pred: str, expected: float) -> None:
    assert grade_answer(gold, pred) == expected


def test_slow_grade_times_out_on_main_thread(caplog: pytest.LogCaptureFixture) -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("the timer path needs the main thread")
    grade_answer("1", "\\frac{2}{2}")  # import math-verify outside the timed part
    handler_before = signal.getsignal(signal.SIGALRM)
    start = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="teamrl.domains.math.math"):
        score = grade_answer("(x+1)^{1000}", "(x+2)^{1000}", timeout_s=0.3)  # takes seconds untimed
    assert score == 0.0
    assert sum("timed out after 0.3s" in r.getMessage() for r in caplog.records) == 1  # the timer path was taken
    assert time.perf_counter() - start < HANG_S
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) == handler_before
    assert grade_answer("\\frac{1}{2}", "0.5") == 1.0


def test_hanging_grade_in_helper_process_is_killed(caplog: pytest.LogCaptureFixture) -> None:
    assert grade_answer("\\frac{1}{2}", "0.5", backend="process") == 1.0  # starts a helper
    start = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="teamrl.domains.math.math"):
        score = grade_answer("10^{10^{10}}", "5", timeout_s=0.3, backend="process")  # never ends untimed
    assert score == 0.0
    assert sum("timed out" in r.getMessage() for r in caplog.records) == 1  # killed by the timeout, not finished
    assert time.perf_counter() - start < HANG_S
    assert grade_answer("\\frac{1}{2}", "0.5", backend="process") == 1.0  # a fresh helper takes over


def test_dead_idle_helper_is_replaced() -> None:
    assert grade_answer("\\frac{1}{2}", "0.5", backend="process") == 1.0
    pool = grading_worker.pool()
    for worker in list(pool._idle):
        worker._proc.kill()
        worker._proc.wait()
    assert grade_answer("\\frac{1}{2}", "0.5", backend="process") == 1.0


def test_grading_off_the_main_thread() -> None:
    results: list[tuple[float, float, float]] = []

    def work() -> None:
        start = time.perf_counter()
        slow = grade_answer("10^{10^{10}}", "5", timeout_s=0.3)
        fine = grade_answer("\\frac{1}{2}", "0.5")
        results.append((slow, fine, time.perf_counter() - start))

    threads = [threading.Thread(target=work) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(results) == 2
    for slow, fine, seconds in results:
        assert (slow, fine) == (0.0, 1.0)
        assert seconds < HANG_S


def test_crashing_grade_scores_zero(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("the in-process path needs the main thread")

    def boom(*args: Any) -> bool:
        raise RuntimeError("parser exploded")

    monkeypatch.setattr(grading, "_verify_latex", boom)
    with caplog.at_level(logging.WARNING, logger="teamrl.domains.math.math"):
        assert grade_answer("\\frac{1}{2}", "0.5") == 0.0
    assert sum("parser exploded" in r.getMessage() for r in caplog.records) == 1
