"""Helpers shared by the advantage tests: a preset run on plain lists, and a close comparison."""

from __future__ import annotations

import math

import torch
from hypothesis import settings

from teamrl.algos.advantages import (
    compute_advantages,
    get_estimator,
    group_ids_for,
)

FAST = settings(max_examples=40, deadline=None)

S3 = 1 / math.sqrt(3)  # 0.57735: (1/3) / std where std of [1, 1, 0] is sqrt(1/3)


def run_preset(name: str, rewards, episodes, agents, turns, prompts=None) -> torch.Tensor:
    est = get_estimator(name)
    r = torch.tensor(rewards, dtype=torch.float64)
    e = torch.tensor(episodes)
    a = torch.tensor(agents)
    t = torch.tensor(turns)
    p = torch.zeros_like(e) if prompts is None else torch.tensor(prompts)
    g = group_ids_for(est.scope, prompt_ids=p, agent_ids=a, turn_ids=t)
    return compute_advantages(r, g, e, unit=est.unit, center=est.center, scale=est.scale)


def close(actual: torch.Tensor, expected: list[float]) -> None:
    torch.testing.assert_close(
        actual, torch.tensor(expected, dtype=actual.dtype), rtol=1e-5, atol=1e-5
    )
