"""Context limits per model: how many tokens a prompt plus its reply may take, and the checks every call passes.

A model's limit is ``models.<m>.max_context`` when set, else its config's ``max_position_embeddings``
(of the module an in-process engine decodes with; a vLLM engine's ``max_model_len`` when smaller), else its tokenizer's
``model_max_length`` when that is a real number (tokenizers without one report about 1e30), else none.
:class:`~teamrl.team.team.Team` checks every call against it before the prompt reaches an engine:
:func:`check_chat_size` on the raw messages before the chat template runs (a cheap lower bound on
their tokens, so a 100,000-message request is refused without tokenizing it) and
:func:`check_prompt` on the tokenized prompt. Both raise :class:`ContextLengthError`; in a workflow
the episode fails with that reason, at the agent-program endpoint the call gets a 400 with code
``context_length_exceeded``, as OpenAI's API answers.

Left out: truncating or summarising prompts that do not fit (the workflow's choice), and limits of
remote servers (an ``openai`` engine's server enforces its own as well).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ContextLengthError", "check_chat_size", "check_prompt", "infer_context_limit", "max_token_chars"]

SANE_MODEL_MAX_LENGTH = 1 << 24
"""Largest tokenizer ``model_max_length`` taken as a real limit (16M tokens); larger values mean "unset"."""

_CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


class ContextLengthError(ValueError):
    """A prompt plus its reply would not fit the model's context limit.

    Attributes:
        prompt_tokens: Tokens of the prompt (a lower bound when raised before tokenizing).
        max_new_tokens: Most tokens the reply may take.
        limit: The model's context limit.
    """

    def __init__(self, model: str, prompt_tokens: int, max_new_tokens: int, limit: int, *, estimated: bool = False):
        self.prompt_tokens, self.max_new_tokens, self.limit = prompt_tokens, max_new_tokens, limit
        least = "at least " if estimated else ""
        super().__init__(
            f"model {model!r}: maximum context length is {limit} tokens, but the call needs {least}"
            f"{prompt_tokens + max_new_tokens} ({least}{prompt_tokens} in the prompt, up to {max_new_tokens} in the "
            f"reply); shorten the messages, lower "
            f"max_tokens / max_new_tokens, or raise models.{model}.max_context if the model takes more")


def infer_context_limit(override: int | None, engine: Any) -> int | None:
    """The context limit of one model: ``override``, else the model config's ``max_position_embeddings`` (or the
    engine's own ``max_model_len``, vLLM's, when smaller), else the tokenizer's ``model_max_length`` when sane,
    else None (no limit known).

    Args:
        override: ``models.<m>.max_context`` (None: infer).
        engine: The model's engine (an in-process module at ``engine.model`` is read for its config).

    Returns:
        Tokens, or None.
    """
    if override is not None:
        return override
    found = getattr(getattr(getattr(engine, "model", None), "config", None), "max_position_embeddings", None)
    known = [n for n in (found, getattr(engine, "max_model_len", None))
             if isinstance(n, int) and not isinstance(n, bool) and n > 0]
    if known:
        return min(known)
    length = getattr(getattr(engine, "tokenizer", None), "model_max_length", None)
    if isinstance(length, int) and 0 < length <= SANE_MODEL_MAX_LENGTH:
        return length
    return None


def max_token_chars(tokenizer: Any) -> int:
    """Most characters one token of ``tokenizer`` stands for (its longest vocabulary entry; byte-level
    entries are at least as long as the text they decode to). 1 000 when the vocabulary cannot be read.

    >>> max_token_chars(type("T", (), {"get_vocab": lambda self: {"a": 0, "Ġthe": 1, "<|im_start|>": 2}})())
    12
    """
    try:
        return max(1, max((len(t) for t in tokenizer.get_vocab()), default=1))
    except (AttributeError, TypeError, NotImplementedError):
        return 1000


def _chars(content: Any) -> int:
    """Characters of text in one message's content (string, or a list of text parts); others count 0."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return 0


