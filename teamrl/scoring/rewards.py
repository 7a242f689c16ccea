"""The ``rewards`` stages: from a step's credited reward to the reward its advantage is computed from.

A step's credited reward (:func:`credit`) is its own when the workflow recorded one, else its agent's when
the workflow (or a credit stage) gives per-agent rewards, else the joint episode reward. The active reward
terms then apply in their order: the format penalty on invalid steps (:class:`FormatPenalty`), MARTI's
``reward_alloc`` shaping along a search tree (:class:`TreeShaping`,
:func:`teamrl.algos.credit.shape_tree_rewards`), DAPO's overlong penalty (:class:`OverlongPenalty`,
:func:`teamrl.algos.credit.overlong_penalty`).

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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from teamrl.algos import advantages as adv_lib
from teamrl.algos.credit import overlong_penalty, shape_tree_rewards
from teamrl.scoring.stages import Context, Stage, active_stages, register_stage
from teamrl.team.records import Episode, Step

if TYPE_CHECKING:
    from teamrl.team.registry import Capabilities, WorkflowSpec

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


class RewardTerm(Stage):
    """A ``rewards`` stage: maps the rewards ``[N]`` (float64) of the steps of the finished episodes to new ones."""

    kind = "rewards"

    @classmethod
    def build(cls, algo: Any, ctx: Context) -> RewardTerm:
        raise NotImplementedError

    def apply(self, episodes: list[Episode], steps: list[Step], rewards: torch.Tensor) -> torch.Tensor:
        """The rewards after this term; ``steps`` are those of ``episodes`` in order."""
        raise NotImplementedError


@register_stage
@dataclass
class FormatPenalty(RewardTerm):
    """``algo.format_penalty`` subtracted from every step whose reply broke its agent's format
    (:func:`teamrl.algos.advantages.apply_format_penalty`); 0 changes nothing."""

    penalty: float
    name = "format_penalty"
    order = 0

    @classmethod
    def active(cls, algo: Any) -> bool:
        return True

    @classmethod
    def build(cls, algo: Any, ctx: Context) -> FormatPenalty:
        return cls(algo.format_penalty)

    def apply(self, episodes: list[Episode], steps: list[Step], rewards: torch.Tensor) -> torch.Tensor:
        return adv_lib.apply_format_penalty(rewards, torch.tensor([s.valid for s in steps]), penalty=self.penalty)


@register_stage
@dataclass
class TreeShaping(RewardTerm):
    """MARTI's ``reward_alloc`` (``algo.reward_alloc``): each node reward of a search tree shaped by its tree's
    (:func:`tree_shaped`)."""

    method: str
    alpha: float
    beta: float
    name = "reward_alloc"
    order = 10

    @classmethod
    def active(cls, algo: Any) -> bool:
        return bool(algo.reward_alloc.name != "none")

    @classmethod
    def build(cls, algo: Any, ctx: Context) -> TreeShaping:
        ra = algo.reward_alloc
        return cls(ra.name, ra.alpha, ra.beta)

    @classmethod
    def errors(cls, algo: Any, caps: Capabilities, spec: WorkflowSpec | None) -> list[str]:
        ra, errors = algo.reward_alloc, []
        if not ra.alpha >= 0:
            errors.append(f"algo.reward_alloc.alpha {ra.alpha} must be >= 0 (MARTI's default 0.5)")
        if not 0 <= ra.beta <= 1:
            errors.append(f"algo.reward_alloc.beta {ra.beta} must be in [0, 1] (MARTI's default 0.5)")
        if ra.name != "none" and not caps.search_tree:
            errors.append(f"algo.reward_alloc.name: {ra.name} shapes the node rewards of a search tree, but workflow "
                          f"{caps.workflow!r} grows none; use math_tree or code_tree, or reward_alloc.name: none")
        if ra.name == "none" and (ra.alpha, ra.beta) != (0.5, 0.5):
            errors.append("algo.reward_alloc.alpha and beta apply to a shaping; set algo.reward_alloc.name (margin or "
                          "tree) or remove them")
        return errors

    def apply(self, episodes: list[Episode], steps: list[Step], rewards: torch.Tensor) -> torch.Tensor:
        return tree_shaped(episodes, rewards, method=self.method, alpha=self.alpha, beta=self.beta)


@register_stage
@dataclass
class OverlongPenalty(RewardTerm):
    """DAPO's soft overlong penalty (``algo.overlong_buffer`` > 0): a reply within ``buffer`` tokens of its agent's
    ``max_new_tokens`` loses up to ``penalty``, linearly (:func:`teamrl.algos.credit.overlong_penalty`)."""

    buffer: int
    penalty: float
    max_tokens: dict[str, int] | None
    name = "overlong_penalty"
    order = 20

    @classmethod
    def active(cls, algo: Any) -> bool:
        return bool(algo.overlong_buffer > 0)

    @classmethod
    def build(cls, algo: Any, ctx: Context) -> OverlongPenalty:
        return cls(algo.overlong_buffer, algo.overlong_penalty, ctx.max_tokens)

    @classmethod
    def errors(cls, algo: Any, caps: Capabilities, spec: WorkflowSpec | None) -> list[str]:
        if algo.overlong_buffer < 0 or algo.overlong_penalty < 0:
            return [f"algo.overlong_buffer {algo.overlong_buffer} and algo.overlong_penalty {algo.overlong_penalty} "
                    f"must be >= 0"]
        if algo.overlong_buffer == 0 and algo.overlong_penalty != 1.0:
            return ["algo.overlong_penalty has no effect while algo.overlong_buffer is 0; set a buffer (tokens) too"]
        return []

    def apply(self, episodes: list[Episode], steps: list[Step], rewards: torch.Tensor) -> torch.Tensor:
        if self.max_tokens is None or any(s.agent not in self.max_tokens for s in steps):
            raise ValueError("the overlong penalty needs max_tokens: the token limit of every agent")
        return rewards + overlong_penalty(torch.tensor([len(s.response_ids) for s in steps]),
                                          torch.tensor([self.max_tokens[s.agent] for s in steps]),
                                          buffer=self.buffer, penalty=self.penalty)


def reward_terms(algo: Any, ctx: Context) -> list[RewardTerm]:
    """The active reward terms of ``algo``, built, in their order."""
    return [cls.build(algo, ctx) for cls in active_stages("rewards", algo)]  # type: ignore[attr-defined]


def step_rewards(episodes: list[Episode], terms: list[RewardTerm]) -> tuple[list[Step], torch.Tensor]:
    """The steps of the episodes that did not fail and each one's reward (float64 ``[N]``): :func:`credit`, then
    every term of ``terms`` in order."""
    episodes = [ep for ep in episodes if ep.error is None]
    steps = [s for ep in episodes for s in ep.steps]
    if not steps:
        return steps, torch.zeros(0, dtype=torch.float64)
    rewards = torch.tensor([credit(ep, i) for ep in episodes for i in range(len(ep.steps))], dtype=torch.float64)
    for term in terms:
        rewards = term.apply(episodes, steps, rewards)
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


def credit(episode: Episode, index: int) -> float:
    """Reward credited to step ``index`` of ``episode``: its own, else its agent's, else the joint reward."""
    if index in episode.step_rewards:
        return episode.step_rewards[index]
    return episode.agent_rewards.get(episode.steps[index].agent, episode.reward)
