"""OpenAI's Responses API (``POST /v1/responses``) as chat messages in, Response objects and events out (pure functions).

Reference: https://platform.openai.com/docs/api-reference/responses. The subset served is what the
OpenAI Agents SDK (its default model) and the ``openai`` client's ``responses.create`` send:
``input`` as a string or a list of items (messages with text content, ``function_call`` and
``function_call_output`` items, earlier ``message`` output items), ``instructions``, function
``tools``, ``tool_choice`` auto/none, ``max_output_tokens``, ``stream``. The request becomes a
chat (instructions first as the system message, function calls as assistant ``tool_calls``,
outputs as ``tool`` messages) answered by ``team.ask``, so a response is recorded exactly like a
chat completion. Left out, refused with a 400 saying why: server-side state
(``previous_response_id``, ``conversation``: nothing is stored, send the whole input), hosted
tools (web search, file search, computer use), structured output (``text.format`` other than
text), image/file inputs, forced ``tool_choice``, reasoning items.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from teamrl.serve.openai_api import ApiError, message_content, refuse_response_format
from teamrl.team.team import Reply


def responses_args(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, int | None]:
    """``(messages, tools, max_output_tokens)`` of a Responses request.

    >>> responses_args({"model": "m", "input": "hi", "instructions": "Be brief."})
    ([{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'hi'}], None, None)
    """
    for key in ("previous_response_id", "conversation"):
        if body.get(key):
            raise ApiError(400, f"{key} is not supported: nothing is stored between calls; send the whole "
                           f"conversation as input (the Agents SDK does by default)", param=key)
    text = body.get("text")
    if text is not None and not isinstance(text, dict):
        raise ApiError(400, f"text must be an object, got {text!r:.80}", param="text")
    refuse_response_format((text or {}).get("format"), "text.format")
    limit = body.get("max_output_tokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ApiError(400, f"max_output_tokens must be a positive integer, got {limit!r}", param="max_output_tokens")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ApiError(400, "instructions must be a string", param="instructions")
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + input_messages(body.get("input"))
    if not messages:
        raise ApiError(400, "input is empty", param="input")
    choice = body.get("tool_choice", "auto")
    if choice == "none":
        return messages, None, limit
    if choice not in ("auto", None):
        raise ApiError(400, f"tool_choice {choice!r} cannot be enforced (the reply is sampled as the model writes it, "
                       "so it is trained on); use 'auto' or 'none'", param="tool_choice")
    return messages, function_tools(body.get("tools")), limit


def function_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Responses function tools (``{type, name, description, parameters}``) as chat tools."""
    if not tools:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ApiError(400, "tools must be a list of {type: function, name, parameters} objects", param="tools")
    out = []
    for i, t in enumerate(tools):
        if t.get("type") != "function":
            raise ApiError(400, f"tools[{i}] is a {t.get('type')!r} tool: only function tools are served (hosted "
                           f"tools such as web or file search need OpenAI's servers)", param="tools")
        if not isinstance(t.get("name"), str) or not isinstance(t.get("parameters") or {}, dict) \
                or not isinstance(t.get("description") or "", str):
            raise ApiError(400, f"tools[{i}] needs a string name, an object of parameters and a string description",
                           param="tools")
        out.append({"type": "function", "function": {"name": t["name"], "description": t.get("description") or "",
                                                     "parameters": t.get("parameters") or {}}})
    return out


