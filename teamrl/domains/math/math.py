"""Math word-problem task ("math"): GSM8K / MATH-style data graded with math-verify.

Data comes from a local ``.jsonl`` / ``.json`` (a list of objects) / ``.parquet``
file, a local dataset folder, or a Hugging Face dataset id (the last two through
the optional ``datasets`` package, imported only when needed; :mod:`teamrl.tasks.rows`). Each row is mapped
to a :class:`~teamrl.tasks.base.Problem`: the question from "question", "problem"
or "prompt"; the gold answer from "answer" (GSM8K's "... #### 42" becomes "42"),
"final_answer" (a list gives its first item) or "solution" (the last ``\\boxed{}``).

Replies are graded by :func:`teamrl.tasks.grading.grade_answer` (math-verify under
a hard time limit), re-exported here.
Over-long rows are bad rows (:func:`teamrl.tasks.rows.check_sizes`; see ``skip_bad_rows``).

Left out: partial credit, answer-type-specific rules (units, multiple-choice
letters beyond what math-verify does), and prompt templates.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from teamrl.domains.math.answers import gold_answer, last_boxed
from teamrl.domains.math.answers import short_repr as _short
from teamrl.tasks.base import Problem, check_split, config_from, last_number, register_task
from teamrl.tasks.grading import GRADE_BACKENDS, grade_answer
from teamrl.tasks.rows import BadLine, check_sizes, load_rows

__all__ = [
    "GRADE_BACKENDS",
    "MathConfig",
    "MathTask",
    "gold_answer",
    "grade_answer",
    "last_boxed",
    "load_rows",
]

logger = logging.getLogger(__name__)

QUESTION_KEYS: tuple[str, ...] = ("question", "problem", "prompt")
"""Row fields tried, in order, for the question text."""
ANSWER_KEYS: tuple[str, ...] = ("answer", "final_answer", "solution")
"""Row fields tried, in order, for the gold answer."""


@dataclass(kw_only=True)
class MathConfig:
    """Where the math problems come from and how answers are graded."""

    train_path: str | None = None
    """Train data: .jsonl/.json/.parquet file, dataset folder, or Hugging Face id ("openai/gsm8k")."""
    test_path: str | None = None
    """Test data, in the same forms as train_path."""
    hf_config: str | None = None
    """Config name for Hugging Face ids and dataset folders (e.g. "main" for openai/gsm8k)."""
    train_split: str = "train"
    """Split read from a Hugging Face id or dataset folder for the train problems."""
    test_split: str = "test"
    """Split read from a Hugging Face id or dataset folder for the test problems."""
    question_key: str | None = None
    """Row field with the question ("a.b" = nested); None = first of question, problem, prompt."""
    answer_key: str | None = None
    """Row field with the answer ("a.b" = nested); None = first of answer, final_answer, solution."""
    test_answer_key: str | None = None
    """Row field with the test split's answer, where the two splits keep it in different fields; None = answer_key."""
    skip_bad_rows: bool = False
    """Skip rows lacking a usable question or answer (one warning with the count); else fail."""
    limit_train: int = 0
    """Use at most this many train problems after shuffling; 0 = all."""
    limit_test: int = 0
    """Use the first this many test problems; 0 = all."""
    seed: int = 0
    """Seed for the order of the train problems (the test order is the file order)."""
    grade_timeout_s: float = 5.0
    """Seconds one grade may take before it scores 0.0."""
    grade_backend: str = "auto"
    """How the grading time limit is enforced: "auto" or "process" (see GRADE_BACKENDS)."""
    answer_fallback: Literal["last_number", "none"] = "last_number"
    """What a reply without a \\boxed{} answers. last_number: its last number. none: nothing, so it scores 0 and is an invalid step (the format penalty applies), as Dr. MAS's math reward reads only a boxed answer."""
    max_question_chars: int = 20_000
    """Longest question (characters) a row may have; a longer row is a bad row (see skip_bad_rows).
    The models' context limits (``models.<m>.max_context``) still apply to every call."""


