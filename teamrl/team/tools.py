"""Function calling: tools rendered into the prompt, tool calls parsed out of the reply.

A call with ``tools`` (OpenAI's ``[{"type": "function", "function": {name, description,
parameters}}]``) is rendered by the model's own chat template (``apply_chat_template(tools=...)``).
Templates that know nothing of tools (SmolLM2-135M's) get the Hermes block that Qwen2.5 and
SmolLM2-1.7B's templates write, in the system message, and earlier tool calls and ``role: tool``
messages are written as ``<tool_call>`` / ``<tool_response>`` text (:func:`render_messages`).

Replies are parsed per model family (:func:`parse_tool_calls`):

* ``hermes`` (SmolLM2, Qwen2.5, Qwen3): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
* ``mistral``: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``;
* ``llama3``: the whole reply is ``{"name": ..., "parameters": {...}}`` (optionally after ``<|python_tag|>``).

A reply that starts a call and breaks its format raises :class:`ToolCallError`; callers count it as
a format failure (the step is invalid), never a crash.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

FORMATS = ("hermes", "mistral", "llama3")


class ToolCallError(ValueError):
    """A reply that starts a tool call and breaks its format."""


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the function's name and its arguments as a JSON object string (OpenAI's shape)."""

    name: str
    arguments: str
    id: str = ""

    def to_openai(self, index: int) -> dict[str, Any]:
        """The call as an entry of an OpenAI ``tool_calls`` list."""
        return {"id": self.id or f"call_{index}", "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


def template_format(chat_template: str | None) -> str:
    """The tool-call format a chat template teaches (``hermes`` when it names none).

    >>> template_format("... [TOOL_CALLS] ..."), template_format("<|python_tag|>"), template_format(None)
    ('mistral', 'llama3', 'hermes')
    """
    text = chat_template or ""
    if "[TOOL_CALLS]" in text:
        return "mistral"
    if "<|python_tag|>" in text or "ipython" in text:
        return "llama3"
    return "hermes"


def _call(obj: Any, where: str) -> ToolCall:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        raise ToolCallError(f"{where}: a tool call must be a JSON object with a string 'name', got {str(obj)[:80]!r}")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError as exc:
            raise ToolCallError(f"{where}: the arguments of {obj['name']!r} are not JSON ({exc.msg})") from None
    if not isinstance(args, dict):
        raise ToolCallError(f"{where}: the arguments of {obj['name']!r} must be a JSON object, got {type(args).__name__}")
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def _json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ToolCallError(f"{where}: not valid JSON ({exc.msg} at char {exc.pos}): {text[:80]!r}") from None


_HERMES = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


def parse_tool_calls(text: str, fmt: str = "hermes") -> tuple[str, list[ToolCall]]:
    """Split a reply into its text content and its tool calls.

    Returns ``(content, calls)``; a reply without calls is ``(text, [])``.

    Raises:
        ToolCallError: a call is started but malformed (unclosed, not JSON, no name).
        ValueError: ``fmt`` is not one of :data:`FORMATS`.

    >>> parse_tool_calls('Let me look. <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
    ('Let me look.', [ToolCall(name='add', arguments='{"a": 1}', id='')])
    >>> parse_tool_calls('[TOOL_CALLS] [{"name": "f", "arguments": {}}]', "mistral")
    ('', [ToolCall(name='f', arguments='{}', id='')])
    >>> parse_tool_calls('{"name": "f", "parameters": {"x": 2}}', "llama3")[1][0].arguments
    '{"x": 2}'
    >>> parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": </tool_call>')
    Traceback (most recent call last):
    ...
    teamrl.team.tools.ToolCallError: tool call 1: not valid JSON (Expecting value at char 34): '{"name": "add", "arguments": {"a":'
    """
    if fmt == "hermes":
        calls = []
        for i, m in enumerate(_HERMES.finditer(text)):
            where = f"tool call {i + 1}"
            if not m.group(2):
                raise ToolCallError(f"{where}: <tool_call> is never closed with </tool_call>")
            calls.append(_call(_json(m.group(1).strip(), where), where))
        return (_HERMES.sub("", text).strip() if calls else text), calls
    if fmt == "mistral":
        head, sep, tail = text.partition("[TOOL_CALLS]")
        body = tail.strip() if sep else text.strip()
        if not sep and not body.startswith('[{"name"'):
            return text, []
        found = _json(body, "[TOOL_CALLS]")
        found = found if isinstance(found, list) else [found]
        return head.strip(), [_call(c, f"tool call {i + 1}") for i, c in enumerate(found)]
    if fmt == "llama3":
        body = text.strip()
        tagged = body.startswith("<|python_tag|>")
        body = body.removeprefix("<|python_tag|>").strip()
        if not tagged and not body.startswith("{"):
            return text, []
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            if tagged:
                raise ToolCallError(f"<|python_tag|> call: not valid JSON: {body[:80]!r}") from None
            return text, []  # prose that happens to start with a brace
        if not tagged and not (isinstance(obj, dict) and "name" in obj):
            return text, []
        return "", [_call(obj, "tool call 1")]
    raise ValueError(f"tool-call format {fmt!r} is not one of {FORMATS}")


def tools_block(tools: list[dict[str, Any]]) -> str:
    """The Hermes tools section (Qwen2.5's wording) for templates without tool support.

    >>> print(tools_block([{"type": "function", "function": {"name": "add"}}]).splitlines()[0])
    # Tools
    """
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            f"{lines}\n</tools>\n\nFor each function call, return a json object with function name and "
            "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def _call_text(call: dict[str, Any]) -> str:
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass  # keep the program's text as it was sent
    return "<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": args}, ensure_ascii=False) + "\n</tool_call>"


def render_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    chat_template: str | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Messages (and tools) ready for ``apply_chat_template``.

    A template that uses ``tools`` gets everything as sent. Otherwise the tools block joins the
    system message, assistant ``tool_calls`` become ``<tool_call>`` text and ``role: tool`` messages
    become user turns wrapped in ``<tool_response>``; ``None`` contents become empty strings.
    Returns ``(messages, tools)``, where tools is None when they were written into the messages.

    >>> msgs, _ = render_messages([{"role": "tool", "content": "3"}], None, "{{ messages }}")
    >>> msgs
    [{'role': 'user', 'content': '<tool_response>\\n3\\n</tool_response>'}]
    """
    template = chat_template or ""
    if "tools" in template and "tool_calls" in template:
        return [m if m.get("content") is not None else {**m, "content": ""} for m in messages], tools
    out: list[dict[str, Any]] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts: the text parts in order
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        content = content or ""
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = "\n".join(_call_text(c) for c in m["tool_calls"])
            out.append({"role": "assistant", "content": f"{content}\n{calls}".strip()})
        elif m.get("role") == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
        else:
            out.append({"role": m.get("role", "user"), "content": content})
    if tools:
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{tools_block(tools)}".strip()}
        else:
            out.insert(0, {"role": "system", "content": tools_block(tools)})
    return out, None
