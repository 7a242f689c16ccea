"""How the code workflows run programs: always through the task's sandbox, never in this process.

The code workflows (``code_team``, ``code_tree``, ``code_pair``) run model-written programs only
through :mod:`teamrl.tasks.code` (which runs them in :mod:`teamrl.sandbox`):

* :func:`code_task_of` checks that the task is a code task (its problems carry a
  :class:`~teamrl.tasks.code.CodeProblem`) and names the fix when it is not;
* :func:`hidden_verdicts` runs programs against the problem's own tests through the task (whose
  verdict cache the trainer's final scoring then hits);
* :func:`case_problem` and :func:`run_cases` run a program against unit tests an agent wrote
  (one sandbox run per test, so every disagreement is known, not only the first);
* :func:`reference_of` is the problem's reference solution (a code task's ``Problem.answer``, when
  it passes the problem's own tests).

Runs block the episode's coroutine (the sandbox runs them in parallel on its workers): the
order in which episodes ask for generations, and with it the sampled tokens, then does not
depend on how long programs take, so a seed reproduces a run exactly.

Left out: running anything outside the sandbox.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

from teamrl.tasks.base import Problem, Task
from teamrl.tasks.code import CallTests, CodeProblem, IOTests, Verdict, run_tests_many

__all__ = ["CodeTask", "case_problem", "code_task_of", "hidden_verdicts", "reference_of", "run_cases"]


@runtime_checkable
class CodeTask(Protocol):
    """What the code workflows need from a task (:class:`teamrl.tasks.code_task.CodeTaskBase` has it)."""

    name: str
    answer_format: str
    cfg: Any

    def code_problem(self, problem: Problem) -> CodeProblem: ...

    def verdicts(self, pairs: list[tuple[Problem, str]]) -> list[Verdict | None]: ...

    def extract_answer(self, response: str) -> str | None: ...


def code_task_of(task: Task, workflow: str) -> CodeTask:
    """``task`` as a code task, or a ValueError naming the code tasks."""
    if not isinstance(task, CodeTask):
        raise ValueError(f"workflow {workflow!r} runs programs and needs a code task (pyfunc, humaneval, code_files); "
                         f"task {task.name!r} is not one")
    return task


def hidden_verdicts(task: CodeTask, problem: Problem, programs: list[str | None]) -> list[Verdict | None]:
    """The verdict of each program on ``problem``'s own tests (None: no program), run in parallel."""
    found = task.verdicts([(problem, p or "") for p in programs])
    return [v if p else None for p, v in zip(programs, found)]


def case_problem(code: CodeProblem, given: str, expected: str) -> CodeProblem:
    """``code`` with one test an agent wrote in place of its own tests.

    Function-call problems: ``given`` is a call (``add(1, 2)``) and ``expected`` a Python value, the
    test ``assert (given) == (expected)``; stdin/stdout problems: ``given`` is the input text and
    ``expected`` the output.

    >>> p = CodeProblem("p", "add", CallTests(("assert add(0, 0) == 0",)), entry_point="add")
    >>> case_problem(p, "add(1, 2)", "3").tests
    CallTests(asserts=('assert (add(1, 2)) == (3)',), setup='')
    >>> case_problem(CodeProblem("q", "echo", IOTests((("1", "1"),))), "5", "5").tests
    IOTests(cases=(('5\\n', '5'),))
    """
    if isinstance(code.tests, IOTests):
        given = given if given.endswith("\n") else given + "\n"
        return dataclasses.replace(code, tests=IOTests(((given, expected),)))
    return dataclasses.replace(code, tests=CallTests((f"assert ({given}) == ({expected})",), setup=code.tests.setup))


def run_cases(task: CodeTask, code: CodeProblem, programs: list[str], cases: list[tuple[str, str]]) -> list[list[Verdict]]:
    """Each program's verdict on each (input, expected output) case, all runs in parallel.

    Returns:
        ``[program][case]`` verdicts.
    """
    problems = [case_problem(code, given, expected) for given, expected in cases]
    items = [(p, prog) for prog in programs for p in problems]
    if not items:
        return [[] for _ in programs]
    from teamrl.tasks.code_task import sandbox_for  # the task's own sandbox (built once per process)

    found = run_tests_many(items, sandbox=sandbox_for(task.cfg.sandbox, task.cfg.workers), limits=task.cfg.limits())
    n = len(problems)
    return [found[i * n:(i + 1) * n] for i in range(len(programs))]


def reference_of(task: CodeTask, problem: Problem, workflow: str, fix: str) -> str:
    """The problem's reference solution: its ``answer`` when that passes the problem's own tests, else a ValueError.

    HumanEval's answer is the canonical solution; a task whose answer is only a signature (``pyfunc``)
    has no reference program, which ``fix`` says how to do without.
    """
    [verdict] = hidden_verdicts(task, problem, [problem.answer if problem.answer.strip() else None])
    if verdict is None or not verdict.ok:
        raise ValueError(f"workflow {workflow!r} runs tests on the problem's reference solution, but the answer of "
                         f"problem {problem.id!r} ({task.name}) does not pass its own tests, so it is no reference; "
                         f"{fix}")
    return problem.answer
