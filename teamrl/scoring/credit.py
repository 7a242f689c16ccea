"""The ``credit`` stages: ``none`` (the workflow's rewards) and Shapley credit (SHARP, https://arxiv.org/abs/2602.08335).

Shapley credit: for each finished episode, the players are the agents that made at least one call. A coalition's
value v(S) is the task's score of the answer the team would have given with only S taking part:

  * v(all players) = the episode's own reward (no extra call);
  * other coalitions, ``counterfactual: workflow``: the workflow's own counterfactual (for
    ``math_team`` it is read off the recorded episode, so it costs no generation);
  * ``counterfactual: rerun``: the workflow runs again on the problem with every agent outside S
    masked: asking it returns the workflow's neutral reply for it, with no model call. Agents in S
    generate anew through the same dispatcher (batched across episodes).

Each distinct counterfactual answer is scored once per episode. Credits come from
:func:`teamrl.algos.credit.shapley_values` (exact up to ``exact_max_agents`` players, else
``samples`` seeded orderings) and become the agents' rewards,
``global_weight * R + credit_weight * phi_agent`` (SHARP's broadcast reward plus marginal credit),
which any advantage preset then normalizes. The cost is logged every step: ``credit/rescoring_calls``,
``credit/extra_generations``, ``credit/extra_tokens``, ``credit/coalitions``.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from teamrl.algos.credit import coalitions_needed, sample_orderings, shapley_values
from teamrl.scoring.stages import Context, Stage, register_stage
from teamrl.tasks.base import Problem, safe_score
from teamrl.team.records import Episode
from teamrl.team.team import Team

if TYPE_CHECKING:
    from teamrl.team.registry import Capabilities, WorkflowSpec
    from teamrl.train.rollout import Rollout

log = logging.getLogger(__name__)


class Credit(Stage):
    """A ``credit`` stage: sets rewards on the finished episodes of a rollout, before any reward term."""

    kind = "credit"

    @classmethod
    def build(cls, algo: Any, ctx: Context) -> Credit:
        """The stage for ``algo`` (``cfg.algo``) in ``ctx``."""
        raise NotImplementedError

    def assign(self, episodes: list[Episode], problems: list[Problem], *, step: int) -> dict[str, float]:
        """Set the rewards credit gives (in place); returns its metrics."""
        raise NotImplementedError


@register_stage
class NoCredit(Credit):
    """``algo.credit: none``: the workflow's rewards are used as they are."""

    name = "none"

    @classmethod
    def active(cls, algo: Any) -> bool:
        return bool(algo.credit == "none")

    @classmethod
    def build(cls, algo: Any, ctx: Context) -> NoCredit:
        return cls()

    def assign(self, episodes: list[Episode], problems: list[Problem], *, step: int) -> dict[str, float]:
        return {}


