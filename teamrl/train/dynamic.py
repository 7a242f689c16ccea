"""Dynamic sampling in the training loop: drop the steps of advantage groups without reward variance,
and optionally roll out more problems until enough groups are left (DAPO, arXiv 2503.14476).

Groups are those of the estimator's scope (:func:`teamrl.train.scoring.group_ids`): per problem
for GRPO, per (problem, agent) for Dr. MAS, per tree for MARS2, so in a multi-agent scope one
agent's group can be dropped while a teammate's on the same problem is kept. Refill rounds sample
the next problems of the train split (the sampler's cursor moves on, so a resumed run samples the
same); their episodes join the step's transcripts and rollout metrics, numbered after the first
round's problems. The batch is not cut back to ``rollout.batch_size`` problems after a refill.

Leaves out: the group test itself (:func:`teamrl.algos.dynamic.informative`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from teamrl.algos.dynamic import informative
from teamrl.tasks.base import Problem
from teamrl.team.records import Episode, Step
from teamrl.train.scoring import group_ids

if TYPE_CHECKING:
    from teamrl.train.trainer import Trainer


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