def check_chat_size(model: str, messages: list[dict[str, Any]], max_new_tokens: int, limit: int | None,
                    token_chars: int) -> None:
    """Refuse a chat that cannot fit, before the chat template and the tokenizer see it.

    A lower bound on its prompt tokens: one per message of a chat role (every chat template writes at
    least a role marker), and the characters of its text over ``token_chars`` (no token stands for more).

    Args:
        model: The model's name (for the message).
        messages: The chat, as sent.
        max_new_tokens: Most tokens of the reply.
        limit: The model's context limit (None: no check).
        token_chars: :func:`max_token_chars` of the model's tokenizer.

    Raises:
        ContextLengthError: the bound plus ``max_new_tokens`` is over ``limit``.

    >>> check_chat_size("m", [{"role": "user", "content": "x" * 90}], 10, 20, token_chars=10)
    >>> check_chat_size("m", [{"role": "user", "content": "x" * 110}], 10, 20, token_chars=10)
    Traceback (most recent call last):
    ...
    teamrl.team.context.ContextLengthError: model 'm': maximum context length is 20 tokens, but the call needs at least 21 (at least 11 in the prompt, up to 10 in the reply); shorten the messages, lower max_tokens / max_new_tokens, or raise models.m.max_context if the model takes more
    """
    if limit is None:
        return
    roles = sum(1 for m in messages if m.get("role") in _CHAT_ROLES)
    chars = sum(_chars(m.get("content")) for m in messages)
    bound = max(roles, -(-chars // max(1, token_chars)))
    if bound + max_new_tokens > limit:
        raise ContextLengthError(model, bound, max_new_tokens, limit, estimated=True)


def check_prompt(model: str, prompt_tokens: int, max_new_tokens: int, limit: int | None) -> None:
    """Refuse a tokenized prompt that with ``max_new_tokens`` more would pass ``limit`` (None: no check).

    >>> check_prompt("m", 90, 10, 100)
    >>> check_prompt("m", 91, 10, 100)
    Traceback (most recent call last):
    ...
    teamrl.team.context.ContextLengthError: model 'm': maximum context length is 100 tokens, but the call needs 101 (91 in the prompt, up to 10 in the reply); shorten the messages, lower max_tokens / max_new_tokens, or raise models.m.max_context if the model takes more
    """
    if limit is not None and prompt_tokens + max_new_tokens > limit:
        raise ContextLengthError(model, prompt_tokens, max_new_tokens, limit)


TRUNCATIONS = ("left", "right", "middle", "error")


class PromptLengthError(ContextLengthError):
    """A prompt over its agent's ``max_prompt_tokens`` with ``truncation: error``."""

    def __init__(self, agent: str, prompt_tokens: int, limit: int):
        ValueError.__init__(self, f"agent {agent!r}: the prompt has {prompt_tokens} tokens, over max_prompt_tokens "
                                  f"{limit} (truncation: error); raise agents.{agent}.max_prompt_tokens or cut it "
                                  f"with truncation left, right or middle")
        self.prompt_tokens, self.max_new_tokens, self.limit = prompt_tokens, 0, limit


def cut_prompt(ids: list[int], limit: int, side: str, agent: str = "agent") -> list[int]:
    """``ids`` cut to ``limit`` tokens (0: no limit) as verl cuts a prompt over ``max_prompt_length``
    (``verl.utils.torch_functional.postprocess_data``): left keeps the end, right the start, middle the first
    ``limit // 2`` and the last ``limit - limit // 2`` tokens; error raises :class:`PromptLengthError`.

    >>> cut_prompt(list(range(10)), 4, "left"), cut_prompt(list(range(10)), 4, "right")
    ([6, 7, 8, 9], [0, 1, 2, 3])
    >>> cut_prompt(list(range(10)), 5, "middle"), cut_prompt([1, 2], 5, "error")
    ([0, 1, 7, 8, 9], [1, 2])
    """
    if not limit or len(ids) <= limit:
        return ids
    if side == "left":
        return ids[-limit:]
    if side == "right":
        return ids[:limit]
    if side == "middle":
        head = limit // 2
        return ids[:head] + ids[len(ids) - (limit - head):]
    raise PromptLengthError(agent, len(ids), limit)
