"""Team: the handle a workflow uses to call agents, and the dispatcher that batches those calls.

A workflow is an ``async`` function; every ``await team.ask(agent, messages)`` becomes a pending
request on the engine of that agent's model. The :class:`Dispatcher` runs all episodes of a
rollout concurrently; calls of different episodes and of different agents sharing a model are
generated together. Every call is recorded as a :class:`~teamrl.team.records.Step`.

Two schedulers, per model:

* ``continuous`` (engines with a step API: ``add``, ``step``, ``busy``, ``reset``, as
  :class:`~teamrl.engines.hf.HFEngine`): the dispatcher advances each engine one decode step at a
  time; a call that finishes resolves at once, its episode runs on, and its next call (and any
  other new one) joins the running batch at the next step;
* ``lockstep`` (the default, and what engines without the step API always get): whenever every
  episode is waiting, each engine gets all its pending calls as one batch and generates them to
  completion.

Both are reproducible: the same seed gives the same run (each request's sampling uniforms are
drawn when it is added, so its tokens do not depend on its batch company).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
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
    step: int = -1
    """Index of the recorded Step in ``team.episode.steps``; -1 when no model was called (a masked agent)."""


class Dispatcher:
    """Runs episodes concurrently and batches their LLM calls per physical model.

    ``schedulers`` maps a model to ``"continuous"`` or ``"lockstep"`` (see the module docstring);
    a model not named gets ``lockstep``; ``continuous`` needs an engine with the step API (others
    fall back to ``lockstep``).
    """

    SCHEDULERS = ("continuous", "lockstep")

    def __init__(self, engines: dict[str, Engine], *, schedulers: dict[str, str] | None = None) -> None:
        self.engines = engines
        self.pending: dict[str, list[tuple[GenRequest, asyncio.Future]]] = {m: [] for m in engines}
        self.continuous: set[str] = set()
        """Models whose engine is stepped (the others are lockstep)."""
        for m, engine in engines.items():
            choice = (schedulers or {}).get(m, "lockstep")
            if choice not in self.SCHEDULERS:
                raise ValueError(f"scheduler {choice!r} of model {m!r} is not one of {self.SCHEDULERS}")
            if choice == "continuous" and all(hasattr(engine, a) for a in ("add", "step", "busy", "reset")):
                self.continuous.add(m)
        self._running: dict[str, dict[int, asyncio.Future]] = {m: {} for m in self.continuous}
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
                worked = self._flush()
                worked = self._step() or worked
                if not worked and not all(t.done() for t in tasks):
                    await asyncio.sleep(0.001)  # episodes waiting on something else (a tool, I/O)
            return [t.result() for t in tasks]
        finally:
            for t in tasks:
                t.cancel()
            for m in self.continuous:  # an interrupted run leaves nothing behind in the engines
                if self.engines[m].busy:  # type: ignore[attr-defined]
                    self.engines[m].reset()  # type: ignore[attr-defined]
                self._running[m].clear()

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

    def _flush(self) -> bool:
        """Lockstep models: generate all pending calls as one batch. Returns whether there were any."""
        worked = False
        for model, items in self.pending.items():
            if not items or model in self.continuous:
                continue
            worked = True
            self.pending[model] = []
            try:
                outs = self.engines[model].generate([req for req, _ in items], on_progress=self._progress)
            except Exception as exc:  # every waiting episode sees the engine's error
                reset = getattr(self.engines[model], "reset", None)
                if callable(reset):  # drop what the failed batch left queued or running in the engine
                    reset()
                for _, fut in items:
                    fut.set_exception(exc)
                continue
            for (_, fut), out in zip(items, outs):
                fut.set_result(out)
        return worked

    def _step(self) -> bool:
        """Continuous models: queue new calls, run one decode step, resolve the calls that finished."""
        worked = False
        for model in self.continuous:
            engine: Any = self.engines[model]
            running = self._running[model]
            items, self.pending[model] = self.pending[model], []
            try:
                if items:
                    running.update(zip(engine.add([req for req, _ in items]), (fut for _, fut in items)))
                if not engine.busy:
                    continue
                worked = True
                done = engine.step()
            except Exception as exc:  # every call on this engine sees its error
                engine.reset()
                for fut in running.values():
                    fut.set_exception(exc)
                for _, fut in items:
                    if not fut.done():
                        fut.set_exception(exc)
                running.clear()
                continue
            for rid, out in done:
                running.pop(rid).set_result(out)
            if done:
                self._progress(len(done))
        return worked


class Team:
    """A workflow's view of the team for one episode; records every call as a Step."""

    def __init__(self, bindings: dict[str, AgentBinding], dispatcher: Dispatcher, episode: Episode,
                 *, masked: dict[str, str] | None = None) -> None:
        """``masked`` maps agents left out of the team (a counterfactual coalition) to the neutral
        reply that stands in for them: asking a masked agent calls no model and records no Step."""
        self.bindings = bindings
        self.dispatcher = dispatcher
        self.episode = episode
        self.masked = masked or {}
        self._turns: dict[str, int] = {}

    @property
    def agents(self) -> list[str]:
        return list(self.bindings)

    async def ask(
        self, agent: str, messages: list[dict[str, str]], *, parse: Callable[[str], Parsed] | None = None,
        prefix: str = "", close: str = "", stop: tuple[str, ...] = (),
    ) -> Reply:
        """Call ``agent`` with chat ``messages`` (its system prompt is prepended) and parse its reply.

        ``parse`` replaces the agent's own parser for this call (e.g. a task-aware answer check).
        ``prefix`` starts the reply for the model (e.g. an opening ``<answer>`` tag): its tokens
        join the prompt, so they are not trained on, and the reply's text (parsed, returned and
        recorded) is ``prefix`` + what the model wrote. ``close`` (e.g. ``</answer>``) stops the reply
        and, when the model ends its turn without writing it, is appended to the text (a reply cut
        by ``max_new_tokens`` stays unclosed). ``stop`` adds stop strings to the agent's own.
        """
        if agent not in self.bindings:
            raise ValueError(f"workflow asked agent {agent!r}, which is not in the team {sorted(self.bindings)}")
        b = self.bindings[agent]
        if agent in self.masked:
            neutral = (parse or b.agent.parse)(self.masked[agent])
            return Reply(self.masked[agent], neutral.value, neutral.valid)
        tok = self.dispatcher.tokenizer(b.model)
        chat = [{"role": "system", "content": b.system_prompt}, *messages]
        prompt_ids = list(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False))
        if prefix:
            prompt_ids += tok.encode(prefix, add_special_tokens=False)
        extra = tuple(stop) + ((close,) if close else ())
        sampling = replace(b.sampling, stop=b.sampling.stop + extra) if extra else b.sampling
        out: GenOutput = await self.dispatcher.submit(b.model, GenRequest(prompt_ids, sampling, b.adapter))
        text = prefix + out.text
        if close and out.finish_reason == "stop" and close not in out.text:
            text += close
        parsed = (parse or b.agent.parse)(text)
        turn = self._turns.get(agent, 0)
        self._turns[agent] = turn + 1
        self.episode.steps.append(
            Step(
                group=self.episode.group, episode=self.episode.index, agent=agent, turn=turn, model=b.model,
                prompt_ids=prompt_ids, response_ids=out.response_ids, logprobs=out.logprobs,
                temperature=b.sampling.temperature, text=text, valid=parsed.valid,
                finish_reason=out.finish_reason,
            )
        )
        return Reply(text, parsed.value, parsed.valid, len(self.episode.steps) - 1)
