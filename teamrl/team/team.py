"""Team: the handle a workflow uses to call agents (:class:`Team`), with what a call returns (:class:`Reply`) and how
an agent is configured in a team (:class:`AgentBinding`).

A workflow is an ``async`` function; every ``await team.ask(agent, messages)`` becomes a pending
request on the engine of that agent's model, batched with the calls of other episodes and agents by the
:class:`~teamrl.team.dispatcher.Dispatcher` (re-exported here). Every call is recorded as a
:class:`~teamrl.team.records.Step`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from teamrl.engines.base import GenOutput, GenRequest, SamplingParams
from teamrl.team.agents import Agent, Parsed
from teamrl.team.context import check_chat_size, check_prompt, cut_prompt
from teamrl.team.dispatcher import Dispatcher
from teamrl.team.records import Episode, Step
from teamrl.team.stop_strings import cut_at_stop
from teamrl.team.tools import ToolCall, ToolCallError, parse_tool_calls, render_messages, template_format

__all__ = ["AgentBinding", "Dispatcher", "Reply", "Team"]


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
    max_prompt_tokens: int = 0
    """Longest prompt of a call (chat template included), cut as ``truncation`` says; 0: no limit of its own."""
    truncation: str = "error"
    """How a longer prompt is cut (:func:`teamrl.team.context.cut_prompt`)."""


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
    agent: str = ""
    """The agent that wrote it."""


class Team:
    """A workflow's view of the team for one episode; records every call as a Step."""

    def __init__(self, bindings: dict[str, AgentBinding], dispatcher: Dispatcher, episode: Episode,
                 *, masked: dict[str, str] | None = None, replay: tuple[Reply, ...] = (),
                 branch: tuple[int, ...] = ()) -> None:
        """``masked`` maps agents left out of the team (a counterfactual coalition) to the neutral
        reply that stands in for them: asking a masked agent calls no model and records no Step.

        ``replay`` and ``branch`` place the episode in a prefix tree of calls (``rollout.prefix_tree``): its first
        ``len(replay)`` calls return those replies of the episode it branches from, with no generation and no Step
        (that episode trained them); call ``i`` after them records ``Step.branch`` = ``branch`` + ``(0,) * (i -
        len(replay))``, ``branch`` being the path of its first new call."""
        self.bindings = bindings
        self.dispatcher = dispatcher
        self.episode = episode
        self.masked = masked or {}
        self.replay = replay
        self.branch = branch
        self.replies: list[Reply] = []
        """Every call's reply in order, the replayed ones included (the prefix the episodes branching from this one
        replay)."""
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
        if limit is not None and not (b.max_prompt_tokens and b.truncation != "error"):  # a cut prompt may fit
            check_chat_size(b.model, chat, _new_tokens(b, max_new_tokens), limit, self.dispatcher.token_chars(b.model))
        template = getattr(tok, "chat_template", None)
        chat, tools_arg = render_messages(chat, tools, template) if tools or _has_tool_turns(chat) else (chat, None)
        kwargs = {**b.template_kwargs, **({"tools": tools_arg} if tools_arg else {})}
        prompt_ids = list(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False,
                                                  **kwargs))
        prompt_ids = cut_prompt(prompt_ids, b.max_prompt_tokens, b.truncation, agent)
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
        if len(self.replies) < len(self.replay):  # a frozen call of the prefix this episode branches from
            agent_of = self.replay[len(self.replies)].agent
            if agent_of != agent:
                raise ValueError(f"replayed call {len(self.replies)} was agent {agent_of!r}'s, but the workflow now "
                                 f"asks {agent!r}: a prefix tree needs a workflow whose calls follow from the replies")
            self._calls[agent] = self._calls.get(agent, 0) + 1
            self.replies.append(replace(self.replay[len(self.replies)], step=-1))  # no Step in this episode
            return self.replies[-1]
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
                branch=self.branch + (0,) * (len(self.replies) - len(self.replay)) if self.branch else (),
            )
        )
        reply = Reply(text, parsed.value, valid, len(self.episode.steps) - 1, tool_calls=calls, content=content,
                      format_error=error, finish_reason=out.finish_reason, prompt_tokens=len(prompt_ids),
                      completion_tokens=len(out.response_ids), agent=agent)
        self.replies.append(reply)
        return reply

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
