"""The train problems' sampler: an endless shuffled pass over the train split whose state is one integer."""

from __future__ import annotations

import random

from teamrl.tasks.base import Problem

__all__ = ["ProblemSampler"]


class ProblemSampler:
    """Endless shuffled pass over the train split; its state is one integer (problems served)."""

    def __init__(self, problems: list[Problem], seed: int) -> None:
        if not problems:
            raise ValueError("the task's train split is empty; check the task's data settings")
        self.problems, self.seed, self.cursor = problems, seed, 0

    def next(self, n: int) -> list[Problem]:
        out = []
        for _ in range(n):
            epoch, i = divmod(self.cursor, len(self.problems))
            order = list(range(len(self.problems)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            out.append(self.problems[order[i]])
            self.cursor += 1
        return out
