"""From scored episodes to per-step rewards and advantages.

Credit assignment happens first (a step's own reward when the workflow recorded one, else its
agent's reward when the workflow gives per-agent rewards, else the joint episode reward; minus
the format penalty on invalid steps); then one call to
:func:`teamrl.algos.advantages.compute_advantages` with the configured estimator's knobs.

Rewards are terminal (one per episode, or per agent), so every turn's reward-to-go equals the
episode's return: MAGRPO's joint reward-to-go needs no extra transform here. Workflows with
per-turn rewards would apply :func:`teamrl.algos.advantages.reward_to_go` first.
"""

from __future__ import annotations

import torch

from teamrl.algos import advantages as adv_lib
from teamrl.team.records import Episode, Step


def assign_advantages(episodes: list[Episode], *, estimator: str, format_penalty: float, eps: float) -> list[Step]:
    """Fill ``step.reward`` and ``step.advantage`` for every step; returns the steps in order.

    Failed episodes (``episode.error``) are left out: their steps are not trained on.
    """
    episodes = [ep for ep in episodes if ep.error is None]
    steps = [s for ep in episodes for s in ep.steps]
    if not steps:
        return steps
    raw = torch.tensor([credit(ep, i) for ep in episodes for i in range(len(ep.steps))], dtype=torch.float64)
    valid = torch.tensor([s.valid for s in steps])
    rewards = adv_lib.apply_format_penalty(raw, valid, penalty=format_penalty)
    est = adv_lib.get_estimator(estimator)
    agent_names = sorted({s.agent for s in steps})
    agent_ids = torch.tensor([agent_names.index(s.agent) for s in steps])
    episode_ids = torch.tensor([s.episode for s in steps])
    turn_ids = torch.tensor([s.turn for s in steps])
    groups = adv_lib.group_ids_for(est.scope, prompt_ids=torch.tensor([s.group for s in steps]),
                                   agent_ids=agent_ids, turn_ids=turn_ids)
    adv = adv_lib.compute_advantages(rewards, groups, episode_ids, unit=est.unit, center=est.center,
                                     scale=est.scale, eps=eps)
    for s, r, a in zip(steps, rewards.tolist(), adv.tolist()):
        s.reward, s.advantage = r, a
    return steps


def credit(episode: Episode, index: int) -> float:
    """Reward credited to step ``index`` of ``episode``: its own, else its agent's, else the joint reward."""
    if index in episode.step_rewards:
        return episode.step_rewards[index]
    return episode.agent_rewards.get(episode.steps[index].agent, episode.reward)
