"""An evaluation's record: the scores of its episodes (:func:`eval_result`), or the one line that says every one of
them failed (:func:`failed_evaluation`, :class:`EvaluationFailed`)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from teamrl.metrics.diagnostics import eval_scores, outcome_rates
from teamrl.scoring.rewards import refuse_bad_rewards
from teamrl.tasks.base import Problem, Task
from teamrl.team.records import Episode
from teamrl.train.rollout import EpisodesFailed


class EvaluationFailed(ValueError):
    """Every episode of an evaluation failed; ``result`` is what ``eval_<tag>.json`` records
    (:func:`failed_evaluation`), the message its one line."""

    def __init__(self, result: dict[str, Any]) -> None:
        self.result = result
        super().__init__(result["failed"])


def failed_evaluation(tag: str, exc: EpisodesFailed, samples: int, problems: Sequence[Problem]) -> dict[str, Any]:
    """The record of an evaluation whose episodes all failed: ``failed`` says so in one line, with the first
    episode's error (its first line, at most 400 characters)."""
    first = str(exc.first).strip().splitlines()[0] if str(exc.first).strip() else "no error text"
    first = first if len(first) <= 400 else first[:399] + "…"
    return {"failed": f"the evaluation ({tag}) failed: all {len(exc.episodes)} episodes failed; the first: {first}",
            "problems": len(problems), "samples": samples, "failed_episodes": len(exc.episodes)}


def eval_result(episodes: list[Episode], problems: Sequence[Problem], task: Task, samples: int, agents: list[str],
                grading_errors: int) -> dict[str, Any]:
    """avg@n and pass@1..n (unbiased, n = ``samples``) of ``episodes`` by problem, with what the task and the
    episodes add: success rates and turns of environments, win/draw/loss rates of games, pass@k of solved problems
    for partial-credit rewards, every answer metric a task reports."""
    refused = refuse_bad_rewards(episodes)
    by_group: dict[int, list[float]] = {}
    for ep in episodes:
        by_group.setdefault(ep.prompt_index, []).append(ep.reward)
    result = {
        **eval_scores(list(by_group.values())),
        "problems": len(problems), "samples": samples,
        "failed_episodes": sum(ep.error is not None for ep in episodes),
        "refused_rewards": refused, "grading_errors": grading_errors,
        "calls_per_episode": {a: statistics.fmean(sum(s.agent == a for s in ep.steps) for ep in episodes)
                              for a in agents},
    }
    played = [ep for ep in episodes if ep.error is None and "success" in ep.info and "turns" in ep.info]
    if played:  # an environment task: episodes that reached the goal, and how many turns episodes took
        result["success_rate"] = statistics.fmean(float(ep.info["success"]) for ep in played)
        result["avg_turns"] = statistics.fmean(ep.info["turns"] for ep in played)
    outcomes = [str(ep.info["outcome"]) for ep in episodes if ep.error is None and "outcome" in ep.info]
    if outcomes:  # games against a fixed opponent: win, draw and loss rates with Wilson intervals
        result["outcomes"] = outcome_rates(outcomes)
    passed = getattr(task, "passed", None)  # partial-credit rewards (search F1): pass@k counts solved ones
    if callable(passed):
        wins: dict[int, list[float]] = {}
        for ep in episodes:
            ok = ep.error is None and passed(problems[ep.prompt_index], ep.final or "")
            wins.setdefault(ep.prompt_index, []).append(float(ok))
        label = getattr(task, "pass_label", "passed")
        result = {k: v for k, v in result.items() if not k.startswith("pass@")} | {
            f"{k} ({label})": v for k, v in eval_scores(list(wins.values())).items() if k.startswith("pass@")}
    all_scores = getattr(task, "all_scores", None)  # a task with several answer metrics reports each
    if callable(all_scores):
        per_ep = [all_scores(problems[ep.prompt_index], ep.final or "") for ep in episodes if ep.error is None]
        result["metrics"] = {k: statistics.fmean(d[k] for d in per_ep) for k in per_ep[0]} if per_ep else {}
    return result
