"""The procedural code task: problems, splits, difficulty, hidden tests that pass the reference and fail others."""

from __future__ import annotations

import random
import shutil

import pytest

from teamrl.domains.code.pyfunc import TEMPLATES, make_problem
from teamrl.tasks.base import build_task


def test_every_template_level_and_reference_is_consistent():
    assert {t.level for t in TEMPLATES} == {1, 2, 3}
    for t in TEMPLATES:
        p = make_problem(t, t.constants[0], random.Random(1), pid="x", n_tests=4, show_example=True)
        assert len(p.meta["code"].tests.asserts) == 4 and "Example:" in p.question
        assert p.meta["code"].entry_point in p.question


def test_splits_are_fixed_by_the_seed_and_hold_out_constants():
    task = build_task("pyfunc", {"n_test": 40, "n_train": 200, "difficulty": 2})
    again = build_task("pyfunc", {"n_test": 40, "n_train": 200, "difficulty": 2})
    assert [p.question for p in task.problems("test")] == [p.question for p in again.problems("test")]
    test_keys = {(p.meta["template"], p.meta["k"]) for p in task.problems("test")}
    train_keys = {(p.meta["template"], p.meta["k"]) for p in task.problems("train")}
    shared = {name for name, k in test_keys & train_keys}
    assert shared <= {t.name for t in TEMPLATES if len(t.constants) == 1}  # only constant-free kinds in both
    assert max(p.meta["level"] for p in task.problems("train")) == 2


def test_bad_options_are_refused():
    for bad in ({"difficulty": 0}, {"n_tests": 0}, {"reward": "partial"}, {"sandbox": "none"}, {"cpu_seconds": 0}):
        with pytest.raises(ValueError):
            build_task("pyfunc", bad)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_the_hidden_tests_pass_a_right_program_and_fail_a_wrong_one():
    task = build_task("pyfunc", {"n_test": 1})
    frac = build_task("pyfunc", {"n_test": 1, "reward": "fraction"})
    problem = make_problem(TEMPLATES[0], 7, random.Random(0), pid="pyfunc-x", n_tests=6, show_example=True)
    right = "```python\ndef add_7(x):\n    return x + 7\n```"
    half = "```python\ndef add_7(x):\n    return x + 7 if x % 2 == 0 else 0\n```"
    assert task.score(problem, right) == 1.0 and task.passed(problem, right)
    assert task.score(problem, "```python\ndef add_7(x):\n    return x\n```") == 0.0
    assert 0.0 < frac.score(problem, half) < 1.0 and task.score(problem, half) == 0.0
    assert task.score(problem, "no code block") == 0.0 and task.extract_answer("no code block") is None