def _question_text(key: str, value: Any) -> str:
    """Question text from a field: a string, or the last user message of a chat list."""
    if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        users = [m for m in value if m.get("role", "user") == "user"] or value
        value = users[-1].get("content")
    if not isinstance(value, str):
        raise ValueError(f"{key!r} is {type(value).__name__} {_short(value)}, expected text")  # noqa: TRY004 (bad data)
    if not value.strip():
        raise ValueError(f"{key!r} is empty")
    return value.strip()


def _lookup(row: dict[str, Any], key: str) -> tuple[bool, Any]:
    """(found, value) for ``key`` in ``row``; dotted keys reach into nested objects."""
    if key in row:
        return True, row[key]
    node: Any = row
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _pick(
    row: dict[str, Any],
    override: str | None,
    candidates: tuple[str, ...],
    convert: Callable[[str, Any], str],
    what: str,
) -> tuple[str, str]:
    """(key used, converted text) for the question or the answer of a row."""
    keys = (override,) if override else candidates
    present = [k for k in keys if _lookup(row, k)[0]]
    if not present:
        looked = repr(override) if override else ", ".join(candidates)
        raise ValueError(f"no {what} field (looked for {looked})")
    first_error: ValueError | None = None
    for key in present:
        try:
            return key, convert(key, _lookup(row, key)[1])
        except ValueError as exc:
            first_error = first_error or exc
    raise ValueError(f"unusable {what}: {first_error}")


# --------------------------------------------------------------------------- task


def _validate(cfg: MathConfig) -> None:
    """Raise ValueError for an inconsistent config."""
    for name in ("limit_train", "limit_test"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"math {name}={getattr(cfg, name)} must be >= 0 (0 = all)")
    if cfg.max_question_chars < 1:
        raise ValueError(f"math max_question_chars={cfg.max_question_chars} must be >= 1 characters, e.g. 20000")
    if not cfg.grade_timeout_s > 0:
        raise ValueError(f"math grade_timeout_s={cfg.grade_timeout_s} must be > 0 seconds")
    if cfg.grade_backend not in GRADE_BACKENDS:
        raise ValueError(f"math grade_backend={cfg.grade_backend!r} is unknown; use one of {', '.join(GRADE_BACKENDS)}")
    if cfg.train_path is None and cfg.test_path is None:
        raise ValueError(
            "math task needs data: set train_path and/or test_path "
            "(a file, a dataset folder or a Hugging Face dataset id)"
        )


def _smoke(cfg: Any) -> list[str]:
    """``--smoke``: generated arithmetic problems in MATH's layout (:func:`teamrl.smoke_data.math_files`)."""
    from teamrl import smoke_data

    train, test = smoke_data.math_files()
    return [f"task.math.train_path={train}", f"task.math.test_path={test}", "task.math.train_split=train",
            "task.math.test_split=test", "task.math.limit_train=8", "task.math.limit_test=2",
            "task.math.answer_key=null", "task.math.test_answer_key=null", "task.math.question_key=null"]


