"""The OpenAI wire format: request checks, response bodies and streaming chunks (pure functions).

Reference: https://platform.openai.com/docs/api-reference/chat (``/v1/chat/completions``) and the
legacy ``/v1/completions``. Every response carries ``usage`` and an extra ``teamrl`` object with
the recorded step's index, prompt and reply token ids, and the tool-call format error if any
(clients ignore unknown fields; the official Python client keeps it in ``model_extra``). Every
field is type-checked here, so a malformed request is a 400 naming the field, never a 500.
Refused with the reason: ``n > 1``, ``top_logprobs``, ``echo``, forced ``tool_choice``,
structured output (``response_format``) and image, audio or file content parts. The Responses
API is :mod:`teamrl.serve.responses_api`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from teamrl.team.team import Reply

SAMPLING_KEYS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": None, "frequency_penalty": 0.0,
                 "presence_penalty": 0.0, "logit_bias": None, "min_p": 0.0, "repetition_penalty": 1.0}
"""Client sampling settings (with the value that means "off"); the agent's config takes precedence."""


class ApiError(Exception):
    """A request the endpoint refuses: HTTP status, OpenAI error type and code, one-line message."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.code, self.param = status, kind, code, param

    def body(self) -> dict[str, Any]:
        """The error in OpenAI's shape."""
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class CallArgs:
    """What the endpoint takes from a request body."""

    model: str
    stream: bool
    include_usage: bool
    max_tokens: int | None
    stop: tuple[str, ...]
    logprobs: bool


def call_args(body: Any) -> CallArgs:
    """Check the fields common to both endpoints; raises :class:`ApiError` for what cannot be honoured.

    >>> call_args({"model": "m", "stop": "END", "max_tokens": 5})
    CallArgs(model='m', stream=False, include_usage=False, max_tokens=5, stop=('END',), logprobs=False)
    """
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' is required: the name of the agent to call", param="model")
    if body.get("n", 1) != 1:
        raise ApiError(400, f"n={body.get('n')} is not supported: each call is one recorded step; send n calls",
                       param="n")
    if body.get("top_logprobs"):
        raise ApiError(400, "top_logprobs is not supported (only the sampled token's log-prob is recorded)",
                       param="top_logprobs")
    if body.get("echo"):
        raise ApiError(400, "echo is not supported", param="echo")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise ApiError(400, f"max_tokens must be a positive integer, got {max_tokens!r}", param="max_tokens")
    refuse_response_format(body.get("response_format"), "response_format")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, f"stream_options must be an object such as {{\"include_usage\": true}}, got {options!r}",
                       param="stream_options")
    for key in ("stream", "logprobs"):
        if not isinstance(body.get(key, False), (bool, type(None))):
            raise ApiError(400, f"{key} must be true or false, got {body[key]!r}", param=key)
    return CallArgs(model, bool(body.get("stream", False)), bool(options.get("include_usage", False)), max_tokens,
                    stop_strings(body.get("stop")), bool(body.get("logprobs")))


def stop_strings(stop: Any) -> tuple[str, ...]:
    """A request's ``stop`` as a tuple (a string, a list of up to 4 strings, or null).

    >>> stop_strings("END"), stop_strings(None), stop_strings(["a", "b"])
    (('END',), (), ('a', 'b'))
    """
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) for s in stops):
        raise ApiError(400, f"stop must be a string or a list of strings, got {stop!r}", param="stop")
    if len(stops) > 4 or not all(stops):
        raise ApiError(400, "stop takes at most 4 non-empty strings", param="stop")
    return tuple(stops)


def refuse_response_format(fmt: Any, param: str) -> None:
    """400 for structured output: what the model writes unconstrained is what is trained, so no format is enforced."""
    kind = fmt.get("type") if isinstance(fmt, dict) else fmt
    if fmt is None or kind == "text":
        return
    raise ApiError(400, f"{param} {kind!r} is not supported: the reply is sampled as the model writes it (so it is "
                   f"what is trained) and no output format can be enforced; ask for JSON in the prompt and parse it",
                   param=param)


