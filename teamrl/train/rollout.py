"""Rollout: run a workflow on many problems at once and score the episodes.

``collect`` creates ``group_size`` episodes per problem, runs them all concurrently through one
:class:`~teamrl.team.team.Dispatcher` (so every engine sees batches spanning episodes and
agents), and scores each finished episode with the task's reward.

An episode whose workflow raises (a tool that stays unreachable after its retries, a bug in a
user workflow) is kept with its steps and its ``error``; the others go on. Only when every
episode of a rollout fails does ``collect`` raise, with the first error as the cause.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from teamrl.tasks.base import Problem, Task
from teamrl.team.records import Episode
from teamrl.team.registry import WorkflowSpec
from teamrl.team.team import AgentBinding, Dispatcher, Team

log = logging.getLogger(__name__)


@dataclass
class Rollout:
    """Everything needed to run episodes: the team, its workflow and the task."""

    dispatcher: Dispatcher
    bindings: dict[str, AgentBinding]
    workflow: WorkflowSpec
    workflow_cfg: Any
    task: Task

    def collect(self, problems: list[Problem], group_size: int, *, desc: str = "rollout",
                progress: bool = True) -> list[Episode]:
        """Run ``group_size`` episodes per problem; returns them scored, grouped by problem."""
        episodes = [
            Episode(prompt_index=g, index=g * group_size + k, problem_id=p.id)
            for g, p in enumerate(problems) for k in range(group_size)
        ]
        bar = tqdm(total=len(episodes), desc=desc, unit="ep", leave=False, disable=not progress)
        coros = [self._run_one(ep, problems[ep.prompt_index]) for ep in episodes]
        start = self.dispatcher.calls
        self.dispatcher.on_calls = lambda n: bar.set_postfix(llm_calls=n - start, refresh=True)
        try:
            errors = self.dispatcher.run(coros, on_done=lambda: bar.update(1))
        finally:
            self.dispatcher.on_calls = None
            bar.close()
        failed = [(ep, exc) for ep, exc in zip(episodes, errors) if exc is not None]
        if failed and len(failed) == len(episodes):
            ep, exc = failed[0]
            raise RuntimeError(f"all {len(episodes)} episodes failed; the first: {ep.error}") from exc
        return episodes

    async def _run_one(self, episode: Episode, problem: Problem) -> Exception | None:
        """Run one episode; returns the workflow's exception (also recorded on the episode) or None."""
        team = Team(self.bindings, self.dispatcher, episode)
        try:
            episode.final = await self.workflow.fn(team, problem, self.task, self.workflow_cfg)
        except Exception as exc:
            episode.error = f"workflow failed on problem {problem.id!r} (episode {episode.index}): {type(exc).__name__}: {exc}"
            log.warning("%s", episode.error)
            return exc
        if getattr(self.task, "score_in_thread", False):  # code tasks run programs: keep generating meanwhile
            episode.reward = float(await asyncio.to_thread(self.task.score, problem, episode.final or ""))
        else:
            episode.reward = float(self.task.score(problem, episode.final or ""))
        return None
