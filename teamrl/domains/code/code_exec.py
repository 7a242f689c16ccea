"""How the code workflows run programs: always through the task's sandbox, never in this process.

The code workflows (``code_team``, ``code_tree``, ``code_pair``) run model-written programs only
through :mod:`teamrl.domains.code.code` (which runs them in :mod:`teamrl.sandbox`):

* :func:`code_task_of` checks that the task is a code task (its problems carry a
  :class:`~teamrl.domains.code.code.CodeProblem`) and names the fix when it is not;
* :func:`hidden_verdicts` runs programs against the problem's own tests through the task (whose
  verdict cache the trainer's final scoring then hits);
* :func:`case_problem` and :func:`run_cases` run a program against unit tests an agent wrote
  (one sandbox run per test, so every disagreement is known, not only the first);
  :meth:`RunRound.hidden` and :meth:`RunRound.cases` are the same inside a rollout;
* :func:`reference_of` is the problem's reference solution (a code task's ``Problem.answer``, when
  it passes the problem's own tests);
* :class:`RunRound` (:func:`run_round`) gathers the runs all episodes ask for between two
  generation batches into one round, run at once on the sandbox's workers, and resumes the
  episodes in the order they asked: the order of generation requests, and with it the sampled
  tokens, does not depend on how long programs take, so a seed reproduces a run exactly.

Left out: running anything outside the sandbox.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Protocol, runtime_checkable

from teamrl.domains.code.code import CallTests, CodeProblem, IOTests, Verdict, run_tests_many
from teamrl.tasks.base import Problem, Task

__all__ = ["CodeTask", "case_problem", "code_task_of", "hidden_verdicts", "reference_of", "run_cases"]


@runtime_checkable
class CodeTask(Protocol):
    """What the code workflows need from a task (:class:`teamrl.domains.code.code_task.CodeTaskBase` has it)."""

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
    from teamrl.domains.code.code_task import sandbox_for  # the task's own sandbox (built once per process)

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


class RunRound:
    """Gathers the sandbox runs that the episodes of one rollout ask for between two generation batches.

    An episode awaits :meth:`hidden` or :meth:`cases`; the round waits until no episode adds more
    (the event loop only steps coroutines meanwhile, so which runs join a round is the same in every
    run of a seed), runs them all at once on the sandbox's workers, and resolves the waiting episodes
    in the order they asked. Their next generation requests then come in the same order every time.
    """

    def __init__(self) -> None:
        self.hidden_items: list[tuple[CodeTask, Problem, str, asyncio.Future[Verdict | None]]] = []
        self.case_items: list[tuple[CodeTask, CodeProblem, str, tuple[str, str], asyncio.Future[Verdict]]] = []
        self.program_items: list[tuple[str, float, asyncio.Future[str]]] = []
        self.flushing = False

    async def _flush(self) -> None:
        seen = -1
        for _ in range(1000):  # settle: let every runnable episode reach its next wait
            await asyncio.sleep(0)
            now = len(self.hidden_items) + len(self.case_items) + len(self.program_items)
            if now == seen:
                break
            seen = now
        hidden, self.hidden_items = self.hidden_items, []
        cases, self.case_items = self.case_items, []
        programs, self.program_items = self.program_items, []
        self.flushing = False
        if programs:
            _run_programs(programs)
        by_task: dict[int, list[int]] = {}
        for i, (task, *_rest) in enumerate(hidden):
            by_task.setdefault(id(task), []).append(i)
        results: dict[int, Verdict | None] = {}
        for idxs in by_task.values():
            task = hidden[idxs[0]][0]
            found = task.verdicts([(hidden[i][1], hidden[i][2]) for i in idxs])
            results.update(zip(idxs, found))
        case_results: list[Verdict] = []
        if cases:
            from teamrl.domains.code.code_task import sandbox_for  # the task's own sandbox (built once per process)

            first = cases[0][0]
            case_results = run_tests_many([(case_problem(c, g, e), prog) for _, c, prog, (g, e), _ in cases],
                                          sandbox=sandbox_for(first.cfg.sandbox, first.cfg.workers),
                                          limits=first.cfg.limits())
        for i, (_, _, _, hfut) in enumerate(hidden):
            hfut.set_result(results[i])
        for (_, _, _, _, cfut), verdict in zip(cases, case_results):
            cfut.set_result(verdict)

    def _start(self) -> None:
        if not self.flushing:
            self.flushing = True
            asyncio.ensure_future(self._flush())

    async def hidden(self, task: CodeTask, problem: Problem, programs: list[str | None]) -> list[Verdict | None]:
        """Like :func:`hidden_verdicts`, run in this round."""
        loop = asyncio.get_running_loop()
        futs = []
        for p in programs:
            fut: asyncio.Future[Verdict | None] = loop.create_future()
            if p:
                self.hidden_items.append((task, problem, p, fut))
            else:
                fut.set_result(None)
            futs.append(fut)
        self._start()
        return list(await asyncio.gather(*futs))

    async def program(self, code: str, seconds: float) -> str:
        """Run a plain program in this round (``seconds`` of CPU, twice that of wall time); what it printed, or
        its verdict and output when it failed."""
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.program_items.append((code, seconds, fut))
        self._start()
        return await fut

    async def cases(self, task: CodeTask, code: CodeProblem, programs: list[str],
                    cases: list[tuple[str, str]]) -> list[list[Verdict]]:
        """Like :func:`run_cases`, run in this round."""
        loop = asyncio.get_running_loop()
        futs: list[list[asyncio.Future[Verdict]]] = []
        for prog in programs:
            row = []
            for case in cases:
                fut: asyncio.Future[Verdict] = loop.create_future()
                self.case_items.append((task, code, prog, case, fut))
                row.append(fut)
            futs.append(row)
        self._start()
        return [list(await asyncio.gather(*row)) if row else [] for row in futs]


def _run_programs(items: list[tuple[str, float, asyncio.Future[str]]]) -> None:
    """Run :meth:`RunRound.program`'s items at once on the sandbox's workers; resolve them in order. A sandbox
    that fails to start fails the waiting episodes, not the rollout."""
    from teamrl.sandbox import Job, Limits, default_sandbox, trim  # the only place model-written code runs

    try:
        runs = default_sandbox().map([Job(code, limits=Limits(cpu_seconds=sec, wall_seconds=2 * sec))
                                      for code, sec, _ in items])
    except Exception as exc:
        for *_, fut in items:
            fut.set_exception(exc)
        return
    for (*_, fut), r in zip(items, runs):
        fut.set_result(r.stdout if r.ok else trim(f"[{r.verdict}] {r.stdout}{r.stderr}", _SHOWN))


_SHOWN = 600  # characters of a failed program's verdict and output returned by RunRound.program


_rounds: dict[int, RunRound] = {}


def run_round() -> RunRound:
    """The :class:`RunRound` of the running event loop (one per rollout's loop)."""
    loop = asyncio.get_running_loop()
    found = _rounds.get(id(loop))
    if found is None or getattr(found, "_loop", None) is not loop:
        found = RunRound()
        found._loop = loop  # type: ignore[attr-defined]
        _rounds.clear()  # one loop at a time runs a rollout; drop rounds of finished loops
        _rounds[id(loop)] = found
    return found
