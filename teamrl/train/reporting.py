"""What the training loop writes each step besides the update: the metrics of a rollout, an evaluation and an
update (rows of ``metrics.jsonl``), and the transcript record of one episode (``episodes.jsonl``)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

from teamrl.metrics.diagnostics import amplification_factors
from teamrl.tasks.base import Problem
from teamrl.team.records import Episode, Step

__all__ = ["episodes_without_calls", "eval_metrics", "multi_call_rate", "rollout_metrics", "transcript",
           "update_metrics"]


def transcript(ep: Episode, problem: Problem, step: int) -> dict[str, Any]:
    """An episode as a JSON-able record: who said what, reward and advantage of each call (and, in a prefix tree,
    each call's ``branch`` path; the calls it replayed are its ancestors' turns)."""
    return {
        "step": step, "problem_id": problem.id, "question": problem.question, "gold": problem.answer,
        "final": ep.final, "reward": ep.reward, "error": ep.error, "info": ep.info,
        "turns": [{"agent": s.agent, "agent_call": s.agent_call, "text": s.text, "valid": s.valid,
                   "reward": s.reward, "advantage": s.advantage, "finish": s.finish_reason,
                   **({"branch": list(s.branch)} if s.branch else {})} for s in ep.steps],
    }


def rollout_metrics(episodes: list[Episode], steps: list[Step]) -> dict[str, float]:
    """Episode and per-agent rollout statistics."""
    rewards = [ep.reward for ep in episodes]
    out = {"rollout/reward_mean": statistics.fmean(rewards),
           "rollout/failed_episodes": float(sum(ep.error is not None for ep in episodes)),
           "rollout/calls_per_episode": len(steps) / max(1, len(episodes))}
    for agent in sorted({s.agent for s in steps}):
        mine = [s for s in steps if s.agent == agent]
        r = [s.reward for s in mine]
        a = [s.advantage for s in mine]
        out |= {
            f"agent/{agent}/calls": float(len(mine)),
            f"agent/{agent}/reward_mean": statistics.fmean(r),
            f"agent/{agent}/reward_std": statistics.pstdev(r),
            f"agent/{agent}/adv_mean": statistics.fmean(a),
            f"agent/{agent}/adv_std": statistics.pstdev(a),
            f"agent/{agent}/invalid_rate": statistics.fmean(0.0 if s.valid else 1.0 for s in mine),
            f"agent/{agent}/response_len": statistics.fmean(len(s.response_ids) for s in mine),
            f"agent/{agent}/truncated_rate": statistics.fmean(float(s.finish_reason == "length") for s in mine),
        }
    ok = [ep for ep in episodes if ep.error is None]
    for agent in sorted({s.agent for s in steps}):  # agents acting a varying number of times per episode
        out[f"agent/{agent}/multi_call_rate"] = multi_call_rate(ok, agent)
    amp = amplification_factors([s.reward for s in steps], [s.prompt_index for s in steps], [s.agent for s in steps])
    out |= {f"agent/{agent}/amplification": f for agent, f in amp.items()}
    out["rollout/episodes_without_calls"] = float(episodes_without_calls([len(ep.steps) for ep in ok]))
    for ep in episodes:  # counters a workflow keeps per episode (ep.info["counters"]), summed
        for key, value in ep.info.get("counters", {}).items():
            out[key] = out.get(key, 0.0) + float(value)
    means: dict[str, list[float]] = {}
    for ep in ok:  # values a workflow reports per episode (ep.info["means"]: a hub's reward functions), averaged
        for key, value in ep.info.get("means", {}).items():
            means.setdefault(key, []).append(float(value))
    return out | {key: statistics.fmean(values) for key, values in means.items()}


def episodes_without_calls(calls: list[int]) -> int:
    """Episodes that made no call while another made more than the median: calls recorded in the wrong episode look so.

    >>> episodes_without_calls([0, 2, 2, 4]), episodes_without_calls([2, 2, 2]), episodes_without_calls([0, 0, 1])
    (1, 0, 2)
    """
    return sum(c == 0 for c in calls) if calls and max(calls) > statistics.median(calls) else 0


def multi_call_rate(episodes: list[Episode], agent: str) -> float:
    """Share of ``episodes`` in which ``agent`` acted more than once (a step with ``agent_call`` > 0); nan for none."""
    if not episodes:
        return math.nan
    return statistics.fmean(float(any(s.agent == agent and s.agent_call > 0 for s in ep.steps)) for ep in episodes)


def eval_metrics(result: dict[str, Any], prefix: str = "eval/") -> dict[str, float]:
    """An evaluation result (:meth:`Trainer.evaluate`) as metrics: every number, nested keys joined by ``/``.

    >>> eval_metrics({"accuracy": 0.5, "pass@2 (EM)": 1.0, "problems": 3, "calls_per_episode": {"solver": 1.5}})
    {'eval/accuracy': 0.5, 'eval/pass@2 (EM)': 1.0, 'eval/problems': 3.0, 'eval/calls_per_episode/solver': 1.5}
    """
    out: dict[str, float] = {}
    for k, v in result.items():
        if isinstance(v, dict):
            out |= eval_metrics(v, f"{prefix}{k}/")
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{prefix}{k}"] = float(v)
    return out


def update_metrics(stats: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Learner statistics, prefixed ``loss/<model>/...`` (per-agent grad norms keep ``agent/``, the mismatch
    metrics ``mismatch/``, ``perf/`` counts are summed over the models)."""
    out: dict[str, float] = {}
    for model, st in stats.items():
        for k, v in st.items():
            if k.startswith("perf/"):  # e.g. perf/update_tokens_computed: summed over the models
                out[k] = out.get(k, 0.0) + v
                continue
            out[k if k.startswith(("agent/", "mismatch/")) else f"loss/{model}/{k}"] = v
    return out
