"""From scored episodes to per-step rewards and advantages.

Credit assignment happens first (a step's own reward when the workflow recorded one, else its
agent's reward when the workflow gives per-agent rewards, else the joint episode reward; minus
the format penalty on invalid steps; shaped along its search tree by MARTI's ``reward_alloc`` when
configured, :func:`teamrl.algos.credit.shape_tree_rewards`; plus the optional overlong penalty of
:func:`teamrl.algos.credit.overlong_penalty`); then one call to
:func:`teamrl.algos.advantages.compute_advantages` with the configured estimator's knobs.

Rewards are terminal (one per episode, or per agent), so every turn's reward-to-go equals the
episode's return: MAGRPO's joint reward-to-go needs no extra transform here. Workflows with
per-turn rewards would apply :func:`teamrl.algos.advantages.reward_to_go` first.

Rewards enter training only through :func:`refuse_bad_rewards`: an episode whose joint, per-agent or
per-step reward is not a finite number within ±:data:`MAX_ABS_REWARD` (whatever set it: a task, a
workflow, an agent program, a credit method) becomes a failed episode with the reason, so one bad
value costs one episode, never the run.
"""

from __future__ import annotations

import math
from collections.abc import Hashable

import torch

from teamrl.algos import advantages as adv_lib
from teamrl.algos.credit import overlong_penalty, shape_tree_rewards
from teamrl.algos.rae import role_baseline_advantages
from teamrl.team.records import Episode, Step

MAX_ABS_REWARD = 1e6
"""Largest reward magnitude trained on. Far above any task's scale (0/1 scores, format penalties), far
below where squares and sums of rewards overflow float64 (1e308 squared is inf) in the advantages and
the diagnostics."""


def _bad_reward(ep: Episode) -> str | None:
    """The first reward of ``ep`` that is not a finite number within ±MAX_ABS_REWARD, described; else None."""
    found: list[tuple[str, object]] = [("its reward", ep.reward)]
    found += [(f"agent {a!r}'s reward", r) for a, r in ep.agent_rewards.items()]
    found += [(f"the reward of call {i}" + (f" (agent {ep.steps[i].agent!r})" if 0 <= i < len(ep.steps) else ""), r)
              for i, r in ep.step_rewards.items()]
    for what, value in found:
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return f"{what} is {value!r}"
        if not (math.isfinite(number) and abs(number) <= MAX_ABS_REWARD):
            return f"{what} is {number!r}"
    return None


def refuse_bad_rewards(episodes: list[Episode]) -> int:
    """Turn every finished episode with a reward that is not a finite number within ±MAX_ABS_REWARD into a
    failed episode (``error`` names the episode, agent and value; the values are kept as text in
    ``info["refused_rewards"]`` and the rewards reset to 0.0). Returns how many episodes were refused.

    >>> ep = Episode(prompt_index=0, index=3, problem_id="p", reward=float("nan"))
    >>> refuse_bad_rewards([ep]), ep.reward, ep.error.split(";")[0]
    (1, 0.0, "reward refused: episode 3 (problem 'p'): its reward is nan")
    """
    refused = 0
    for ep in episodes:
        bad = _bad_reward(ep) if ep.error is None else None
        if bad is None:
            continue
        ep.error = (f"reward refused: episode {ep.index} (problem {ep.problem_id!r}): {bad}; rewards must be finite "
                    f"numbers within ±{MAX_ABS_REWARD:g}, so the episode is left out of the update")
        ep.info["refused_rewards"] = {"reward": repr(ep.reward),
                                      "agent_rewards": {a: repr(r) for a, r in ep.agent_rewards.items()},
                                      "step_rewards": {str(i): repr(r) for i, r in ep.step_rewards.items()}}
        ep.reward, ep.agent_rewards, ep.step_rewards = 0.0, {}, {}
        refused += 1
    return refused


def assign_advantages(episodes: list[Episode], *, estimator: adv_lib.Estimator, format_penalty: float, eps: float,
                      overlong_buffer: int = 0, overlong_penalty_max: float = 1.0,
                      max_tokens: dict[str, int] | None = None, reward_alloc: str = "none", alpha: float = 0.5,
                      beta: float = 0.5, baselines: dict[str, float] | None = None, rae_decay: float = 0.95,
                      game: str = "") -> list[Step]:
    """Fill ``step.reward`` and ``step.advantage`` for every step; returns the steps in order.

    Failed episodes (``episode.error``) are left out: their steps are not trained on.
    ``overlong_buffer`` > 0 adds DAPO's soft overlong penalty (up to ``overlong_penalty_max``) to
    replies within that many tokens of their agent's limit ``max_tokens[agent]``. ``reward_alloc``
    shapes tree node rewards first (:func:`teamrl.algos.credit.shape_tree_rewards` with ``alpha``, ``beta``).
    Under the ``tree`` scope a step's tree is ``step.tree``, or its episode when it has none.
    ``baselines``: the running (game, role) baselines of ``center="role_ema"`` (the ``rae`` preset), keyed
    ``"game/agent"`` with ``game`` and ``rae_decay``; updated in place.
    """
    steps, rewards = step_rewards(episodes, format_penalty=format_penalty, overlong_buffer=overlong_buffer,
                                  overlong_penalty_max=overlong_penalty_max, max_tokens=max_tokens,
                                  reward_alloc=reward_alloc, alpha=alpha, beta=beta)
    if not steps:
        return steps
    if estimator.center == "role_ema":
        if baselines is None:
            raise ValueError("the rae estimator keeps running baselines across steps; pass baselines (a dict)")
        keys = [f"{game}/{s.agent}" for s in steps]
        start: dict[Hashable, float] = {k: v for k, v in baselines.items()}  # noqa: C416 (widens the key type)
        adv, new = role_baseline_advantages(rewards, [(s.episode, s.agent) for s in steps], keys, start,
                                            decay=rae_decay)
        baselines.update({str(k): v for k, v in new.items()})
    else:
        adv = advantages_for(steps, rewards, estimator, eps=eps)
    for s, r, a in zip(steps, rewards.tolist(), adv.tolist()):
        s.reward, s.advantage = r, a
    return steps