def input_messages(items: Any) -> list[dict[str, Any]]:
    """The ``input`` of a Responses request as chat messages (function calls joined to the assistant turn before them).

    >>> input_messages([{"role": "user", "content": "2+3?"},
    ...                 {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"},
    ...                 {"type": "function_call_output", "call_id": "c1", "output": "5"}])[1:]
    [{'role': 'assistant', 'content': None, 'tool_calls': [{'id': 'c1', 'type': 'function', \
'function': {'name': 'add', 'arguments': '{}'}}]}, {'role': 'tool', 'tool_call_id': 'c1', 'content': '5'}]
    """
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ApiError(400, "input must be a string or a list of input items", param="input")
    out: list[dict[str, Any]] = []
    for n, item in enumerate(items):
        kind, where = item.get("type", "message"), f"input[{n}]"
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ApiError(400, f"{where}.role {role!r} is not user, system, developer or assistant", param="input")
            out.append({"role": "system" if role == "developer" else role,
                        "content": message_content(item.get("content"), role, where)})
        elif kind == "function_call":
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
                raise ApiError(400, f"{where} (function_call) needs string call_id, name and arguments", param="input")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(item.get("call_id"), str):
                raise ApiError(400, f"{where} (function_call_output) needs a string call_id", param="input")
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": message_content(output, "tool", where)})
        else:
            raise ApiError(400, f"{where} is a {kind!r} item; served: message, function_call, function_call_output",
                           param="input")
    return out


def output_items(rid: str, reply: Reply) -> list[dict[str, Any]]:
    """The ``output`` of a Response: the message (when it has text) then one ``function_call`` per tool call."""
    items: list[dict[str, Any]] = []
    text = reply.content if reply.content is not None else reply.text
    if text or not reply.tool_calls:
        items.append({"type": "message", "id": f"msg_{rid}", "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]})
    for i, call in enumerate(reply.tool_calls):
        c = call.to_openai(i)
        items.append({"type": "function_call", "id": f"fc_{rid}_{i}", "call_id": c["id"], "name": call.name,
                      "arguments": call.arguments, "status": "completed"})
    return items


def response_body(rid: str, model: str, reply: Reply | None, body: dict[str, Any],
                  teamrl: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``response`` object (reply None: the in-progress shell sent first when streaming).

    A reply cut by the client's ``max_output_tokens`` is ``incomplete`` (reason ``max_output_tokens``),
    as OpenAI's; one cut by the agent's own ``max_new_tokens`` is ``completed`` (the Agents SDK fails a
    run on an incomplete response, and such an episode would not be trained on; the truncation shows
    in ``agent/<name>/truncated_rate`` and the task's reward instead).
    """
    done = reply is not None
    limit = body.get("max_output_tokens")
    cut = (reply is not None and reply.finish_reason == "length" and isinstance(limit, int)
           and reply.completion_tokens >= limit)
    out: dict[str, Any] = {
        "id": rid, "object": "response", "created_at": int(time.time()), "model": model,
        "status": ("incomplete" if cut else "completed") if done else "in_progress",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "error": None,
        "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
        "output": output_items(rid, reply) if reply is not None else [],
        "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)), "previous_response_id": None,
        "temperature": body.get("temperature"), "top_p": body.get("top_p"), "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [], "text": {"format": {"type": "text"}}, "truncation": "disabled",
        "store": False, "metadata": body.get("metadata") or {},
        "usage": None if reply is None else {
            "input_tokens": reply.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": reply.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": reply.prompt_tokens + reply.completion_tokens}}
    if teamrl is not None:
        out["teamrl"] = teamrl
    return out


def response_events(final: dict[str, Any], pieces: list[str]) -> Iterator[str]:
    """The server-sent events of a streamed response: created, per-item added/delta/done, completed.

    ``final`` is the finished :func:`response_body`; ``pieces`` the message text in order (e.g. one
    per token), joined they are the message's text.
    """
    seq = iter(range(1 << 30))

    def event(kind: str, **data: Any) -> str:
        payload = {"type": kind, "sequence_number": next(seq), **data}
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    shell = {**final, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    yield event("response.created", response=shell)
    yield event("response.in_progress", response=shell)
    for index, item in enumerate(final["output"]):
        if item["type"] == "message":
            part = item["content"][0]
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "content": []})
            yield event("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                        part={**part, "text": ""})
            for piece in pieces:
                if piece:
                    yield event("response.output_text.delta", item_id=item["id"], output_index=index,
                                content_index=0, delta=piece, logprobs=[])
            yield event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                        text=part["text"], logprobs=[])
            yield event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                        part=part)
        else:
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "arguments": ""})
            yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                        delta=item["arguments"])
            yield event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                        name=item["name"], arguments=item["arguments"])
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.incomplete" if final["status"] == "incomplete" else "response.completed", response=final)
