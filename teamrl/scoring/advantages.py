"""The ``advantages`` stages: every step's advantage from its reward, under the ``algo.estimator`` preset.

``group`` (every preset but ``rae`` and ``c3``): the preset's scope groups the steps (per problem, per agent, per
turn, per tree; :func:`group_ids`), and :func:`teamrl.algos.advantages.compute_advantages` centers and
scales each group with the preset's knobs; it keeps nothing across steps. ``c3`` (the ``branch`` scope of C3 on a
prefix tree of calls): each node's return minus its siblings' leave-one-out mean, z-scored among them
(:func:`teamrl.algos.c3.sibling_advantages`; its node returns: :mod:`teamrl.scoring.c3`). ``running_baseline`` (``rae``,
SPIRAL's role-conditioned advantage estimation): each agent's reward minus a running mean of that agent's
(role's) reward in this game (:func:`teamrl.algos.rae.role_baseline_advantages`), the means kept across
steps and in every checkpoint.

The preset is read here and nowhere else in the loop: the stage is built with its
:class:`~teamrl.algos.estimators.Estimator` and ``algo.group_pool``.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from teamrl.algos import advantages as adv_lib
from teamrl.algos.c3 import sibling_advantages, sibling_groups
from teamrl.algos.rae import role_baseline_advantages
from teamrl.scoring.stages import Context, Stage, register_stage
from teamrl.team.records import Step

if TYPE_CHECKING:
    from teamrl.team.registry import Capabilities, WorkflowSpec


def estimator_of(algo: Any) -> adv_lib.Estimator:
    """The :class:`~teamrl.algos.estimators.Estimator` of ``algo.estimator`` with ``algo.group_pool``."""
    return replace(adv_lib.get_estimator(algo.estimator), pool=algo.group_pool)


class Advantages(Stage):
    """An ``advantages`` stage: advantages ``[N]`` of the steps from their rewards ``[N]``."""

    kind = "advantages"
    estimator: adv_lib.Estimator
    eps: float

    @classmethod
    def build(cls, algo: Any, ctx: Context) -> Advantages:
        raise NotImplementedError

    @classmethod
    def active(cls, algo: Any) -> bool:
        try:
            return cls.uses(adv_lib.get_estimator(algo.estimator))
        except ValueError:  # an unknown preset: refused by errors()
            return cls.name == "group"

    @classmethod
    def uses(cls, estimator: adv_lib.Estimator) -> bool:
        """Whether this stage computes ``estimator``'s advantages."""
        raise NotImplementedError

    def compute(self, steps: list[Step], rewards: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


@register_stage
@dataclass
class GroupAdvantages(Advantages):
    """Group-normalized advantages (GRPO, Dr. MAS, AT-GRPO, MAGRPO, RLOO, ...): stateless."""

    estimator: adv_lib.Estimator
    eps: float
    name = "group"

    @classmethod
    def uses(cls, estimator: adv_lib.Estimator) -> bool:
        return estimator.center != "role_ema" and estimator.scope != "branch"

    @classmethod
    def build(cls, algo: Any, ctx: Context) -> GroupAdvantages:
        return cls(estimator_of(algo), algo.eps)

    @classmethod
    def errors(cls, algo: Any, caps: Capabilities, spec: WorkflowSpec | None) -> list[str]:
        """An unknown preset; AT-GRPO's groups without tree sampling; problems pooled under a tree scope."""
        try:
            adv_lib.get_estimator(algo.estimator)
        except ValueError as exc:  # its message (with a did-you-mean), as at every estimator lookup
            return [f"algo.estimator: {exc}"]
        errors = []
        if algo.estimator == "at_grpo" and not caps.tree_sampling:
            errors.append(f"algo.estimator: at_grpo groups the candidates of a tree-sampling workflow (env_single_tree, "
                          f"env_team_tree, code_team_tree), but workflow {caps.workflow!r} samples none; pick one of "
                          f"those, or algo.estimator: agent_turn for the (prompt, agent, turn) key without tree sampling")
        if algo.group_pool < 1:
            errors.append(f"algo.group_pool {algo.group_pool} must be >= 1 (1: one group per problem)")
        elif algo.group_pool > 1 and algo.estimator in ("at_grpo", "tree"):
            errors.append(f"algo.group_pool {algo.group_pool} pools problems, but algo.estimator {algo.estimator} groups "
                          f"by tree, which no two problems share; use algo.estimator: agent_turn for the pooled "
                          f"(problem // {algo.group_pool}, agent, turn) key")
        return errors

    def compute(self, steps: list[Step], rewards: torch.Tensor) -> torch.Tensor:
        return advantages_for(steps, rewards, self.estimator, eps=self.eps)


@register_stage
@dataclass
class RunningBaseline(Advantages):
    """SPIRAL's RAE (``algo.estimator: rae``): reward minus the running (game, role) baseline, kept across steps."""

    estimator: adv_lib.Estimator
    decay: float
    game: str
    baselines: dict[str, float] = field(default_factory=dict)
    """The running baselines, keyed ``"game/agent"``."""
    name = "running_baseline"

    @classmethod
    def uses(cls, estimator: adv_lib.Estimator) -> bool:
        return estimator.center == "role_ema"

    @classmethod
    def build(cls, algo: Any, ctx: Context) -> RunningBaseline:
        return cls(estimator_of(algo), algo.rae_decay, ctx.game)

    @classmethod
    def errors(cls, algo: Any, caps: Capabilities, spec: WorkflowSpec | None) -> list[str]:
        errors = []
        if algo.estimator == "rae" and (algo.dynamic_sampling or algo.group_filter != "none"):
            errors.append("algo.estimator rae does not combine with algo.dynamic_sampling or algo.group_filter "
                          "(they recompute group advantages over the kept steps); turn them off")
        if not 0.0 < algo.rae_decay < 1.0:
            errors.append(f"algo.rae_decay {algo.rae_decay} must be in (0, 1), e.g. 0.95 (SPIRAL's)")
        return errors

    def compute(self, steps: list[Step], rewards: torch.Tensor) -> torch.Tensor:
        keys = [f"{self.game}/{s.agent}" for s in steps]
        start: dict[Hashable, float] = {k: v for k, v in self.baselines.items()}  # noqa: C416 (widens the key type)
        adv, new = role_baseline_advantages(rewards, [(s.episode, s.agent) for s in steps], keys, start,
                                            decay=self.decay)
        self.baselines.update({str(k): v for k, v in new.items()})
        return adv

    def state_dict(self) -> dict[str, Any]:
        return {"baselines": dict(self.baselines)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.baselines = dict(state.get("baselines", {}))


@register_stage
@dataclass
class C3Advantages(GroupAdvantages):
    """C3's sibling advantages (the ``branch`` scope): leave-one-out baseline, then a z-score among siblings."""

    name = "c3"

    @classmethod
    def uses(cls, estimator: adv_lib.Estimator) -> bool:
        return estimator.scope == "branch"

    @classmethod
    def errors(cls, algo: Any, caps: Capabilities, spec: WorkflowSpec | None) -> list[str]:
        try:
            e, errors = estimator_of(algo), []
        except ValueError:  # an unknown preset: the group stage says so
            return []
        if not cls.uses(e):
            return []
        if e.unit != "step" or e.center not in ("leave_one_out", "mean", "none") or e.scale not in ("std", "none"):
            errors.append(f"algo.estimator {algo.estimator}: the branch scope takes unit step, center leave_one_out, "
                          f"mean or none and scale std or none, not {e}")
        if algo.dynamic_sampling or algo.group_filter != "none":
            errors.append(f"algo.estimator {algo.estimator} does not combine with algo.dynamic_sampling or "
                          f"algo.group_filter (they recompute group advantages over the kept steps); turn them off")
        if algo.group_pool != 1:
            errors.append(f"algo.group_pool {algo.group_pool}: algo.estimator {algo.estimator} groups siblings of "
                          f"one problem's tree; set algo.group_pool: 1")
        return errors

    @classmethod
    def config_errors(cls, cfg: Any) -> list[str]:
        if cls.active(cfg.algo) and not cfg.rollout.prefix_tree:
            return [f"algo.estimator {cfg.algo.estimator} credits the nodes of a prefix tree of calls; set "
                    f"rollout.prefix_tree (e.g. [2, 4] with rollout.group_size 8, C3's)"]
        return []

    def compute(self, steps: list[Step], rewards: torch.Tensor) -> torch.Tensor:
        groups = sibling_groups([s.prompt_index for s in steps], [s.branch for s in steps])
        return sibling_advantages(rewards, groups, baseline=self.estimator.center,
                                         normalize=self.estimator.scale == "std", eps=self.eps)


def advantages_for(steps: list[Step], rewards: torch.Tensor, estimator: adv_lib.Estimator, *, eps: float) -> torch.Tensor:
    """Advantages ``[N]`` of ``steps`` with rewards ``rewards`` ``[N]`` under ``estimator`` (its scope's groups,
    :func:`group_ids`)."""
    episode_ids = torch.tensor([s.episode for s in steps])
    return adv_lib.compute_advantages(rewards, group_ids(steps, estimator), episode_ids, unit=estimator.unit,
                                      center=estimator.center, scale=estimator.scale, eps=eps)


def group_ids(steps: list[Step], estimator: adv_lib.Estimator) -> torch.Tensor:
    """The advantage group of each step [N] under ``estimator.scope`` (per problem, per agent, per turn, per tree)."""
    agent_names = sorted({s.agent for s in steps})
    trees = (sibling_groups([s.prompt_index for s in steps], [s.branch for s in steps]) if estimator.scope == "branch"
             else torch.tensor([s.tree if s.tree >= 0 else s.episode for s in steps]))
    return adv_lib.group_ids_for(estimator.scope, prompt_ids=torch.tensor([s.prompt_index // estimator.pool for s in steps]),
                                 agent_ids=torch.tensor([agent_names.index(s.agent) for s in steps]),
                                 turn_ids=torch.tensor([s.agent_call for s in steps]), tree_ids=trees)
