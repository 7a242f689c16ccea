"""Rollout: run a workflow on many problems at once and score the episodes.

``collect`` creates ``group_size`` episodes per problem, runs them all concurrently through one
:class:`~teamrl.team.dispatcher.Dispatcher` (so every engine sees batches spanning episodes and
agents), and scores each finished episode with the task's reward. Its progress display counts
tokens, which move with every decode step (:mod:`teamrl.train.progress`).

An episode whose workflow raises (a tool that stays unreachable after its retries, a bug in a
user workflow) is kept with its steps and its ``error``; the others go on. Only when every
episode of a rollout fails does ``collect`` raise (:class:`EpisodesFailed`, holding the episodes), with the
first error as the cause.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from teamrl.tasks.base import Problem, Task, safe_score
from teamrl.team.context import ContextLengthError
from teamrl.team.records import Episode
from teamrl.team.registry import WorkflowSpec
from teamrl.team.team import AgentBinding, Dispatcher, Reply, Team
from teamrl.train.progress import TokenProgress

log = logging.getLogger(__name__)


class EpisodesFailed(RuntimeError):
    """Every episode of a rollout failed; ``episodes`` holds them with their errors, ``first`` the first error."""

    def __init__(self, episodes: list[Episode]) -> None:
        self.episodes = episodes
        self.first = next(ep.error for ep in episodes if ep.error is not None)
        super().__init__(f"all {len(episodes)} episodes failed; the first: {self.first}")


@dataclass
class Rollout:
    """Everything needed to run episodes: the team, its workflow and the task."""

    dispatcher: Dispatcher
    bindings: dict[str, AgentBinding]
    workflow: WorkflowSpec
    workflow_cfg: Any
    task: Task

    def collect(self, problems: list[Problem], group_size: int, *, desc: str = "rollout",
                progress: bool = True, tree: tuple[int, ...] = ()) -> list[Episode]:
        """Run ``group_size`` episodes per problem; returns them scored, grouped by problem.

        ``tree`` (``rollout.prefix_tree``, whose product is ``group_size``): the episodes of a problem form a prefix
        tree of calls instead (:func:`grow_tree`), at most ``group_size`` of them."""
        if tree:
            return self._collect_trees(problems, tree, desc=desc, progress=progress)
        episodes = [
            Episode(prompt_index=g, index=g * group_size + k, problem_id=p.id)
            for g, p in enumerate(problems) for k in range(group_size)
        ]
        bar = TokenProgress(desc, enabled=progress)
        plan_calls, plan_tokens = self.plan()  # per episode, from the workflow's declared calls (None: undeclared)
        unmade = [0]  # budget of the planned calls that finished episodes never made: done too

        async def one(ep: Episode) -> Exception | None:
            try:
                return await self._run_one(ep, problems[ep.prompt_index])
            finally:
                if plan_tokens:
                    made = sum(self.bindings[s.agent].sampling.max_new_tokens for s in ep.steps if s.agent in self.bindings)
                    unmade[0] += max(0, plan_tokens - made)

        coros = [one(ep) for ep in episodes]
        d = self.dispatcher
        calls0, submitted0, done0 = d.calls, d.budget_submitted, d.budget_done
        finished = [0]
        calls_total = f" (max {plan_calls * len(episodes)})" if plan_calls else ""

        def show(_calls: int | None = None) -> None:  # after every engine step and every finished episode
            done = d.budget_done - done0 + unmade[0]
            total = max((plan_tokens or 0) * len(episodes), d.budget_submitted - submitted0 + unmade[0])
            bar.update(done, total, f"calls {d.calls - calls0}{calls_total}, episodes {finished[0]}/{len(episodes)}")

        def episode_done() -> None:
            finished[0] += 1
            show()

        d.on_calls = show
        show()
        try:
            errors = d.run(coros, on_done=episode_done)
            bar.update(bar.total, bar.total, bar.extra)  # whatever the estimate missed: done now
        finally:
            d.on_calls = None
            bar.close()
        failed = [(ep, exc) for ep, exc in zip(episodes, errors) if exc is not None]
        if failed and len(failed) == len(episodes):
            raise EpisodesFailed(episodes) from failed[0][1]
        return episodes

    def plan(self) -> tuple[int, int]:
        """(LLM calls, ``max_new_tokens`` budget) one episode makes at most, from the calls the workflow declares
        (``register_workflow(calls=...)``: each agent's most calls per problem); (0, 0) when it declares none."""
        if self.workflow.calls is None:
            return 0, 0
        try:
            calls = int(self.workflow.calls(self.workflow_cfg, getattr(self.task, "cfg", None)))
        except (AttributeError, TypeError, ValueError):  # a task whose options it cannot read
            return 0, 0
        agents = [a for a in self.workflow.agents_for(self.workflow_cfg) if a in self.bindings]
        return calls * len(agents), calls * sum(self.bindings[a].sampling.max_new_tokens for a in agents)

    def _collect_trees(self, problems: list[Problem], fanout: tuple[int, ...], *, desc: str,
                       progress: bool) -> list[Episode]:
        """One prefix tree of episodes per problem (:func:`grow_tree`), all problems' trees at once."""
        size = math.prod(fanout)
        trees: list[list[Episode]] = [[] for _ in problems]
        bar = TokenProgress(desc, enabled=progress)
        d = self.dispatcher
        calls0 = d.calls

        def show(_calls: int | None = None) -> None:
            done = sum(len(t) for t in trees)
            bar.update(done, max(done, size * len(problems)), f"calls {d.calls - calls0}, episodes {done} (trees of "
                                                               f"{'x'.join(map(str, fanout))})")

        async def one(g: int, problem: Problem) -> None:
            def start(replay: tuple[Reply, ...], branch: tuple[int, ...]) -> tuple[Episode, Team]:
                ep = Episode(prompt_index=g, index=g * size + len(trees[g]), problem_id=problem.id)
                trees[g].append(ep)
                return ep, Team(self.bindings, d, ep, replay=replay, branch=branch)

            async def run(ep: Episode, team: Team) -> Team:
                await self._run_one(ep, problem, team)
                show()
                return team

            await grow_tree(fanout, start, run)

        d.on_calls = show
        show()
        try:
            d.run([one(g, p) for g, p in enumerate(problems)])
            bar.update(bar.total, bar.total, bar.extra)
        finally:
            d.on_calls = None
            bar.close()
        episodes = [ep for t in trees for ep in t]
        if episodes and all(ep.error is not None for ep in episodes):
            raise EpisodesFailed(episodes)
        return episodes

    async def _run_one(self, episode: Episode, problem: Problem, team: Team | None = None) -> Exception | None:
        """Run one episode (with ``team``: that handle, e.g. a branch of a prefix tree); returns the workflow's
        exception (also recorded on the episode) or None."""
        team = team or Team(self.bindings, self.dispatcher, episode)
        try:
            episode.final = await self.workflow.fn(team, problem, self.task, self.workflow_cfg)
        except Exception as exc:
            episode.error = f"workflow failed on problem {problem.id!r} (episode {episode.index}): {type(exc).__name__}: {exc}"
            if isinstance(exc, ContextLengthError):  # counted in the metrics (rollout/context_length_exceeded)
                episode.info["context_length_exceeded"] = {"prompt_tokens": exc.prompt_tokens,
                                                           "max_new_tokens": exc.max_new_tokens, "limit": exc.limit}
            log.warning("%s", episode.error)
            return exc
        if getattr(self.task, "score_in_thread", False):  # code tasks run programs: keep generating meanwhile
            episode.reward = float(await asyncio.to_thread(safe_score, self.task, problem, episode.final or ""))
        else:
            episode.reward = safe_score(self.task, problem, episode.final or "")
        return None


async def grow_tree(fanout: tuple[int, ...], start: Callable[[tuple[Reply, ...], tuple[int, ...]], tuple[Episode, Team]],
                    run: Callable[[Episode, Team], Awaitable[Team]]) -> None:
    """Grow one problem's prefix tree of calls, level by level (C3's rollout, EIT-EAST-Lab/C3
    ``c3/mas/rollout_generator.py``): ``fanout[0]`` episodes run from the start; then, for each level ``d >= 1`` and
    each episode that made a call ``d``, ``fanout[d] - 1`` more episodes replay its first ``d`` calls (its call ``d``
    is the first of the ``fanout[d]`` siblings) and sample the rest. An episode that ends before call ``d`` is a leaf
    above the last level. ``start(replay, branch)`` makes an episode and its team; ``run`` runs it. Calls after the
    last level are sampled once per episode (siblings of none).
    """
    level = [start((), (j,)) for j in range(fanout[0])]
    done = list(await asyncio.gather(*(run(ep, team) for ep, team in level)))
    for d, fan in enumerate(fanout[1:], start=1):
        grown = []
        for team in done:
            if len(team.replies) <= d:
                continue
            base = team.branch + (0,) * (d - 1 - len(team.replay))  # the path of its call d - 1
            grown += [start(tuple(team.replies[:d]), base + (k,)) for k in range(1, fan)]
        done += list(await asyncio.gather(*(run(ep, team) for ep, team in grown)))
