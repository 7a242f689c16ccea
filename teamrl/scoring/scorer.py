"""The scorer: one object between rollout and update, built once from ``cfg.algo``.

:meth:`Scorer.score` runs the stages in order on a step's episodes::

    refuse bad rewards -> credit -> refuse bad rewards -> reward terms -> advantages -> selection
    -> advantage terms (of the trained steps)

and returns the scored steps, the steps the update trains on and the metrics of every stage. Which stage
of each kind runs is decided when the scorer is built (:func:`teamrl.scoring.stages.active_stages`), so
``score`` reads top to bottom with no branch on a config string.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from teamrl.scoring.advantages import Advantages
from teamrl.scoring.c3 import tree_metrics
from teamrl.scoring.credit import Credit
from teamrl.scoring.rewards import RewardTerm, refuse_bad_rewards, reward_terms, step_rewards
from teamrl.scoring.selection import Batch, Collect, Selection
from teamrl.scoring.stages import Context, active_stages
from teamrl.tasks.base import Problem
from teamrl.team.records import Episode, Step

__all__ = ["Scored", "Scorer", "assign", "score_steps"]


class Scored(NamedTuple):
    """What :meth:`Scorer.score` returns."""

    steps: list[Step]
    """Every step of the finished episodes, with its reward and advantage (refill rounds' included)."""
    trained: list[Step]
    """The steps the update trains on (the selection stage's)."""
    metrics: dict[str, float]


@dataclass
class Scorer:
    """Credit, reward terms, advantages, selection and advantage terms, each a registered stage
    (:mod:`teamrl.scoring.stages`)."""

    credit: Credit
    terms: list[RewardTerm]
    advantages: Advantages
    selection: Selection
    token_terms: list[Any] = field(default_factory=list)
    """The active ``advantage_terms`` stages (on-policy distillation), applied to the trained steps."""

    @classmethod
    def build(cls, algo: Any, ctx: Context, *, batch_size: int = 1) -> Scorer:
        """The stages ``algo`` (``cfg.algo``) turns on, built with ``ctx``; ``batch_size``: problems a refill rolls
        out (``rollout.batch_size``)."""
        credit = active_stages("credit", algo)[0].build(algo, ctx)  # type: ignore[attr-defined]
        advantages = active_stages("advantages", algo)[0].build(algo, ctx)  # type: ignore[attr-defined]
        chosen = active_stages("selection", algo)
        selection = chosen[0].build(algo, ctx, batch_size)  # type: ignore[attr-defined]
        token_terms = [c.build(algo, ctx) for c in active_stages("advantage_terms", algo)]  # type: ignore[attr-defined]
        return cls(credit, reward_terms(algo, ctx), advantages, selection, token_terms)

    def score(self, episodes: list[Episode], problems: list[Problem], step: int,
              collect: Collect | None = None) -> Scored:
        """Score training step ``step``'s ``episodes`` of ``problems`` (both extended in place by a refill, which
        rolls out through ``collect``).

        Metrics: the credit, selection and advantage-term stages' own, C3's diagnostics on a prefix-tree rollout
        (:func:`teamrl.scoring.c3.tree_metrics`), ``rollout/refused_rewards`` (episodes whose
        reward was not a finite number), ``perf/credit_s`` (seconds of the credit stage, the engines' reruns
        included) and, with an advantage-term stage, ``perf/advantage_terms_s`` (a teacher's forwards).
        """
        refused = refuse_bad_rewards(episodes)  # a NaN or 1e308 reward fails its episode, not the run
        t0 = time.perf_counter()
        metrics = self.credit.assign(episodes, problems, step=step)
        credit_s = time.perf_counter() - t0
        refused += refuse_bad_rewards(episodes)
        steps = self.rewards_and_advantages(episodes)
        counts = {"refused": float(refused)}

        def rescore(new: list[Episode], more: list[Problem]) -> list[Step]:
            self.credit.assign(new, more, step=step)
            counts["refused"] += refuse_bad_rewards(new)
            offset = len(problems)
            for ep in new:  # numbered after the problems already in this step
                ep.prompt_index += offset
                for s in ep.steps:
                    s.prompt_index += offset
            return self.rewards_and_advantages(new)

        trained, chosen = self.selection.select(Batch(problems, episodes, steps), collect or _no_refill, rescore)
        chosen |= tree_metrics(episodes, steps)  # C3's diagnostics, when the episodes form prefix trees
        if self.token_terms:
            t1 = time.perf_counter()
            for term in self.token_terms:
                chosen |= term.apply(trained)
            chosen["perf/advantage_terms_s"] = time.perf_counter() - t1
        return Scored(steps, trained, metrics | chosen | {"rollout/refused_rewards": counts["refused"],
                                                          "perf/credit_s": credit_s})

    def rewards_and_advantages(self, episodes: list[Episode]) -> list[Step]:
        """Fill ``step.reward`` and ``step.advantage`` of every step of the finished ``episodes`` (the reward terms,
        then the advantages stage, :func:`assign`); returns those steps in order."""
        return assign(episodes, self.terms, self.advantages)

    def state_dict(self) -> dict[str, Any]:
        """Every stage's state across steps (the running baselines of RAE), by kind."""
        return {"credit": self.credit.state_dict(), "advantages": self.advantages.state_dict(),
                "selection": self.selection.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.credit.load_state_dict(state.get("credit", {}))
        self.advantages.load_state_dict(state.get("advantages", {}))
        self.selection.load_state_dict(state.get("selection", {}))


def _no_refill() -> tuple[list[Problem], list[Episode]]:
    raise ValueError("dynamic sampling's refill rolls out more problems; pass collect to Scorer.score")


def score_steps(episodes: list[Episode], algo: Any, ctx: Context | None = None) -> list[Step]:
    """Rewards and advantages of every step of recorded ``episodes`` under ``algo`` (an
    :class:`~teamrl.config.sections.AlgoConfig`): its reward terms and advantages stage, no credit and no
    selection; returns the steps in order (what :meth:`Scorer.rewards_and_advantages` does in a run).

    >>> from teamrl.config.sections import AlgoConfig
    >>> eps = [Episode(prompt_index=0, index=i, problem_id="p", reward=r) for i, r in enumerate([1.0, 0.0])]
    >>> for ep in eps:
    ...     ep.steps.append(Step(0, ep.index, "solver", 0, "m", [1], [2], [-0.1], 1.0, "x", True))
    >>> [round(s.advantage, 4) for s in score_steps(eps, AlgoConfig(estimator="grpo"))]
    [0.7071, -0.7071]
    """
    ctx = ctx or Context()
    advantages = active_stages("advantages", algo)[0].build(algo, ctx)  # type: ignore[attr-defined]
    return assign(episodes, reward_terms(algo, ctx), advantages)


def assign(episodes: list[Episode], terms: list[RewardTerm], advantages: Advantages) -> list[Step]:
    """Fill ``step.reward`` (``terms`` in order) and ``step.advantage`` (``advantages``) of every step of the
    finished ``episodes``; returns those steps in order. Failed episodes' steps are left out."""
    steps, rewards = step_rewards(episodes, terms)
    if not steps:
        return steps
    adv = advantages.compute(steps, rewards)
    for s, r, a in zip(steps, rewards.tolist(), adv.tolist()):
        s.reward, s.advantage = r, a
    return steps
