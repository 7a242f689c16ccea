"""What the update trains on: DAPO's dynamic sampling (drop the steps of advantage groups without reward
variance, and optionally roll out more problems until enough groups are left; arXiv 2503.14476) or
PettingLLMs' group filter (``algo.group_filter``; docs/fidelity.md).

Groups are those of the estimator's scope (:func:`teamrl.train.scoring.group_ids`): per problem
for GRPO, per (problem, agent) for Dr. MAS, per tree for MARS2, so in a multi-agent scope one
agent's group can be dropped while a teammate's on the same problem is kept. Refill rounds sample
the next problems of the train split (the sampler's cursor moves on, so a resumed run samples the
same); their episodes join the step's transcripts and rollout metrics, numbered after the first
round's problems. The batch is not cut back to ``rollout.batch_size`` problems after a refill.

The group filter acts on each model's steps apart, as PettingLLMs filters each trainer's batch, and the
advantages of the steps it keeps are computed again on them (PettingLLMs filters before computing them;
for ``uid`` this changes the kept rows' group means and stds).

Leaves out: the group tests themselves (:mod:`teamrl.algos.dynamic`).
"""

from __future__ import annotations

from typing import Protocol

import torch

from teamrl.algos.advantages import Estimator
from teamrl.algos.dynamic import filter_groups, informative
from teamrl.config.schema import Config
from teamrl.tasks.base import Problem
from teamrl.team.records import Episode, Step
from teamrl.train.credit import NoCredit, ShapleyCredit
from teamrl.train.rollout import Rollout
from teamrl.train.sampler import ProblemSampler
from teamrl.train.scoring import advantages_for, group_ids


class Trainer(Protocol):
    """What step selection uses of the training loop (:class:`teamrl.train.trainer.Trainer` is one; typed here
    so that this module does not import the loop that calls it)."""

    cfg: Config
    estimator: Estimator
    rollout: Rollout
    progress: bool
    credit: NoCredit | ShapleyCredit

    @property
    def sampler(self) -> ProblemSampler: ...

    def _advantages(self, episodes: list[Episode]) -> list[Step]: ...


def keep_informative(steps: list[Step], trainer: Trainer) -> list[Step]:
    """The steps of ``steps`` whose advantage group has reward variance."""
    if not steps:
        return []
    keep = informative(torch.tensor([s.reward for s in steps], dtype=torch.float64), group_ids(steps, trainer.estimator))
    return [s for s, k in zip(steps, keep.tolist()) if k]


def informative_steps(trainer: Trainer, step: int, problems: list[Problem], episodes: list[Episode],
                      steps: list[Step]) -> tuple[list[Step], dict[str, float]]:
    """The steps to train on, after dropping uniform groups and refilling (``algo.dynamic_sampling_refill``).

    ``problems``, ``episodes`` and ``steps`` are extended in place with the refill rounds' own.

    Returns:
        (steps to train on, metrics ``dynamic/steps``, ``dynamic/steps_kept``, ``dynamic/steps_dropped``,
        ``dynamic/problems_kept``, ``dynamic/refill_rounds``).
    """
    cfg = trainer.cfg
    kept = keep_informative(steps, trainer)
    rounds = 0
    while rounds < cfg.algo.dynamic_sampling_refill and len({s.prompt_index for s in kept}) < cfg.rollout.batch_size:
        rounds += 1
        more = trainer.sampler.next(cfg.rollout.batch_size)
        new = trainer.rollout.collect(more, cfg.rollout.group_size, progress=trainer.progress)
        trainer.credit.assign(new, more, step=step)
        offset = len(problems)
        for ep in new:  # numbered after the problems already in this step
            ep.prompt_index += offset
            for s in ep.steps:
                s.prompt_index += offset
        problems.extend(more)
        episodes.extend(new)
        new_steps = trainer._advantages(new)
        steps.extend(new_steps)
        kept += keep_informative(new_steps, trainer)
    return kept, {"dynamic/steps": float(len(steps)), "dynamic/steps_kept": float(len(kept)),
                  "dynamic/steps_dropped": float(len(steps) - len(kept)),
                  "dynamic/problems_kept": float(len({s.prompt_index for s in kept})),
                  "dynamic/refill_rounds": float(rounds)}


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


def select_steps(trainer: Trainer, step: int, problems: list[Problem], episodes: list[Episode],
                 steps: list[Step]) -> tuple[list[Step], dict[str, float]]:
    """The steps the update trains on: all of them, those of dynamic sampling (:func:`informative_steps`) or
    those of the group filter (:func:`filter_steps`); the config allows at most one of the two."""
    algo = trainer.cfg.algo
    if algo.dynamic_sampling:
        return informative_steps(trainer, step, problems, episodes, steps)
    if algo.group_filter != "none":
        return filter_steps(steps, trainer.estimator, method=algo.group_filter, ratio=algo.group_filter_ratio,
                            eps=algo.eps)
    return steps, {}
