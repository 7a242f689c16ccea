"""A verifiers v1 taskset written in verifiers' own v1 API (``verifiers >= 0.4``), its rows made in code.

Sums of two numbers, scored by one reward, ``correct``: the last number of the agent's last reply equals the sum.
``configs/verifiers_v1_sum.yaml`` trains one seat on it; ``examples/hubs/vf1_two_seat.py`` plays it with two.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

import verifiers.v1 as vf

__all__ = ["SumTaskset"]

_NUMBER = re.compile(r"-?\d+")
SYSTEM = "Solve the problem. Give the final number."


def last_number(text: str) -> str | None:
    """The last integer written in ``text``."""
    found = _NUMBER.findall(text or "")
    return found[-1] if found else None


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(last_number(trace.last_reply) == self.data.answer)


class SumTasksetConfig(vf.TasksetConfig):
    n: int = 400
    """How many rows."""
    high: int = 10
    """Each addend is drawn from 0..high."""
    seed: int = 0


class SumTaskset(vf.Taskset[SumTask, SumTasksetConfig]):
    def load(self) -> Iterator[SumTask]:
        rng = random.Random(self.config.seed)
        for i in range(self.config.n):
            a, b = rng.randint(0, self.config.high), rng.randint(0, self.config.high)
            yield SumTask(SumData(id=f"sum-{i}", prompt=f"What is {a} + {b}?", system_prompt=SYSTEM,
                                  answer=str(a + b)), self.config.task)
