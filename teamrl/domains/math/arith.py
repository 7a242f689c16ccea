"""Synthetic integer arithmetic task ("arith"), generated from a seed.

Every expression with ``n_operands`` operands drawn from ``[min_value, max_value]``
and operators from ``ops`` is one point of a finite problem space, addressed by
an integer index. The test split is a seeded sample of ``n_test`` indices; the
train split is drawn from the remaining indices, so the two are disjoint by
expression (so "3 + 4" in test and "4 + 3" in train is possible) and the test
split does not change when ``n_train`` does. Nothing is enumerated up front, so
large spaces cost nothing until sampled.

Scoring parses the last integer of a reply (leading minus allowed, thousands
commas ignored) and compares it with the exact value under the usual operator
precedence (``*`` before ``+``/``-``). Left out: division, parentheses, and any
partial credit.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from teamrl.tasks.base import Problem, check_split, config_from, last_number, register_task

__all__ = ["ArithConfig", "ArithTask", "evaluate", "last_integer"]

_ALLOWED_OPS: tuple[str, ...] = ("+", "-", "*")
_MAX_ALL_REMAINING = 1_000_000


@dataclass(kw_only=True)
class ArithConfig:
    """Knobs of the synthetic arithmetic task."""

    min_value: int = 0
    """Smallest operand value (inclusive)."""
    max_value: int = 20
    """Largest operand value (inclusive)."""
    n_operands: int = 2
    """Operands per expression (2 to 4)."""
    ops: list[str] = field(default_factory=lambda: ["+", "-"])
    """Operators to draw from: any of "+", "-", "*"."""
    n_test: int = 200
    """Size of the held-out test split."""
    n_train: int = 0
    """Most training problems to draw; 0 = every expression not in the test split."""
    seed: int = 0
    """Seed for sampling the test and train expressions."""


def last_integer(text: str) -> int | None:
    """The last number in ``text`` as an int, or None if there is none or it is not whole.

    Args:
        text: A model reply.

    Returns:
        The integer value of the last number ("1,234" -> 1234, "-7" -> -7, "7.0" -> 7),
        or None when the text has no number or the last number has a fractional part.

    >>> last_integer("3 + 4 = 7")
    7
    >>> last_integer("The answer is 1,234.")
    1234
    >>> last_integer("no number") is None
    True
    """
    number = last_number(text)
    if number is None:
        return None
    whole, _, frac = number.partition(".")
    if frac.strip("0"):
        return None
    return int(whole)


def evaluate(operands: list[int], ops: list[str]) -> int:
    """Value of ``operands[0] ops[0] operands[1] ...`` with ``*`` binding tighter than ``+``/``-``.

    Args:
        operands: The operand values, one more than ``ops``.
        ops: Operators, each "+", "-" or "*".

    Returns:
        The exact integer value.

    >>> evaluate([2, 3, 4], ["+", "*"])
    14
    """
    total = 0
    sign = 1
    term = operands[0]
    for op, value in zip(ops, operands[1:]):
        if op == "*":
            term *= value
        else:
            total += sign * term
            sign = 1 if op == "+" else -1
            term = value
    return total + sign * term


def _format_expression(operands: list[int], ops: list[str]) -> str:
    """Render an expression, putting negative operands after the first in parentheses."""
    parts = [str(operands[0])]
    for op, value in zip(ops, operands[1:]):
        parts.append(op)
        parts.append(f"({value})" if value < 0 else str(value))
    return " ".join(parts)


def _sample(rng: random.Random, n: int, k: int) -> list[int]:
    """``k`` distinct integers from ``range(n)`` in random order, for any size of ``n``."""
    if n < 2**62:
        return rng.sample(range(n), k)
    # Spaces this large dwarf any k allowed here, so collisions are negligible.
    seen: dict[int, None] = {}
    while len(seen) < k:
        seen.setdefault(rng.randrange(n))
    return list(seen)


def _validate(cfg: ArithConfig) -> None:
    """Raise ValueError for an inconsistent config."""
    if cfg.min_value > cfg.max_value:
        raise ValueError(
            f"arith min_value={cfg.min_value} is above max_value={cfg.max_value}; set min_value <= max_value"
        )
    if not 2 <= cfg.n_operands <= 4:
        raise ValueError(f"arith n_operands={cfg.n_operands} is out of range; use 2, 3 or 4")
    if not cfg.ops:
        raise ValueError(f"arith ops is empty; list at least one of {list(_ALLOWED_OPS)}")
    bad = [op for op in cfg.ops if op not in _ALLOWED_OPS]
    if bad:
        raise ValueError(f"arith ops has unsupported {bad}; allowed are {list(_ALLOWED_OPS)}")
    if len(set(cfg.ops)) != len(cfg.ops):
        raise ValueError(f"arith ops={cfg.ops} repeats an operator; list each once")
    if cfg.n_test < 1:
        raise ValueError(f"arith n_test={cfg.n_test} must be at least 1")
    if cfg.n_train < 0:
        raise ValueError(f"arith n_train={cfg.n_train} must be >= 0 (0 = all remaining)")


@register_task("arith", config=ArithConfig)
class ArithTask:
    """Seeded arithmetic questions such as "What is 12 + 7?" with integer answers.

    >>> task = ArithTask(ArithConfig(max_value=9, n_test=10, seed=1))
    >>> len(task.problems("test"))
    10
    >>> task.score(Problem(id="x", question="What is 2 + 2?", answer="4"), "It is 4.")
    1.0
    """

    name: str = "arith"
    answer_format: str = "Reply with the final answer as a single number."

    def __init__(self, cfg: ArithConfig | dict[str, Any] | None = None) -> None:
        """Check the config and size the problem space.

        Args:
            cfg: An ArithConfig, a mapping of its fields, or None for defaults.
        """
        self.cfg: ArithConfig = config_from(ArithConfig, cfg)
        _validate(self.cfg)
        self._ops: list[str] = list(self.cfg.ops)
        self._width = self.cfg.max_value - self.cfg.min_value + 1
        slots = self.cfg.n_operands - 1
        self._space = self._width**self.cfg.n_operands * len(self._ops) ** slots
        available = self._space - self.cfg.n_test
        if available < 1:
            raise ValueError(
                f"arith problem space has only {self._space} expressions "
                f"({self._width} operand values ^ {self.cfg.n_operands} operands x "
                f"{len(self._ops)} operator(s) ^ {self.cfg.n_operands - 1} slots), which leaves "
                f"no training problems after n_test={self.cfg.n_test}; lower n_test, widen "
                "min_value..max_value, add ops or raise n_operands"
            )
        if self.cfg.n_train == 0 and available > _MAX_ALL_REMAINING:
            raise ValueError(
                f"arith n_train=0 asks for all {available} remaining expressions of a "
                f"{self._space}-expression space; set n_train to at most {_MAX_ALL_REMAINING}"
            )
        self._n_train = available if self.cfg.n_train == 0 else min(self.cfg.n_train, available)
        self._cache: dict[str, list[Problem]] = {}

    @property
    def space_size(self) -> int:
        """Number of distinct expressions the config allows."""
        return self._space

    def _decode(self, index: int) -> tuple[list[int], list[str]]:
        """Operands and operators of the expression with the given space index."""
        n_ops = len(self._ops)
        ops: list[str] = []
        for _ in range(self.cfg.n_operands - 1):
            index, k = divmod(index, n_ops)
            ops.append(self._ops[k])
        operands: list[int] = []
        for _ in range(self.cfg.n_operands):
            index, k = divmod(index, self._width)
            operands.append(self.cfg.min_value + k)
        return operands, ops

    def _problem(self, index: int) -> Problem:
        """Build the Problem for one space index."""
        operands, ops = self._decode(index)
        expression = _format_expression(operands, ops)
        return Problem(
            id=f"arith-{index}",
            question=f"What is {expression}?",
            answer=str(evaluate(operands, ops)),
            meta={"expression": expression, "operands": operands, "ops": ops, "index": index},
        )

    def _indices(self, split: str) -> list[int]:
        """Seeded, disjoint space indices of a split."""
        seed = self.cfg.seed
        test = _sample(random.Random(f"arith-test-{seed}"), self._space, self.cfg.n_test)
        if split == "test":
            return test
        taken = set(test)
        k = min(self._space, self._n_train + self.cfg.n_test)
        draw = _sample(random.Random(f"arith-train-{seed}"), self._space, k)
        return [i for i in draw if i not in taken][: self._n_train]

    def problems(self, split: str) -> list[Problem]:
        """Problems of a split, in a fixed seeded order.

        Args:
            split: "train" or "test".

        Returns:
            A new list of Problems (the same ones on every call).
        """
        check_split(split)
        if split not in self._cache:
            self._cache[split] = [self._problem(i) for i in self._indices(split)]
        return list(self._cache[split])

    def extract_answer(self, response: str) -> str | None:
        """The last integer of ``response`` as text, or None.

        Args:
            response: A model reply.

        Returns:
            e.g. "1234" for "The answer is 1,234.", None for "no number".

        >>> ArithTask().extract_answer("3 + 4 = 7")
        '7'
        """
        value = last_integer(response)
        return None if value is None else str(value)

    def score(self, problem: Problem, response: str) -> float:
        """1.0 if the last integer of ``response`` equals the gold answer, else 0.0.

        Args:
            problem: The problem answered.
            response: The final reply.

        Returns:
            1.0 or 0.0.
        """
        value = last_integer(response)
        return 1.0 if value is not None and str(value) == problem.answer.strip() else 0.0