def message_content(content: Any, role: str, where: str) -> str | None:
    """A message's content as text: a string, null (assistant turns with tool calls) or a list of text parts.

    Image, audio and file parts are refused (the models trained here read text only).

    >>> message_content([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "user", "messages[0]")
    'ab'
    """
    if isinstance(content, str) or (content is None and role in ("assistant", "system", "developer")):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where}.content must be a string or a list of content parts, got "
                       f"{type(content).__name__}", param=where)
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in ("image_url", "input_image", "input_audio", "file", "input_file"):
            raise ApiError(400, f"{where}.content[{i}] is a {kind} part: images, audio and files are not supported "
                           f"(the models trained here read text only); send text", param=where)
        else:
            raise ApiError(400, f"{where}.content[{i}] must be a {{\"type\": \"text\", \"text\": \"...\"}} part, "
                           f"got {part!r:.80}", param=where)
    return "".join(texts)


def check_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Chat ``tools``: a list of ``{type: function, function: {name, description?, parameters?}}`` (or None)."""
    if not tools:
        return None
    ok = isinstance(tools, list) and all(
        isinstance(t, dict) and t.get("type", "function") == "function" and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str) and isinstance(t["function"].get("parameters", {}), dict)
        and isinstance(t["function"].get("description", ""), (str, type(None))) for t in tools)
    if not ok:
        raise ApiError(400, "'tools' must be a list of {type: function, function: {name, description, parameters}} "
                       "objects (only function tools are served)", param="tools")
    return tools


def _check_message(m: dict[str, Any], i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    out = {**m, "content": message_content(m.get("content"), m["role"], where)}
    calls = m.get("tool_calls")
    if calls is not None:
        if m["role"] != "assistant" or not isinstance(calls, list) or not all(
                isinstance(c, dict) and isinstance(c.get("function"), dict)
                and isinstance(c["function"].get("name"), str) and isinstance(c["function"].get("arguments", ""), str)
                for c in calls):
            raise ApiError(400, f"{where}.tool_calls must be a list of {{id, type: function, function: {{name, "
                           f"arguments}}}} on an assistant message", param=where)
    for key in ("name", "tool_call_id"):
        if key in m and not isinstance(m[key], (str, type(None))):
            raise ApiError(400, f"{where}.{key} must be a string", param=where)
    return out


def chat_args(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """``(messages, tools)`` of a chat request (tools None when none are offered or tool_choice is none).

    >>> chat_args({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "none", "tools": [{}]})
    ([{'role': 'user', 'content': 'hi'}], None)
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise ApiError(400, "'messages' must be a non-empty list of {role, content} objects", param="messages")
    roles = {"system", "developer", "user", "assistant", "tool"}
    for m in messages:
        if not isinstance(m["role"], str) or m["role"] not in roles:
            raise ApiError(400, f"message role {m['role']!r} is not one of {sorted(roles)}", param="messages")
    messages = [_check_message(m, i) for i, m in enumerate(messages)]
    messages = [{**m, "role": "system"} if m["role"] == "developer" else m for m in messages]
    choice = body.get("tool_choice", "auto")
    if choice == "none":
        return messages, None
    tools = check_tools(body.get("tools"))
    if choice not in ("auto", None):
        raise ApiError(400, f"tool_choice {choice!r} cannot be enforced (the reply is sampled as the model writes "
                       "it, so it is trained on); use 'auto' or 'none'", param="tool_choice")
    return messages, tools


def sampling_differences(body: dict[str, Any], config: dict[str, Any]) -> list[str]:
    """Client sampling settings that differ from the agent's config (the config's are used).

    >>> sampling_differences({"temperature": 0.2, "top_p": 1.0}, {"temperature": 1.0, "top_p": 1.0, "top_k": 0})
    ['temperature=0.2 (the agent samples with 1.0)']
    """
    out = []
    for key, off in SAMPLING_KEYS.items():
        if key not in body or body[key] is None:
            continue
        used = config.get(key, off)
        if body[key] != used:
            out.append(f"{key}={body[key]!r} (the agent samples with {used!r})")
    return out


