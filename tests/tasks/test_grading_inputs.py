"""Grading that cannot end a run: huge exponents, over-long answers, crashing graders and over-long
data rows score 0.0 (or are reported at load) with one warning, counted by ``grading_errors``."""

from __future__ import annotations

import json
import logging
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest

import teamrl.tasks.grading as grading
import teamrl.tasks.grading_worker as grading_worker
from teamrl.domains.math.math import MathTask
from teamrl.tasks.base import Problem, grading_errors, safe_score
from teamrl.tasks.grading import MAX_ANSWER_CHARS, MAX_EXPONENT, grade_answer, parse_number
from tests.conftest import HANG_S

HUGE = ["1e99999999999999999999", "10^{99999999999999999999}", "$3 \\times 10^{-99999999999999999999}$"]


@pytest.mark.parametrize("huge", HUGE)
@pytest.mark.parametrize("side", ["gold", "prediction"])
def test_huge_exponent_scores_zero_with_a_counted_warning(huge: str, side: str,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    gold, pred = (huge, "5") if side == "gold" else ("5", huge)
    before = grading_errors()
    with caplog.at_level(logging.WARNING, logger="teamrl.domains.math.math"):
        assert grade_answer(gold, pred, timeout_s=2.0) == 0.0  # the old code raised decimal.InvalidOperation
    assert grading_errors() == before + 1
    assert "exponent" in caplog.text and "scored 0.0" in caplog.text


def test_identical_huge_answers_still_match() -> None:
    assert grade_answer(HUGE[0], HUGE[0]) == 1.0  # same text: settled before any number is read


def test_parse_number_bounds_the_exponent() -> None:
    assert parse_number(f"1e{MAX_EXPONENT}") == (Decimal(f"1e{MAX_EXPONENT}"), False)
    assert parse_number(f"2 \\times 10^{{-{MAX_EXPONENT}}}") == (Decimal(f"2e-{MAX_EXPONENT}"), False)
    with pytest.raises(ValueError, match="beyond"):
        parse_number(f"1e{MAX_EXPONENT + 1}")
    with pytest.raises(ValueError, match="beyond"):
        parse_number("10^{" + "9" * 5000 + "}")  # no int() of 5,000 digits either


def test_numbers_near_the_bound_compare_exactly() -> None:
    assert grade_answer("1e1000000000000", "10^{1000000000000}") == 1.0
    assert grade_answer("1e1000000000000", "10^{1000000000001}") == 0.0


def test_over_long_answer_is_refused_before_any_regex(caplog: pytest.LogCaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def no_regex(text: str) -> None:
        raise AssertionError("parse_number ran on an over-long answer")

    monkeypatch.setattr(grading, "parse_number", no_regex)
    monkeypatch.setattr(grading, "_as_latex", no_regex)
    before = grading_errors()
    with caplog.at_level(logging.WARNING, logger="teamrl.domains.math.math"):
        assert grade_answer("5", "5" * (MAX_ANSWER_CHARS + 1)) == 0.0
        assert grade_answer("1" * 50_000_000, "5") == 0.0
    assert grading_errors() == before + 2
    assert "refused: the prediction has 1001 characters" in caplog.text
    assert "the gold answer has 50000000 characters" in caplog.text


def test_answer_at_the_limit_is_graded() -> None:
    assert grade_answer("5" * MAX_ANSWER_CHARS, "5" * MAX_ANSWER_CHARS) == 1.0
    assert grade_answer("  7  " + " " * MAX_ANSWER_CHARS, "7") == 1.0  # the limit counts stripped text


def test_unexpected_exception_in_the_quick_path_scores_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(text: str) -> None:
        raise ArithmeticError("boom")

    monkeypatch.setattr(grading, "parse_number", broken)
    before = grading_errors()
    assert grade_answer("1", "2") == 0.0
    assert grading_errors() == before + 1


class _RaisingTask:
    name = "raising"

    def score(self, problem: Problem, response: str) -> float:
        raise RuntimeError("grader bug")


def test_safe_score_turns_a_raising_task_into_zero(caplog: pytest.LogCaptureFixture) -> None:
    before = grading_errors()
    with caplog.at_level(logging.WARNING, logger="teamrl.tasks.base"):
        assert safe_score(_RaisingTask(), Problem(id="p-1", question="q", answer="1"), "1") == 0.0  # type: ignore[arg-type]
    assert grading_errors() == before + 1
    assert "raising task could not score problem 'p-1' (RuntimeError: grader bug)" in caplog.text


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_grading_helper_runs_under_a_memory_cap() -> None:
    worker = grading_worker.Worker()
    try:
        limits = Path(f"/proc/{worker._proc.pid}/limits").read_text()
        line = next(row for row in limits.splitlines() if row.startswith("Max address space"))
        assert line.split()[3] == str(grading_worker.WORKER_MEMORY_BYTES)
        assert worker.grade("\\boxed{\\frac{1}{2}}", "\\boxed{0.5}", 30.0) is True  # it still grades
    finally:
        worker.close()


def _rows(tmp_path: Path, rows: list[dict[str, str]]) -> str:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(("row", "reason"), [
    ({"question": "q" * 20_001, "answer": "1"}, "question has 20001 characters, over max_question_chars=20000"),
    ({"question": "q", "answer": "1" * (MAX_ANSWER_CHARS + 1)}, "gold answer has 1001 characters"),
    ({"question": "q", "answer": "1e99999999999999999999"}, "exponent"),
])
def test_over_long_rows_are_refused_at_load_naming_the_row(tmp_path: Path, row: dict[str, str], reason: str) -> None:
    source = _rows(tmp_path, [{"question": "What is 1?", "answer": "1"}, row])
    with pytest.raises(ValueError, match=rf"data.jsonl line 2: .*{reason}"):
        MathTask({"test_path": source}).problems("test")


def test_over_long_rows_are_skipped_and_counted_with_skip_bad_rows(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    source = _rows(tmp_path, [{"question": "What is 1?", "answer": "1"}, {"question": "q" * 50_000, "answer": "2"},
                              {"question": "q", "answer": "1e99999999999999999999"}])
    start = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="teamrl.domains.math.math"):
        problems = MathTask({"test_path": source, "skip_bad_rows": True}).problems("test")
    assert [p.answer for p in problems] == ["1"]
    assert "skipped 2 bad row(s)" in caplog.text and "line 2: question has 50000 characters" in caplog.text
    assert time.perf_counter() - start < 10


def test_max_question_chars_is_validated() -> None:
    with pytest.raises(ValueError, match="max_question_chars=0 must be >= 1"):
        MathTask({"test_path": "x.jsonl", "max_question_chars": 0})


def test_a_reply_over_max_reply_chars_is_scored_zero_unread(caplog: pytest.LogCaptureFixture) -> None:
    from teamrl.tasks.base import MAX_REPLY_CHARS

    task = MathTask({"test_path": "x.jsonl"})
    problem = Problem(id="p-2", question="q", answer="5")
    before = grading_errors()
    with caplog.at_level(logging.WARNING, logger="teamrl.tasks.base"):
        assert safe_score(task, problem, "1 " * 25_000_000) == 0.0  # a 50 MB posted answer
    assert grading_errors() == before + 1 and f"has 50000000 characters, over {MAX_REPLY_CHARS}" in caplog.text
    assert safe_score(task, problem, "x" * (MAX_REPLY_CHARS - 12) + "\\boxed{5}") == 1.0  # at the limit: graded


def test_reading_the_answer_is_linear_in_the_reply() -> None:
    from teamrl.domains.math.math import last_boxed

    start = time.perf_counter()
    assert last_boxed("\\boxed{" * 140_000) is None  # unclosed nested boxes: quadratic (hours) in the old code
    assert last_boxed("\\boxed{" * 140_000 + "7" + "}" * 140_000) == "7"  # the last box to open
    assert time.perf_counter() - start < HANG_S
