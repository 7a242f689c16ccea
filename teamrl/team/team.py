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

Calls from programs teamrl cannot see (the OpenAI-compatible endpoint, :mod:`teamrl.serve`) arrive
at any time. While such programs run (:meth:`Dispatcher.outside`), a lockstep flush waits until
every one of them has a call pending, or until ``flush_window_s`` has passed since the oldest
pending call, so their calls share batches as the calls of in-process workflows do.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from teamrl.engines.base import Engine, GenOutput, GenRequest, SamplingParams, SteppedEngine
from teamrl.team.agents import Agent, Parsed
from teamrl.team.context import check_chat_size, check_prompt, infer_context_limit, max_token_chars
from teamrl.team.records import Episode, Step
from teamrl.team.stop_strings import cut_at_stop
from teamrl.team.tools import ToolCall, ToolCallError, parse_tool_calls, render_messages, template_format


@dataclass(frozen=True)
class AgentBinding:
    """An agent as configured in a team: its role, its model (and LoRA adapter) and how it samples."""

    agent: Agent
    model: str
    sampling: SamplingParams
    system_prompt: str
    adapter: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keywords of the chat template (e.g. ``{"enable_thinking": False}``)."""
    tool_format: str = "auto"
    """How tool calls are read from replies (:data:`teamrl.team.tools.FORMATS`); auto: from the chat template."""


@dataclass(frozen=True)
class Reply:
    """What ``team.ask`` returns: the raw text, the parsed value and the format flag."""

    text: str
    value: Any
    valid: bool
    step: int = -1
    """Index of the recorded Step in ``team.episode.steps``; -1 when no model was called (a masked agent)."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Calls parsed from the reply when ``tools`` were offered (``text`` keeps the raw reply)."""
    content: str | None = None
    """The reply without its tool calls (None: the whole ``text``)."""
    format_error: str | None = None
    """Why the reply's tool call could not be parsed (the step is then invalid)."""
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Dispatcher:
    """Runs episodes concurrently and batches their LLM calls per physical model.

    ``schedulers`` maps a model to ``"continuous"`` or ``"lockstep"`` (see the module docstring);
    a model not named gets ``lockstep``; ``continuous`` needs an engine with the step API (others
    fall back to ``lockstep``).
    """

    SCHEDULERS = ("continuous", "lockstep")

    def __init__(self, engines: dict[str, Engine], *, schedulers: dict[str, str] | None = None,
                 context_limits: dict[str, int | None] | None = None) -> None:
        """``context_limits``: tokens a prompt plus its reply may take per model (``models.<m>.max_context``);
        a model not named gets :func:`~teamrl.team.context.infer_context_limit` of its engine."""
        self.engines = engines
        self._limits = {m: infer_context_limit((context_limits or {}).get(m), e) for m, e in engines.items()}
        self._token_chars: dict[str, int] = {}
        self.pending: dict[str, list[tuple[GenRequest, asyncio.Future[GenOutput]]]] = {m: [] for m in engines}
        self.continuous: set[str] = set()
        """Models whose engine is stepped (the others are lockstep)."""
        self._stepped_engines: dict[str, SteppedEngine] = {}
        for m, engine in engines.items():
            choice = (schedulers or {}).get(m, "lockstep")
            if choice not in self.SCHEDULERS:
                raise ValueError(f"scheduler {choice!r} of model {m!r} is not one of {self.SCHEDULERS}")
            if choice == "continuous" and isinstance(engine, SteppedEngine):
                self.continuous.add(m)
                self._stepped_engines[m] = engine
        self._running: dict[str, dict[int, asyncio.Future[GenOutput]]] = {m: {} for m in self.continuous}
        self.flush_window_s = 0.05
        """Longest wait of a lockstep flush for programs outside (see the module docstring)."""
        self._outside: dict[object, int] = {}  # running outside program -> its calls in flight
        self._oldest: float | None = None  # when the oldest pending lockstep call was submitted
        self.calls = 0
        self.on_calls: Callable[[int], None] | None = None
        """Called with the running count of generated calls after every engine step (for progress displays)."""
        self.budget_submitted = 0
        """Sum of ``max_new_tokens`` over the calls submitted so far (progress displays: the token total)."""
        self._budget_done = {m: 0 for m in engines}  # the same over finished calls, per model

    @property
    def budget_done(self) -> int:
        """How much of :attr:`budget_submitted` is done: tokens sampled plus the budget finished calls left
        unused, from engines that count them (``generated_tokens`` and ``unused_tokens``, e.g. the ``hf``
        engine) after every step; for other engines, the whole budget of each finished call."""
        total = 0
        for m, e in self.engines.items():
            if hasattr(e, "generated_tokens") and hasattr(e, "unused_tokens"):
                total += e.generated_tokens + e.unused_tokens
            else:
                total += self._budget_done[m]
        return total

    def submit(self, model: str, request: GenRequest) -> asyncio.Future[GenOutput]:
        fut = asyncio.get_running_loop().create_future()
        budget = request.sampling.max_new_tokens
        self.budget_submitted += budget

        def finished(_f: asyncio.Future[GenOutput]) -> None:
            self._budget_done[model] += budget

        fut.add_done_callback(finished)
        self.pending[model].append((request, fut))
        if self._oldest is None and model not in self.continuous:
            self._oldest = time.monotonic()
        return fut

    @contextlib.contextmanager
    def outside(self, key: object) -> Iterator[None]:
        """Mark a program outside teamrl's view as running while the block runs (``key`` names it)."""
        self._outside[key] = 0
        try:
            yield
        finally:
            self._outside.pop(key, None)

    @contextlib.asynccontextmanager
    async def outside_call(self, key: object) -> AsyncIterator[None]:
        """Mark one call of the outside program ``key`` as in flight while the block runs."""
        if key in self._outside:
            self._outside[key] += 1
        try:
            yield
        finally:
            if key in self._outside:
                self._outside[key] -= 1

    def _hold(self) -> bool:
        """Whether a lockstep flush should wait for outside programs still working towards their next call."""
        if self._oldest is None or all(n > 0 for n in self._outside.values()):
            return False
        return time.monotonic() - self._oldest < self.flush_window_s

    def tokenizer(self, model: str) -> Any:
        return self.engines[model].tokenizer

    def context_limit(self, model: str) -> int | None:
        """Tokens a prompt plus its reply may take on ``model`` (None: no limit known)."""
        return self._limits.get(model)

    def token_chars(self, model: str) -> int:
        """Most characters one token of ``model``'s tokenizer stands for (read once)."""
        if model not in self._token_chars:
            self._token_chars[model] = max_token_chars(self.tokenizer(model))
        return self._token_chars[model]

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
                if self._hold():
                    worked = self._step()  # continuous models go on; lockstep ones wait
                    if not worked:
                        await asyncio.sleep(0.001)
                    continue
                worked = self._flush()
                worked = self._step() or worked
                if not worked and not all(t.done() for t in tasks):
                    await asyncio.sleep(0.001)  # episodes waiting on something else (a tool, I/O)
            return [t.result() for t in tasks]
        finally:
            for t in tasks:
                t.cancel()
            for m in self.continuous:  # an interrupted run leaves nothing behind in the engines
                if self._stepped(m).busy:
                    self._stepped(m).reset()
                self._running[m].clear()

    async def _settle(self, tasks: list[asyncio.Task[Any]]) -> None:
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
        self._oldest = None
        for model, items in self.pending.items():
            if not items or model in self.continuous:
                continue
            worked = True
            self.pending[model] = []
            try:
                outs = self.engines[model].generate([req for req, _ in items], on_progress=self._progress)
            except Exception as exc:  # every waiting episode sees the engine's error
                self.engines[model].reset()  # drop what the failed batch left queued or running in the engine
                for _, fut in items:
                    fut.set_exception(exc)
                continue
            for (_, fut), out in zip(items, outs):
                fut.set_result(out)
        return worked

    def _stepped(self, model: str) -> SteppedEngine:
        return self._stepped_engines[model]  # the continuous models' engines, checked once in __init__

    def _step(self) -> bool:
        """Continuous models: queue new calls, run one decode step, resolve the calls that finished."""
        worked = False
        for model in self.continuous:
            engine = self._stepped(model)
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
        self._calls: dict[str, int] = {}

    @property
    def agents(self) -> list[str]:
        return list(self.bindings)

    async def ask(
        self, agent: str, messages: list[dict[str, Any]], *, parse: Callable[[str], Parsed] | None = None,
        prefix: str = "", close: str = "", stop: tuple[str, ...] = (), tools: list[dict[str, Any]] | None = None,
        max_new_tokens: int | None = None, trim_stop: bool = False,
    ) -> Reply:
        """Call ``agent`` with chat ``messages`` and parse its reply.

        The agent's system prompt is prepended unless it is empty or ``messages`` start with their
        own system message. The prompt is rendered by the model's chat template with the agent's
        ``template_kwargs``.

        ``parse`` replaces the agent's own parser for this call (e.g. a task-aware answer check).
        ``prefix`` starts the reply for the model (e.g. an opening ``<answer>`` tag): its tokens
        join the prompt, so they are not trained on, and the reply's text (parsed, returned and
        recorded) is ``prefix`` + what the model wrote. ``close`` (e.g. ``</answer>``) stops the reply
        and, when the model ends its turn without writing it, is appended to the text (a reply cut
        by ``max_new_tokens`` stays unclosed). ``stop`` adds stop strings to the agent's own.
        ``tools`` (OpenAI function specs) are rendered through the chat template and the reply's
        tool calls are parsed into ``Reply.tool_calls`` (a malformed call makes the step invalid and
        sets ``Reply.format_error``); messages may hold assistant ``tool_calls`` and ``role: tool``
        turns. ``max_new_tokens`` lowers the agent's own limit for this call. ``trim_stop``: the reply
        ends before the first of ``stop`` it holds, tokens and log-probs cut to the text returned
        (OpenAI's behaviour, see :mod:`teamrl.team.stop_strings`).

        Raises :class:`~teamrl.team.context.ContextLengthError` (before tokenizing when the messages'
        size alone shows it) when the prompt plus the reply's token limit exceeds the model's context limit.
        """
        b = self._binding(agent)
        if agent in self.masked:
            neutral = (parse or b.agent.parse)(self.masked[agent])
            return Reply(self.masked[agent], neutral.value, neutral.valid)
        tok = self.dispatcher.tokenizer(b.model)
        own_system = bool(messages) and messages[0].get("role") == "system"
        chat = messages if own_system or not b.system_prompt else [{"role": "system", "content": b.system_prompt}, *messages]
        limit = self.dispatcher.context_limit(b.model)
        if limit is not None:
            check_chat_size(b.model, chat, _new_tokens(b, max_new_tokens), limit, self.dispatcher.token_chars(b.model))
        template = getattr(tok, "chat_template", None)
        chat, tools_arg = render_messages(chat, tools, template) if tools or _has_tool_turns(chat) else (chat, None)
        kwargs = {**b.template_kwargs, **({"tools": tools_arg} if tools_arg else {})}
        prompt_ids = list(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False,
                                                  **kwargs))
        if prefix:
            prompt_ids += tok.encode(prefix, add_special_tokens=False)
        reply = await self.complete(agent, prompt_ids, parse=parse, prefix=prefix, close=close, stop=stop,
                                    max_new_tokens=max_new_tokens, tools=bool(tools), trim_stop=trim_stop)
        return reply

    async def complete(
        self, agent: str, prompt_ids: list[int], *, parse: Callable[[str], Parsed] | None = None, prefix: str = "",
        close: str = "", stop: tuple[str, ...] = (), max_new_tokens: int | None = None, tools: bool = False,
        trim_stop: bool = False,
    ) -> Reply:
        """Call ``agent`` on a prompt given as token ids (no chat template); recorded like :meth:`ask`.

        ``prefix`` is text already at the end of ``prompt_ids`` that the reply's text starts with;
        ``tools``: parse the reply's tool calls; ``trim_stop``: cut the reply before ``stop`` (see :meth:`ask`).
        Raises :class:`~teamrl.team.context.ContextLengthError` when the prompt plus the reply's token limit
        exceeds the model's context limit; nothing reaches the engine then.
        """
        b = self._binding(agent)
        extra = tuple(stop) + ((close,) if close else ())
        sampling = replace(b.sampling, stop=b.sampling.stop + extra) if extra else b.sampling
        if max_new_tokens is not None and max_new_tokens < sampling.max_new_tokens:
            sampling = replace(sampling, max_new_tokens=max(1, max_new_tokens))
        check_prompt(b.model, len(prompt_ids), sampling.max_new_tokens, self.dispatcher.context_limit(b.model))
        out: GenOutput = await self.dispatcher.submit(b.model, GenRequest(list(prompt_ids), sampling, b.adapter))
        if trim_stop and stop:
            tok = self.dispatcher.tokenizer(b.model)
            cut = cut_at_stop(lambda ids: tok.decode(ids, skip_special_tokens=True), out.response_ids, stop)
            if cut is not None:
                out = GenOutput(out.response_ids[:cut[0]], out.logprobs[:cut[0]], cut[1], "stop")
        text = prefix + out.text
        if close and out.finish_reason == "stop" and close not in out.text:
            text += close
        parsed = (parse or b.agent.parse)(text)
        content, error = text, None
        calls: tuple[ToolCall, ...] = ()
        if tools:
            fmt = b.tool_format if b.tool_format != "auto" else template_format(
                getattr(self.dispatcher.tokenizer(b.model), "chat_template", None))
            try:
                content, found = parse_tool_calls(text, fmt)
                calls = tuple(replace(c, id=f"call_{len(self.episode.steps)}_{i}") for i, c in enumerate(found))
            except ToolCallError as exc:
                error = str(exc)
        valid = parsed.valid and error is None
        call = self._calls.get(agent, 0)
        self._calls[agent] = call + 1
        self.episode.steps.append(
            Step(
                prompt_index=self.episode.prompt_index, episode=self.episode.index, agent=agent, agent_call=call,
                model=b.model,
                prompt_ids=list(prompt_ids), response_ids=out.response_ids, logprobs=out.logprobs,
                temperature=b.sampling.temperature, text=text, valid=valid,
                finish_reason=out.finish_reason,
            )
        )
        return Reply(text, parsed.value, valid, len(self.episode.steps) - 1, tool_calls=calls, content=content,
                     format_error=error, finish_reason=out.finish_reason, prompt_tokens=len(prompt_ids),
                     completion_tokens=len(out.response_ids))

    def _binding(self, agent: str) -> AgentBinding:
        if agent not in self.bindings:
            raise ValueError(f"workflow asked agent {agent!r}, which is not in the team {sorted(self.bindings)}")
        return self.bindings[agent]


def _new_tokens(binding: AgentBinding, max_new_tokens: int | None) -> int:
    """The reply's token limit of one call: the agent's own, lowered by ``max_new_tokens``."""
    own = binding.sampling.max_new_tokens
    return own if max_new_tokens is None or max_new_tokens >= own else max(1, max_new_tokens)


def _has_tool_turns(messages: list[dict[str, Any]]) -> bool:
    """Whether a chat holds tool calls, tool results or non-string contents (which need rendering)."""
    return any(m.get("role") == "tool" or m.get("tool_calls") or not isinstance(m.get("content"), str)
               for m in messages)
