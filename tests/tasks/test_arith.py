"""Tests for the synthetic arithmetic task and the task registry."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from teamrl.domains.math.arith import ArithConfig, ArithTask, evaluate, last_integer
from teamrl.tasks.base import (
    TASKS,
    Problem,
    Task,
    build_task,
    config_from,
    last_number,
    register_task,
)


def _questions(problems: list[Problem]) -> list[str]:
    return [p.question for p in problems]


def test_default_config_sizes_and_disjoint_splits() -> None:
    task = ArithTask()
    assert task.space_size == 21 * 21 * 2
    test = task.problems("test")
    train = task.problems("train")
    assert len(test) == 200
    assert len(train) == task.space_size - 200
    assert not set(_questions(test)) & set(_questions(train))
    assert len(set(_questions(train))) == len(train)
    assert len({p.id for p in test + train}) == len(test) + len(train)


def test_questions_and_answers_are_consistent() -> None:
    task = ArithTask(ArithConfig(min_value=-5, max_value=9, n_operands=3, ops=["+", "-", "*"], n_test=50))
    for p in task.problems("test") + task.problems("train")[:300]:
        assert p.question.startswith("What is ") and p.question.endswith("?")
        expression = p.question[len("What is ") : -1]
        assert int(p.answer) == eval(expression)  # independent check of the precedence rules
        assert p.meta["expression"] == expression
        values = p.meta["operands"]
        assert all(-5 <= v <= 9 for v in values) and len(values) == 3


def test_same_seed_same_problems_other_seed_other_problems() -> None:
    cfg = ArithConfig(max_value=30, n_test=40, n_train=100, seed=7)
    a, b = ArithTask(cfg), ArithTask(ArithConfig(max_value=30, n_test=40, n_train=100, seed=7))
    assert a.problems("test") == b.problems("test")
    assert a.problems("train") == b.problems("train")
    c = ArithTask(ArithConfig(max_value=30, n_test=40, n_train=100, seed=8))
    assert _questions(c.problems("test")) != _questions(a.problems("test"))


def test_test_split_does_not_depend_on_n_train() -> None:
    small = ArithTask(ArithConfig(n_test=50, n_train=10, seed=3))
    full = ArithTask(ArithConfig(n_test=50, n_train=0, seed=3))
    assert small.problems("test") == full.problems("test")
    assert len(small.problems("train")) == 10
    assert not set(_questions(full.problems("test"))) & set(_questions(full.problems("train")))


def test_n_train_is_capped_by_the_space() -> None:
    task = ArithTask(ArithConfig(max_value=3, ops=["+"], n_test=6, n_train=1000))
    assert task.space_size == 16
    assert len(task.problems("train")) == 10


def test_large_space_is_sampled_not_enumerated() -> None:
    start = time.perf_counter()
    task = ArithTask(ArithConfig(max_value=10**6, n_operands=4, ops=["+", "-", "*"], n_test=100, n_train=500))
    train, test = task.problems("train"), task.problems("test")
    assert time.perf_counter() - start < 30.0  # enumerating the 10**24 problems would never end
    assert len(train) == 500 and len(test) == 100
    assert not set(_questions(train)) & set(_questions(test))


def test_all_remaining_of_a_huge_space_is_refused() -> None:
    with pytest.raises(ValueError, match="set n_train to at most"):
        ArithTask(ArithConfig(max_value=1000, n_operands=3, n_train=0))


def test_too_small_space_says_how_many_exist() -> None:
    with pytest.raises(ValueError, match=r"only 8 expressions.*lower n_test"):
        ArithTask(ArithConfig(max_value=1, ops=["+", "-"], n_operands=2, n_test=8))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"n_operands": 5}, "n_operands=5"),
        ({"n_operands": 1}, "n_operands=1"),
        ({"ops": ["/"]}, "unsupported"),
        ({"ops": []}, "empty"),
        ({"ops": ["+", "+"]}, "repeats"),
        ({"min_value": 5, "max_value": 2}, "min_value=5"),
        ({"n_test": 0}, "n_test=0"),
        ({"n_train": -1}, "n_train=-1"),
    ],
)
def test_bad_config_is_rejected(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ArithTask(ArithConfig(**changes))


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("The answer is 1,234.", "1234"),
        ("-7", "-7"),
        ("no number", None),
        ("3 + 4 = 7", "7"),
        ("So 10 - 4", "4"),
        ("x is -12 in the end", "-12"),
        ("\u22125", "-5"),
        ("It is 7.0", "7"),
        ("It is 3.5", None),
        ("12,34", "34"),
        ("1,234,567 apples", "1234567"),
        ("", None),
    ],
)
def test_extract_answer_on_messy_replies(reply: str, expected: str | None) -> None:
    assert ArithTask().extract_answer(reply) == expected


def test_score_uses_the_last_integer() -> None:
    task = ArithTask()
    problem = Problem(id="p", question="What is 600 + 634?", answer="1234")
    assert task.score(problem, "600 + 634 = 1,234") == 1.0
    assert task.score(problem, "1234 is wrong, it is 1233") == 0.0
    assert task.score(problem, "I don't know") == 0.0
    negative = Problem(id="n", question="What is 3 - 10?", answer="-7")
    assert task.score(negative, "3 - 10 = -7") == 1.0
    assert task.score(negative, "7") == 0.0


def test_gold_answers_score_one() -> None:
    task = ArithTask(ArithConfig(min_value=-20, max_value=20, n_operands=3, ops=["+", "-", "*"], n_test=100))
    for p in task.problems("test"):
        assert task.score(p, f"{p.question[8:-1]} = {p.answer}") == 1.0


@settings(max_examples=200, deadline=None)
@given(
    operands=st.lists(st.integers(-50, 50), min_size=2, max_size=4),
    ops=st.lists(st.sampled_from(["+", "-", "*"]), min_size=3, max_size=3),
)
def test_evaluate_matches_python(operands: list[int], ops: list[str]) -> None:
    ops = ops[: len(operands) - 1]
    text = str(operands[0]) + "".join(f" {op} ({v})" for op, v in zip(ops, operands[1:]))
    assert evaluate(operands, ops) == eval(text)


@settings(max_examples=200, deadline=None)
@given(st.integers(-(10**9), 10**9))
def test_last_integer_round_trips_formatted_numbers(value: int) -> None:
    assert last_integer(f"The result is {value:,}.") == value
    assert last_integer(f"The result is {value}") == value


def test_last_number_keeps_decimals() -> None:
    assert last_number("pi is about 3.14") == "3.14"
    assert last_number("(2)-3") == "3"


def test_unknown_split_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        ArithTask().problems("dev")


def test_build_task_from_mapping_and_protocol() -> None:
    task = build_task("arith", {"max_value": 9, "n_test": 10})
    assert isinstance(task, Task)
    assert task.name == "arith"
    assert len(task.problems("test")) == 10
    assert "math" in TASKS


def test_build_task_unknown_name_suggests() -> None:
    with pytest.raises(ValueError, match=r"unknown task 'arit'; did you mean 'arith'"):
        build_task("arit", None)


def test_register_task_duplicate_is_rejected() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_task("arith")(ArithTask)


def test_config_from_rejects_unknown_fields() -> None:
    with pytest.raises(ValueError, match=r"'max_valu' \(did you mean 'max_value'\?\)"):
        config_from(ArithConfig, {"max_valu": 3})
    with pytest.raises(ValueError, match="expected a ArithConfig"):
        config_from(ArithConfig, 3)


def test_register_and_build_a_custom_task() -> None:
    @dataclass(kw_only=True)
    class EchoConfig:
        word: str = "hi"
        """Word to echo."""

    @register_task("echo-test")
    class EchoTask:
        name = "echo-test"
        answer_format = "Say the word."

        def __init__(self, cfg: EchoConfig | None = None) -> None:
            self.cfg = config_from(EchoConfig, cfg)

        def problems(self, split: str) -> list[Problem]:
            return [Problem(id="0", question="Say it", answer=self.cfg.word)]

        def extract_answer(self, response: str) -> str | None:
            return response.strip() or None

        def score(self, problem: Problem, response: str) -> float:
            return float(self.extract_answer(response) == problem.answer)

    try:
        task = build_task("echo-test", {"word": "yo"})
        assert task.score(task.problems("train")[0], " yo ") == 1.0
    finally:
        del TASKS["echo-test"]