def step_rewards(episodes: list[Episode], *, format_penalty: float, overlong_buffer: int = 0,
                 overlong_penalty_max: float = 1.0, max_tokens: dict[str, int] | None = None,
                 reward_alloc: str = "none", alpha: float = 0.5,
                 beta: float = 0.5) -> tuple[list[Step], torch.Tensor]:
    """The steps of the episodes that did not fail and each one's credited reward (float64 ``[N]``):
    :func:`credit`, minus the format penalty on invalid steps, shaped by ``reward_alloc`` (:func:`tree_shaped`),
    plus the overlong penalty."""
    episodes = [ep for ep in episodes if ep.error is None]
    steps = [s for ep in episodes for s in ep.steps]
    if not steps:
        return steps, torch.zeros(0, dtype=torch.float64)
    raw = torch.tensor([credit(ep, i) for ep in episodes for i in range(len(ep.steps))], dtype=torch.float64)
    valid = torch.tensor([s.valid for s in steps])
    rewards = adv_lib.apply_format_penalty(raw, valid, penalty=format_penalty)
    if reward_alloc != "none":
        rewards = tree_shaped(episodes, rewards, method=reward_alloc, alpha=alpha, beta=beta)
    if overlong_buffer > 0:
        if max_tokens is None or any(s.agent not in max_tokens for s in steps):
            raise ValueError("the overlong penalty needs max_tokens: the token limit of every agent")
        rewards = rewards + overlong_penalty(torch.tensor([len(s.response_ids) for s in steps]),
                                             torch.tensor([max_tokens[s.agent] for s in steps]),
                                             buffer=overlong_buffer, penalty=overlong_penalty_max)
    return steps, rewards


def tree_shaped(episodes: list[Episode], rewards: torch.Tensor, *, method: str, alpha: float,
                beta: float) -> torch.Tensor:
    """``rewards`` [N] of the steps of ``episodes`` (in order) shaped as MARTI's ``reward_alloc`` ``method``
    shapes a tree's node rewards (:func:`teamrl.algos.credit.shape_tree_rewards`): a tree is a step's (problem,
    ``step.tree``), or its episode when it has none; a node's parent is the step ``step.parent`` of its episode."""
    offsets, rows = [], 0
    for ep in episodes:
        offsets.append(rows)
        rows += len(ep.steps)
    steps = [s for ep in episodes for s in ep.steps]
    trees = adv_lib.group_ids_for("tree", prompt_ids=torch.tensor([s.prompt_index for s in steps]),
                                  agent_ids=torch.zeros(len(steps), dtype=torch.long),
                                  turn_ids=torch.zeros(len(steps), dtype=torch.long),
                                  tree_ids=torch.tensor([s.tree if s.tree >= 0 else s.episode for s in steps]))
    parents = torch.tensor([off + s.parent if s.parent >= 0 else -1
                            for ep, off in zip(episodes, offsets) for s in ep.steps])
    return shape_tree_rewards(rewards, trees, parents, method=method, alpha=alpha, beta=beta)


def advantages_for(steps: list[Step], rewards: torch.Tensor, estimator: adv_lib.Estimator, *, eps: float) -> torch.Tensor:
    """Advantages ``[N]`` of ``steps`` with rewards ``rewards`` ``[N]`` under ``estimator`` (its scope's groups,
    :func:`group_ids`)."""
    episode_ids = torch.tensor([s.episode for s in steps])
    return adv_lib.compute_advantages(rewards, group_ids(steps, estimator), episode_ids, unit=estimator.unit,
                                      center=estimator.center, scale=estimator.scale, eps=eps)


def group_ids(steps: list[Step], estimator: adv_lib.Estimator) -> torch.Tensor:
    """The advantage group of each step [N] under ``estimator.scope`` (per problem, per agent, per turn, per tree)."""
    agent_names = sorted({s.agent for s in steps})
    return adv_lib.group_ids_for(estimator.scope, prompt_ids=torch.tensor([s.prompt_index // estimator.pool for s in steps]),
                                 agent_ids=torch.tensor([agent_names.index(s.agent) for s in steps]),
                                 turn_ids=torch.tensor([s.agent_call for s in steps]),
                                 tree_ids=torch.tensor([s.tree if s.tree >= 0 else s.episode for s in steps]))


def credit(episode: Episode, index: int) -> float:
    """Reward credited to step ``index`` of ``episode``: its own, else its agent's, else the joint reward."""
    if index in episode.step_rewards:
        return episode.step_rewards[index]
    return episode.agent_rewards.get(episode.steps[index].agent, episode.reward)
