"""Running agents' programs and tests through the task's sandbox: per-case verdicts, references, wrong tasks."""

from __future__ import annotations

import shutil

import pytest

from teamrl.domains.code.code import CodeProblem, IOTests
from teamrl.domains.code.code_exec import code_task_of, reference_of, run_cases
from teamrl.domains.code.pyfunc import PyFuncTask
from teamrl.domains.math.arith import ArithTask
from teamrl.tasks.base import Problem
from tests.team.code_scripted import add_7

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def test_run_cases_gives_each_program_each_case_verdict():
    task = PyFuncTask()
    io = CodeProblem("dbl", "double", IOTests((("1\n", "2\n"),)))
    [[ok, wrong]] = run_cases(task, io, ["print(int(input()) * 2)"], [("3", "6"), ("2", "5")])
    assert ok.ok and wrong.status == "failed" and wrong.actual.strip() == "4"
    code = add_7().meta["code"]
    [[a], [b]] = run_cases(task, code, ["def add_7(x):\n    return x + 7", "def add_7(x):\n    return x"],
                           [("add_7(1)", "8")])
    assert a.ok and b.status == "failed" and (b.expected, b.actual) == ("8", "1")
    assert run_cases(task, code, ["x = 1"], []) == [[]]


def test_reference_must_pass_its_own_tests():
    task = PyFuncTask()
    problem = add_7()
    with pytest.raises(ValueError, match="tester_reward: generated"):
        reference_of(task, problem, "code_team", "set workflow.code_team.tester_reward: generated")
    good = Problem(problem.id + "-ref", problem.question, "def add_7(x):\n    return x + 7\n", problem.meta)
    assert reference_of(task, good, "code_team", "") == good.answer


def test_only_code_tasks_run_programs():
    with pytest.raises(ValueError, match="needs a code task"):
        code_task_of(ArithTask(), "code_tree")


def test_runs_of_concurrent_episodes_share_one_round():
    """Three episodes asking at once: one call of the task's verdicts with all three programs, answers in order."""
    import asyncio

    from teamrl.domains.code.code_exec import run_round

    task, problem = PyFuncTask(), add_7()
    calls = []
    real = task.verdicts
    task.verdicts = lambda pairs: calls.append(len(pairs)) or real(pairs)
    programs = ["def add_7(x):\n    return x + 7", "def add_7(x):\n    return x", None]

    async def episodes():
        return await asyncio.gather(*(run_round().hidden(task, problem, [p]) for p in programs))

    found = asyncio.run(episodes())
    assert calls == [2]  # the episode without a program runs nothing
    assert [v is not None and v.ok for [v] in found] == [True, False, False]
