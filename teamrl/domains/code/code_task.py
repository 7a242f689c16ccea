"""What every code task shares: the scoring options, and extracting, running and scoring a reply.

A code task's :class:`~teamrl.tasks.base.Problem` carries its :class:`~teamrl.domains.code.code.CodeProblem`
in ``meta["code"]``. :class:`CodeTaskBase` gives the Task methods on top of that: ``extract_answer``
is the reply's last ```python block (None: no block, which the workflows count as an invalid format
and the format penalty applies to), ``score`` runs it against the hidden tests in the sandbox (1.0
when all pass, or the pass fraction with ``reward: fraction``), ``passed`` says whether all tests
passed (pass@k in evaluation counts that), ``verdict`` returns the full :class:`Verdict` (for
feedback). Verdicts are cached per (problem, program), so scoring and pass@k run a program once.

``score_in_thread = True`` tells the rollout to score in a worker thread, so the event loop keeps
generating while programs run.

Left out: where problems come from (``humaneval``, ``pyfunc``, ``code_files``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from teamrl.domains.code.code import CodeProblem, Verdict, extract_code, run_tests_many
from teamrl.sandbox import MECHANISMS, Limits, Sandbox
from teamrl.tasks.base import Problem

__all__ = ["ANSWER_FORMAT", "CodeScoring", "CodeTaskBase", "sandbox_for"]

ANSWER_FORMAT = "Write the complete Python solution in one ```python code block."
_CACHE_SIZE = 4096
_sandboxes: dict[tuple[str, int], Sandbox] = {}
_sandboxes_lock = threading.Lock()


@dataclass(kw_only=True)
class CodeScoring:
    """Options every code task has: reward, limits of each run, and the sandbox."""

    reward: Literal["all", "fraction"] = "all"
    """all: 1.0 when every hidden test passes, else 0.0; fraction: the share of tests passed."""
    cpu_seconds: float = 5.0
    """CPU limit of each run."""
    wall_seconds: float = 10.0
    """Wall-clock limit of each run."""
    memory_mb: int = 512
    """Address-space limit of each run, MiB."""
    sandbox: str = "auto"
    """Isolation: auto (bubblewrap, else an error naming the fix), bwrap, or unsafe_no_isolation."""
    workers: int = 0
    """Programs run at once; 0: the number of CPUs."""

    def __post_init__(self) -> None:
        if self.reward not in ("all", "fraction"):
            raise ValueError(f"reward {self.reward!r} must be 'all' (1/0 for all tests passing) or 'fraction'")
        if self.sandbox not in MECHANISMS:
            raise ValueError(f"sandbox {self.sandbox!r} must be one of {', '.join(MECHANISMS)}")
        if self.workers < 0:
            raise ValueError(f"workers {self.workers} must be >= 0 (0: one per CPU)")
        self.limits()  # checks the limits

    def limits(self) -> Limits:
        """The :class:`Limits` of each run."""
        return Limits(cpu_seconds=self.cpu_seconds, wall_seconds=self.wall_seconds,
                      memory_bytes=int(self.memory_mb) * 2**20)


def sandbox_for(mechanism: str, workers: int) -> Sandbox:
    """The process's sandbox for ``mechanism`` and ``workers`` (built once, then shared by every task)."""
    with _sandboxes_lock:
        key = (mechanism, workers)
        if key not in _sandboxes:
            _sandboxes[key] = Sandbox(mechanism=mechanism, workers=workers or None)
        return _sandboxes[key]


class CodeTaskBase:
    """Task methods shared by code tasks; subclasses set ``name``, ``cfg`` (a :class:`CodeScoring`) and problems."""

    name: str
    cfg: CodeScoring
    answer_format: str = ANSWER_FORMAT
    score_in_thread: bool = True
    pass_label: str = "all tests"
    """Evaluation's pass@k keys read ``pass@k (all tests)``: a sample counts when its program passes every test."""

    def _cache(self) -> OrderedDict[tuple[str, str], Verdict]:
        if not hasattr(self, "_verdicts"):
            self._verdicts: OrderedDict[tuple[str, str], Verdict] = OrderedDict()
            self._lock = threading.Lock()
        return self._verdicts

    def extract_answer(self, response: str) -> str | None:
        """The program in ``response`` (its last ```python block), or None."""
        return extract_code(response)

    def verdicts(self, pairs: list[tuple[Problem, str]]) -> list[Verdict | None]:
        """The verdict of each (problem, program) pair, run in parallel (None for an empty program).

        Args:
            pairs: Code problems (with ``meta["code"]``) and program sources.
        """
        cache = self._cache()
        with self._lock:
            todo = [(p, prog) for p, prog in pairs if prog.strip() and (p.id, prog) not in cache]
        if todo:
            box = sandbox_for(self.cfg.sandbox, self.cfg.workers)
            found = run_tests_many([(self.code_problem(p), prog) for p, prog in todo], sandbox=box,
                                   limits=self.cfg.limits())
            with self._lock:
                for (p, prog), verdict in zip(todo, found, strict=True):
                    cache[(p.id, prog)] = verdict
                while len(cache) > _CACHE_SIZE:
                    cache.popitem(last=False)
        with self._lock:
            return [cache.get((p.id, prog)) if prog.strip() else None for p, prog in pairs]

    def code_problem(self, problem: Problem) -> CodeProblem:
        """The :class:`CodeProblem` behind ``problem``."""
        code = problem.meta.get("code")
        if not isinstance(code, CodeProblem):
            raise ValueError(f"problem {problem.id!r} is not a code problem (no meta['code']); "
                             f"score it with the task that made it")
        return code

    def verdict(self, problem: Problem, response: str) -> Verdict | None:
        """The verdict of the program in ``response`` (None when it holds no code block)."""
        program = self.extract_answer(response)
        return None if program is None else self.verdicts([(problem, program)])[0]

    def score(self, problem: Problem, response: str) -> float:
        """1.0 when the reply's program passes every test (``reward: fraction``: the share passed), else 0.0."""
        verdict = self.verdict(problem, response)
        if verdict is None:
            return 0.0
        return verdict.fraction if self.cfg.reward == "fraction" else float(verdict.ok)

    def passed(self, problem: Problem, response: str) -> bool:
        """Whether the reply's program passes every test (what pass@k counts)."""
        verdict = self.verdict(problem, response)
        return verdict is not None and verdict.ok