@register_task("math", config=MathConfig, smoke=_smoke, benchmarks=True)
class MathTask:
    """Math problems from files or datasets, graded by math-verify.

    >>> task = MathTask(MathConfig(test_path="data/gsm8k/test.jsonl"))
    >>> task.extract_answer("so the total is \\\\boxed{18}.")
    '18'
    """

    name: str = "math"
    answer_format: str = "Put the final answer in \\boxed{}."

    def __init__(self, cfg: MathConfig | dict[str, Any] | None = None) -> None:
        """Check the config; data is read on the first ``problems()`` call of each split.

        Args:
            cfg: A MathConfig or a mapping of its fields; a data path is required.
        """
        self.cfg: MathConfig = config_from(MathConfig, cfg)
        _validate(self.cfg)
        self._cache: dict[str, list[Problem]] = {}

    def problems(self, split: str) -> list[Problem]:
        """Problems of a split: train shuffled by ``seed``, test in file order; then limited.

        Args:
            split: "train" or "test".

        Returns:
            A new list of Problems (the same ones on every call).
        """
        check_split(split)
        if split not in self._cache:
            self._cache[split] = self._load(split)
        return list(self._cache[split])

    def _load(self, split: str) -> list[Problem]:
        """Read, map and order the problems of a split."""
        cfg = self.cfg
        source = cfg.train_path if split == "train" else cfg.test_path
        if source is None:
            needs = "training needs the train split" if split == "train" else "evaluation needs the test split"
            raise ValueError(
                f"math task has no {split}_path ({needs}); set task.math.{split}_path to a data file, "
                "a dataset folder or a Hugging Face dataset id"
            )
        source_split = cfg.train_split if split == "train" else cfg.test_split
        rows = load_rows(str(source), split=source_split, hf_config=cfg.hf_config)
        problems = self._map_rows(str(source), split, rows)
        if split == "train":
            random.Random(cfg.seed).shuffle(problems)
        limit = cfg.limit_train if split == "train" else cfg.limit_test
        return problems[:limit] if limit else problems

    def _map_rows(self, source: str, split: str, rows: Iterable[tuple[int, Any]]) -> list[Problem]:
        """Problems from raw rows, failing on (or skipping) bad rows."""
        problems: list[Problem] = []
        skipped: list[str] = []
        for index, (number, row) in enumerate(rows):
            try:
                problems.append(self._problem(source, split, index, number, row))
            except ValueError as exc:
                keys = sorted(row) if isinstance(row, dict) else []
                where = "line" if source.lower().endswith(".jsonl") else "row"
                message = f"{source} {where} {number}: {exc}; keys present: {keys}"
                if not self.cfg.skip_bad_rows:
                    raise ValueError(
                        f"{message}. Fix the row, set question_key/answer_key to the right fields, "
                        "or set skip_bad_rows: true to skip such rows"
                    ) from None
                skipped.append(message)
        if skipped:
            logger.warning("skipped %d bad row(s) of %s; first: %s", len(skipped), source, skipped[0])
        if not problems:
            raise ValueError(f"{source} gave no usable {split} problems; check the file and the field names")
        return problems

    def _problem(self, source: str, split: str, index: int, number: int, row: Any) -> Problem:
        """One Problem from one raw row (ValueError when the row is unusable)."""
        if isinstance(row, BadLine):
            raise ValueError(row.reason)  # noqa: TRY004 (bad data)
        if not isinstance(row, dict):
            raise ValueError(f"row is {type(row).__name__} {_short(row)}, expected an object")  # noqa: TRY004
        cfg = self.cfg
        q_key, question = _pick(row, cfg.question_key, QUESTION_KEYS, _question_text, "question")
        key = cfg.test_answer_key if split == "test" and cfg.test_answer_key is not None else cfg.answer_key
        _, answer = _pick(row, key, ANSWER_KEYS, gold_answer, "answer")
        check_sizes(question, answer, cfg.max_question_chars)
        fields = {k: v for k, v in row.items() if k != q_key}
        return Problem(
            id=f"{split}-{index}",
            question=question,
            answer=answer,
            meta={"source": source, "row": number, "fields": fields},
        )

    def extract_answer(self, response: str) -> str | None:
        """The last ``\\boxed{}`` content of ``response``, else its last number (``answer_fallback: last_number``),
        else None.

        Args:
            response: A model reply.

        Returns:
            The answer text, e.g. "\\frac{1}{2}" or "1234"; a full stop right after
            a number at the end of the box is dropped.
        """
        boxed = last_boxed(response)
        if boxed is not None:
            boxed = re.sub(r"(?<=\d)\.$", "", boxed)  # "\boxed{104.}" -> "104"
            return boxed or None
        return last_number(response) if self.cfg.answer_fallback == "last_number" else None

    def score(self, problem: Problem, response: str) -> float:
        """1.0 if the extracted answer is equivalent to the gold answer (math-verify), else 0.0.

        Args:
            problem: The problem answered.
            response: The final reply.

        Returns:
            1.0 or 0.0; a grade past ``grade_timeout_s`` scores 0.0.
        """
        pred = self.extract_answer(response)
        if pred is None:
            return 0.0
        return grade_answer(problem.answer, pred, timeout_s=self.cfg.grade_timeout_s, backend=self.cfg.grade_backend)