@register_stage
@dataclass
class ShapleyCredit(Credit):
    """``algo.credit: shapley``: per-agent rewards from Shapley values of counterfactual coalitions."""

    name: ClassVar[str] = "shapley"

    rollout: Rollout
    counterfactual: str
    """``workflow`` (the workflow's own coalition answer) or ``rerun`` (run the workflow with agents masked)."""
    exact_max_agents: int
    samples: int
    seed: int
    global_weight: float = 1.0
    credit_weight: float = 1.0
    _counts: dict[str, float] = field(default_factory=dict)

    @classmethod
    def active(cls, algo: Any) -> bool:
        return bool(algo.credit == "shapley")

    @classmethod
    def build(cls, algo: Any, ctx: Context) -> ShapleyCredit:
        o = algo.shapley
        return cls(ctx.rollout, o.counterfactual, o.exact_max_agents, o.samples, o.seed, o.global_weight,
                   o.credit_weight)

    @classmethod
    def errors(cls, algo: Any, caps: Capabilities, spec: WorkflowSpec | None) -> list[str]:
        """Options of Shapley credit without it; per-step rewards that would override its per-agent ones; a
        ``workflow`` counterfactual the workflow does not define."""
        errors = []
        if algo.credit != "shapley" and algo.shapley != type(algo.shapley)():
            errors.append("algo.shapley options apply to algo.credit: shapley; set algo.credit: shapley or remove them")
        if algo.credit == "shapley":
            if caps.per_step_rewards:
                errors.append(f"algo.credit: shapley sets per-agent rewards, but workflow {caps.workflow!r} is "
                              f"configured with per-step rewards, which would override them; use its joint reward "
                              f"(workflow.math_team.reward: joint, workflow.math_tree.reward: tree) or algo.credit: none")
            if algo.shapley.counterfactual == "workflow" and spec is not None and spec.counterfactual is None:
                errors.append(f"algo.shapley.counterfactual: workflow {caps.workflow!r} has no counterfactual of its "
                              f"own; set algo.shapley.counterfactual: rerun (re-runs the workflow with masked agents)")
        return errors

    def __post_init__(self) -> None:
        spec = self.rollout.workflow
        if self.counterfactual == "workflow" and spec.counterfactual is None:
            raise ValueError("the workflow has no counterfactual of its own; set algo.shapley.counterfactual=rerun")
        if self.counterfactual not in ("workflow", "rerun"):
            raise ValueError(f"counterfactual {self.counterfactual!r} must be 'workflow' or 'rerun'")

    def assign(self, episodes: list[Episode], problems: list[Problem], *, step: int) -> dict[str, float]:
        """Set ``agent_rewards`` of every finished episode; returns cost and credit metrics."""
        self._counts = {"rescoring_calls": 0.0, "extra_generations": 0.0, "extra_tokens": 0.0, "coalitions": 0.0,
                        "sampled_episodes": 0.0}
        done = [ep for ep in episodes if ep.error is None]
        for ep in done:
            if ep.step_rewards:
                raise ValueError("Shapley credit sets per-agent rewards, but the workflow recorded per-step rewards "
                                 "that would take precedence; use the workflow's joint reward "
                                 "(e.g. workflow.math_team.reward=joint, workflow.math_tree.reward=tree)")
        credits = self.rollout.dispatcher.run([self._episode(ep, problems[ep.prompt_index], step) for ep in done])
        out = {f"credit/{k}": v for k, v in self._counts.items()}
        by_agent: dict[str, list[float]] = {}
        for phi in credits:
            for agent, c in (phi or {}).items():
                by_agent.setdefault(agent, []).append(c)
        out |= {f"agent/{a}/shapley_mean": statistics.fmean(v) for a, v in sorted(by_agent.items())}
        return out

    async def _episode(self, ep: Episode, problem: Problem, step: int) -> dict[str, float] | None:
        players = sorted({s.agent for s in ep.steps})
        if not players:
            return None
        n = len(players)
        orderings = None
        if n > self.exact_max_agents:
            orderings = sample_orderings(n, self.samples, seed=(self.seed * 1_000_003 + step) * 1_000_003 + ep.index)
            self._counts["sampled_episodes"] += 1
        full = frozenset(range(n))
        scores = {ep.final or "": ep.reward}  # each distinct answer is scored once

        async def value(c: frozenset[int]) -> float:
            if c == full:
                return ep.reward
            answer = await self._answer(ep, problem, frozenset(players[i] for i in c)) or ""
            if answer not in scores:
                scores[answer] = safe_score(self.rollout.task, problem, answer)
                self._counts["rescoring_calls"] += 1
            return scores[answer]

        needed = coalitions_needed(n, orderings)
        try:
            values = dict(zip(needed, await asyncio.gather(*(value(c) for c in needed))))
        except Exception as exc:  # a rerun failed: the episode is left out like any failed episode
            ep.error = f"Shapley credit failed on problem {problem.id!r} (episode {ep.index}): {type(exc).__name__}: {exc}"
            log.warning("%s", ep.error)
            return None
        self._counts["coalitions"] += len(needed) - 1
        phi = dict(zip(players, shapley_values(n, values.__getitem__, orderings)))
        ep.info["shapley"] = phi
        ep.agent_rewards = {a: self.global_weight * ep.reward + self.credit_weight * c for a, c in phi.items()}
        return phi

    async def _answer(self, ep: Episode, problem: Problem, coalition: frozenset[str]) -> str | None:
        """The team's final answer with only ``coalition`` taking part; model calls are counted."""
        spec, ro = self.rollout.workflow, self.rollout
        scratch = Episode(prompt_index=ep.prompt_index, index=ep.index, problem_id=ep.problem_id)
        players = {s.agent for s in ep.steps}
        masked = {a: spec.neutral.get(a, "") for a in players if a not in coalition}
        team = Team(ro.bindings, ro.dispatcher, scratch, masked=masked)
        if self.counterfactual == "workflow":
            if spec.counterfactual is None:  # refused when the config was loaded; here for a config built by hand
                raise ValueError("algo.shapley.counterfactual: this workflow has no counterfactual of its own; "
                                 "set algo.shapley.counterfactual: rerun")
            answer = await spec.counterfactual(team, problem, ro.task, ro.workflow_cfg, ep, coalition)
        else:
            answer = await spec.fn(team, problem, ro.task, ro.workflow_cfg)
        self._counts["extra_generations"] += len(scratch.steps)
        self._counts["extra_tokens"] += sum(len(s.response_ids) for s in scratch.steps)
        return answer


