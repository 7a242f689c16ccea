"""The ``selection`` stages, what the update trains on: every step (``all``), DAPO's dynamic sampling (drop the steps of advantage groups without reward
variance, and optionally roll out more problems until enough groups are left; arXiv 2503.14476) or
PettingLLMs' group filter (``algo.group_filter``; docs/fidelity.md).

Groups are those of the estimator's scope (:func:`teamrl.scoring.advantages.group_ids`): per problem
for GRPO, per (problem, agent) for Dr. MAS, per tree for MARS2, so in a multi-agent scope one
agent's group can be dropped while a teammate's on the same problem is kept. Refill rounds sample
the next problems of the train split (the sampler's cursor moves on, so a resumed run samples the
same); their episodes join the step's transcripts and rollout metrics, numbered after the first
round's problems. The batch is not cut back to ``rollout.batch_size`` problems after a refill. A refill
round gets two callables, never the trainer: ``collect`` (the loop's: the next problems, rolled out) and
``rescore`` (the :class:`~teamrl.scoring.scorer.Scorer`'s: credit, reward terms and advantages).

The group filter acts on each model's steps apart, as PettingLLMs filters each trainer's batch, and the
advantages of the steps it keeps are computed again on them (PettingLLMs filters before computing them;
for ``uid`` this changes the kept rows' group means and stds).

Leaves out: the group tests themselves (:mod:`teamrl.algos.dynamic`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from teamrl.algos.advantages import Estimator
from teamrl.algos.dynamic import filter_groups, informative
from teamrl.scoring.advantages import advantages_for, estimator_of, group_ids
from teamrl.scoring.stages import Context, Stage, register_stage
from teamrl.tasks.base import Problem
from teamrl.team.records import Episode, Step

if TYPE_CHECKING:
    from teamrl.team.registry import Capabilities, WorkflowSpec

Collect = Callable[[], tuple[list[Problem], list[Episode]]]
"""Roll out the next ``rollout.batch_size`` problems of the train split: (problems, their episodes)."""
Rescore = Callable[[list[Episode], list[Problem]], list[Step]]
"""Credit, reward terms and advantages of new episodes of this step (numbered after the step's problems)."""


@dataclass
class Batch:
    """One training step's problems, episodes and scored steps; a refill extends all three in place."""

    problems: list[Problem]
    episodes: list[Episode]
    steps: list[Step]


class Selection(Stage):
    """A ``selection`` stage: the steps the update trains on."""

    kind = "selection"

    @classmethod
    def build(cls, algo: Any, ctx: Context, batch_size: int) -> Selection:
        raise NotImplementedError

    def select(self, batch: Batch, collect: Collect, rescore: Rescore) -> tuple[list[Step], dict[str, float]]:
        """(steps to train on, metrics)."""
        raise NotImplementedError


@register_stage
@dataclass
class DynamicSampling(Selection):
    """DAPO's dynamic sampling (``algo.dynamic_sampling``), with ``algo.dynamic_sampling_refill`` extra rounds."""

    estimator: Estimator
    refill: int
    batch_size: int
    name = "dynamic_sampling"

    @classmethod
    def active(cls, algo: Any) -> bool:
        return bool(algo.dynamic_sampling)

    @classmethod
    def build(cls, algo: Any, ctx: Context, batch_size: int) -> DynamicSampling:
        return cls(estimator_of(algo), algo.dynamic_sampling_refill, batch_size)

    @classmethod
    def errors(cls, algo: Any, caps: Capabilities, spec: WorkflowSpec | None) -> list[str]:
        if algo.dynamic_sampling_refill < 0 or (algo.dynamic_sampling_refill and not algo.dynamic_sampling):
            return [f"algo.dynamic_sampling_refill {algo.dynamic_sampling_refill} must be >= 0 and needs "
                    f"algo.dynamic_sampling: true"]
        return []

    def select(self, batch: Batch, collect: Collect, rescore: Rescore) -> tuple[list[Step], dict[str, float]]:
        """The steps of informative groups; while fewer than ``batch_size`` problems have one and refill rounds are
        left, the next problems are rolled out, credited, scored and added to ``batch``.

        Returns:
            (steps to train on, metrics ``dynamic/steps``, ``dynamic/steps_kept``, ``dynamic/steps_dropped``,
            ``dynamic/problems_kept``, ``dynamic/refill_rounds``).
        """
        kept = keep_informative(batch.steps, self.estimator)
        rounds = 0
        while rounds < self.refill and len({s.prompt_index for s in kept}) < self.batch_size:
            rounds += 1
            more, new = collect()
            new_steps = rescore(new, more)  # numbers them after the problems already in this step
            batch.problems.extend(more)
            batch.episodes.extend(new)
            batch.steps.extend(new_steps)
            kept += keep_informative(new_steps, self.estimator)
        steps = batch.steps
        return kept, {"dynamic/steps": float(len(steps)), "dynamic/steps_kept": float(len(kept)),
                      "dynamic/steps_dropped": float(len(steps) - len(kept)),
                      "dynamic/problems_kept": float(len({s.prompt_index for s in kept})),
                      "dynamic/refill_rounds": float(rounds)}


@register_stage
@dataclass
class GroupFilter(Selection):
    """PettingLLMs' group filter (``algo.group_filter``, :func:`filter_steps`)."""

    estimator: Estimator
    method: str
    ratio: float
    eps: float
    name = "group_filter"

    @classmethod
    def active(cls, algo: Any) -> bool:
        return bool(algo.group_filter != "none")

    @classmethod
    def build(cls, algo: Any, ctx: Context, batch_size: int) -> GroupFilter:
        return cls(estimator_of(algo), algo.group_filter, algo.group_filter_ratio, algo.eps)

    @classmethod
    def errors(cls, algo: Any, caps: Capabilities, spec: WorkflowSpec | None) -> list[str]:
        errors = []
        if algo.group_filter in ("mean", "std", "uid") and not 0.0 < algo.group_filter_ratio <= 1.0:
            errors.append(f"algo.group_filter_ratio {algo.group_filter_ratio} must be in (0, 1] with algo.group_filter: "
                          f"{algo.group_filter} (the fraction it drops; PettingLLMs' configs use 0.5)")
        elif algo.group_filter in ("none", "dapo") and algo.group_filter_ratio != 0.0:
            errors.append(f"algo.group_filter_ratio has no effect with algo.group_filter: {algo.group_filter}; remove "
                          f"it, or pick mean, std or uid")
        if algo.group_filter != "none" and algo.dynamic_sampling:
            errors.append(f"algo.group_filter: {algo.group_filter} and algo.dynamic_sampling both drop steps before the "
                          f"update; use one of them (group_filter: dapo is dynamic_sampling without refill)")
        return errors

    def select(self, batch: Batch, collect: Collect, rescore: Rescore) -> tuple[list[Step], dict[str, float]]:
        return filter_steps(batch.steps, self.estimator, method=self.method, ratio=self.ratio, eps=self.eps)


@register_stage
class AllSteps(Selection):
    """Every scored step (neither dynamic sampling nor a group filter)."""

    name = "all"

    @classmethod
    def active(cls, algo: Any) -> bool:
        return not algo.dynamic_sampling and algo.group_filter == "none"

    @classmethod
    def build(cls, algo: Any, ctx: Context, batch_size: int) -> AllSteps:
        return cls()

    def select(self, batch: Batch, collect: Collect, rescore: Rescore) -> tuple[list[Step], dict[str, float]]:
        return batch.steps, {}


def keep_informative(steps: list[Step], estimator: Estimator) -> list[Step]:
    """The steps of ``steps`` whose advantage group has reward variance."""
    if not steps:
        return []
    keep = informative(torch.tensor([s.reward for s in steps], dtype=torch.float64), group_ids(steps, estimator))
    return [s for s, k in zip(steps, keep.tolist()) if k]


def filter_steps(steps: list[Step], estimator: Estimator, *, method: str, ratio: float,
                 eps: float) -> tuple[list[Step], dict[str, float]]:
    """The steps PettingLLMs' group filter ``method`` keeps (:func:`teamrl.algos.dynamic.filter_groups`, on each
    model's steps apart), their advantages computed again over what is kept.

    Returns:
        (steps to train on, metrics ``filter/steps``, ``filter/steps_kept``, ``filter/steps_dropped``).
    """
    if not steps:
        return [], {"filter/steps": 0.0, "filter/steps_kept": 0.0, "filter/steps_dropped": 0.0}
    groups = group_ids(steps, estimator)
    rewards = torch.tensor([s.reward for s in steps], dtype=torch.float64)
    keep = torch.zeros(len(steps), dtype=torch.bool)
    for model in sorted({s.model for s in steps}):
        rows = torch.tensor([i for i, s in enumerate(steps) if s.model == model])
        order: dict[int, int] = {}
        for k in groups[rows].tolist():  # this model's groups, numbered in order of first appearance (tie order)
            order.setdefault(k, len(order))
        mine = torch.tensor([order[k] for k in groups[rows].tolist()])  # [n]
        keep[rows] = filter_groups(rewards[rows], mine, method=method, ratio=ratio)
    kept = [s for s, k in zip(steps, keep.tolist()) if k]
    if kept:
        adv = advantages_for(kept, torch.tensor([s.reward for s in kept], dtype=torch.float64), estimator, eps=eps)
        for s, a in zip(kept, adv.tolist()):
            s.advantage = a
    return kept, {"filter/steps": float(len(steps)), "filter/steps_kept": float(len(kept)),
                  "filter/steps_dropped": float(len(steps) - len(kept))}