def finish_reason(reply: Reply) -> str:
    """OpenAI's finish reason of a reply."""
    if reply.tool_calls:
        return "tool_calls"
    return "length" if reply.finish_reason == "length" else "stop"


def usage(reply: Reply) -> dict[str, int]:
    return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens}


def extra(reply: Reply, prompt_ids: list[int], response_ids: list[int]) -> dict[str, Any]:
    return {"step": reply.step, "prompt_token_ids": prompt_ids, "token_ids": response_ids,
            "format_error": reply.format_error}


def _logprobs(tokens: list[str], logprobs: list[float]) -> dict[str, Any]:
    return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                        for t, lp in zip(tokens, logprobs)]}


def chat_response(rid: str, model: str, reply: Reply, *, prompt_ids: list[int], response_ids: list[int],
                  tokens: list[str] | None = None, logprobs: list[float] | None = None) -> dict[str, Any]:
    """A non-streaming ``chat.completion`` body (``tokens``/``logprobs`` given: the choice's log-probs)."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content if reply.content is not None else reply.text}
    if reply.tool_calls:
        message["tool_calls"] = [c.to_openai(i) for i, c in enumerate(reply.tool_calls)]
        message["content"] = message["content"] or None
    choice = {"index": 0, "message": message, "finish_reason": finish_reason(reply),
              "logprobs": _logprobs(tokens, logprobs) if tokens is not None and logprobs is not None else None}
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model, "choices": [choice],
            "usage": usage(reply), "teamrl": extra(reply, prompt_ids, response_ids)}


def completion_response(rid: str, model: str, reply: Reply, *, prompt_ids: list[int],
                        response_ids: list[int]) -> dict[str, Any]:
    """A non-streaming ``text_completion`` body."""
    choice = {"index": 0, "text": reply.text, "finish_reason": finish_reason(reply), "logprobs": None}
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model, "choices": [choice],
            "usage": usage(reply), "teamrl": extra(reply, prompt_ids, response_ids)}


def sse(obj: Any) -> str:
    """One server-sent event.

    >>> sse({"a": 1})
    'data: {"a": 1}\\n\\n'
    """
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def chat_chunks(rid: str, model: str, reply: Reply, pieces: list[str], *, include_usage: bool) -> Iterator[str]:
    """The ``chat.completion.chunk`` events of a reply: role, content pieces, tool calls, finish, usage, [DONE].

    ``pieces`` are the reply's content in order (e.g. one per token).
    """
    created = int(time.time())

    def chunk(delta: dict[str, Any], reason: str | None = None) -> str:
        return sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}]})

    yield chunk({"role": "assistant", "content": ""})
    for piece in pieces:
        if piece:
            yield chunk({"content": piece})
    for i, call in enumerate(reply.tool_calls):
        yield chunk({"tool_calls": [{"index": i, **call.to_openai(i)}]})
    yield chunk({}, finish_reason(reply))
    if include_usage:
        yield sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [],
                   "usage": usage(reply)})
    yield "data: [DONE]\n\n"


def completion_chunks(rid: str, model: str, reply: Reply, pieces: list[str], *, include_usage: bool) -> Iterator[str]:
    """The ``text_completion`` events of a reply: text pieces, finish, usage, [DONE]."""
    created = int(time.time())

    def chunk(text: str, reason: str | None = None) -> str:
        return sse({"id": rid, "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": 0, "text": text, "finish_reason": reason, "logprobs": None}]})

    for piece in pieces:
        if piece:
            yield chunk(piece)
    yield chunk("", finish_reason(reply))
    if include_usage:
        yield sse({"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [],
                   "usage": usage(reply)})
    yield "data: [DONE]\n\n"


def text_pieces(tokenizer: Any, token_ids: list[int], text: str) -> list[str]:
    """``text`` split where its tokens end (for streaming); one piece when the decode does not add up to it."""
    pieces, prev = [], ""
    for i in range(1, len(token_ids) + 1):
        now = tokenizer.decode(token_ids[:i], skip_special_tokens=True)
        if now.startswith(prev) and not now.endswith("\ufffd"):
            pieces.append(now[len(prev):])
            prev = now
    return pieces if "".join(pieces) == text else [text]
