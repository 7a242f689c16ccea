"""Rollout metrics computed from hand-built episodes."""

from __future__ import annotations

import math

from teamrl.team.records import Episode, Step
from teamrl.train.trainer import multi_call_rate, rollout_metrics


def _episode(index: int, agents: list[str], error: str | None = None) -> Episode:
    ep = Episode(prompt_index=0, index=index, problem_id="p", error=error)
    calls: dict[str, int] = {}
    for a in agents:
        ep.steps.append(Step(prompt_index=0, episode=index, agent=a, agent_call=calls.get(a, 0), model="m",
                             prompt_ids=[1], response_ids=[2], logprobs=[-1.0], temperature=1.0, text="", valid=True))
        calls[a] = calls.get(a, 0) + 1
    return ep


def test_multi_call_rate_by_hand():
    eps = [_episode(0, ["solver", "verifier"]), _episode(1, ["solver", "verifier", "solver", "verifier", "solver"]),
           _episode(2, ["solver", "verifier", "solver"]), _episode(3, ["solver"]),
           _episode(4, ["solver", "solver", "verifier", "verifier"], error="tool failed")]  # failed: left out
    ok = [ep for ep in eps if ep.error is None]
    assert multi_call_rate(ok, "solver") == 2 / 4  # episodes 1 and 2
    assert multi_call_rate(ok, "verifier") == 1 / 4  # episode 1; episode 3 has no verifier call at all
    assert math.isnan(multi_call_rate([], "solver"))
    steps = [s for ep in ok for s in ep.steps]
    metrics = rollout_metrics(eps, steps)
    assert (metrics["agent/solver/multi_call_rate"], metrics["agent/verifier/multi_call_rate"]) == (0.5, 0.25)
