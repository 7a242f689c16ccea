"""Team: the handle a workflow uses to call agents, and the dispatcher that batches those calls.

A workflow is an ``async`` function; every ``await team.ask(agent, messages)`` becomes a pending
request on the engine of that agent's model. The :class:`Dispatcher` runs all episodes of a
rollout concurrently and, whenever every episode is waiting, sends each engine all its pending
requests as one batch: calls of different episodes and of different agents sharing a model are
generated together. Every call is recorded as a :class:`~teamrl.team.records.Step`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

from teamrl.engines.base import Engine, GenOutput, GenRequest, SamplingParams
from teamrl.team.agents import Agent, Parsed
from teamrl.team.records import Episode, Step


@dataclass(frozen=True)
class AgentBinding:
    """An agent as configured in a team: its role, its model (and LoRA adapter) and how it samples."""

    agent: Agent
    model: str
    sampling: SamplingParams
    system_prompt: str
    adapter: str | None = None


@dataclass(frozen=True)
class Reply:
    """What ``team.ask`` returns: the raw text, the parsed value and the format flag."""

    text: str
    value: Any
    valid: bool


class Dispatcher:
    """Runs episodes concurrently and batches their LLM calls per physical model."""

    def __init__(self, engines: dict[str, Engine]) -> None:
        self.engines = engines
        self.pending: dict[str, list[tuple[GenRequest, asyncio.Future]]] = {m: [] for m in engines}
        self.calls = 0
        self.on_calls: Callable[[int], None] | None = None
        """Called with the running count of generated calls (for progress bars)."""

    def submit(self, model: str, request: GenRequest) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.pending[model].append((request, fut))
        return fut

    def tokenizer(self, model: str) -> Any:
        return self.engines[model].tokenizer

    def run(self, coros: Sequence[Awaitable[Any]], on_done: Callable[[], None] | None = None) -> list[Any]:
        """Run all coroutines to completion; returns their results in order."""
        return asyncio.run(self._run(list(coros), on_done))

    async def _run(self, coros: list[Awaitable[Any]], on_done: Callable[[], None] | None) -> list[Any]:
        tasks = [asyncio.ensure_future(c) for c in coros]
        if on_done is not None:
            for t in tasks:
                t.add_done_callback(lambda _t: on_done())
        try:
            while not all(t.done() for t in tasks):
                await self._settle(tasks)
                if any(self.pending.values()):
                    self._flush()
                elif not all(t.done() for t in tasks):
                    await asyncio.sleep(0.001)  # episodes waiting on something else (a tool, I/O)
            return [t.result() for t in tasks]
        finally:
            for t in tasks:
                t.cancel()

    async def _settle(self, tasks: list[asyncio.Task]) -> None:
        """Let episodes run until no new request appears and no episode finishes."""
        prev = (-1, -1)
        for _ in range(1000):
            await asyncio.sleep(0)
            now = (sum(len(v) for v in self.pending.values()), sum(t.done() for t in tasks))
            if now == prev:
                return
            prev = now

    def _progress(self, n: int) -> None:
        self.calls += n
        if self.on_calls is not None:
            self.on_calls(self.calls)

    def _flush(self) -> None:
        for model, items in self.pending.items():
            if not items:
                continue
            self.pending[model] = []
            try:
                outs = self.engines[model].generate([req for req, _ in items], on_progress=self._progress)
            except Exception as exc:  # every waiting episode sees the engine's error
                for _, fut in items:
                    fut.set_exception(exc)
                continue
            for (_, fut), out in zip(items, outs):
                fut.set_result(out)


class Team:
    """A workflow's view of the team for one episode; records every call as a Step."""

    def __init__(self, bindings: dict[str, AgentBinding], dispatcher: Dispatcher, episode: Episode) -> None:
        self.bindings = bindings
        self.dispatcher = dispatcher
        self.episode = episode
        self._turns: dict[str, int] = {}

    @property
    def agents(self) -> list[str]:
        return list(self.bindings)

    async def ask(
        self, agent: str, messages: list[dict[str, str]], *, parse: Callable[[str], Parsed] | None = None
    ) -> Reply:
        """Call ``agent`` with chat ``messages`` (its system prompt is prepended) and parse its reply.

        ``parse`` replaces the agent's own parser for this call (e.g. a task-aware answer check).
        """
        if agent not in self.bindings:
            raise ValueError(f"workflow asked agent {agent!r}, which is not in the team {sorted(self.bindings)}")
        b = self.bindings[agent]
        tok = self.dispatcher.tokenizer(b.model)
        chat = [{"role": "system", "content": b.system_prompt}, *messages]
        prompt_ids = list(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False))
        out: GenOutput = await self.dispatcher.submit(b.model, GenRequest(prompt_ids, b.sampling, b.adapter))
        parsed = (parse or b.agent.parse)(out.text)
        turn = self._turns.get(agent, 0)
        self._turns[agent] = turn + 1
        self.episode.steps.append(
            Step(
                group=self.episode.group, episode=self.episode.index, agent=agent, turn=turn, model=b.model,
                prompt_ids=prompt_ids, response_ids=out.response_ids, logprobs=out.logprobs,
                temperature=b.sampling.temperature, text=out.text, valid=parsed.valid,
                finish_reason=out.finish_reason,
            )
        )
        return Reply(out.text, parsed.value, parsed.valid)
