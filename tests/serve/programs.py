"""Agent programs the endpoint tests run: each records what it saw in ``SEEN`` (by question)."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai

SEEN: dict[str, dict] = {}


def _client(base_url: str, api_key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)


async def two_roles(question: str, base_url: str, api_key: str) -> str:
    """planner (plain call) then coder (streamed, with usage); records both responses."""
    client = _client(base_url, api_key)
    plan_msgs = [{"role": "system", "content": "Plan in one line."}, {"role": "user", "content": question}]
    plan = await client.chat.completions.create(model="planner", messages=plan_msgs, max_tokens=6)
    code_msgs = [{"role": "user", "content": f"{question}\nPlan: {plan.choices[0].message.content}"}]
    stream = await client.chat.completions.create(model="coder", messages=code_msgs, stream=True,
                                                  stream_options={"include_usage": True}, temperature=0.3)
    pieces, usage, finish = [], None, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    SEEN[question] = {"plan": plan, "plan_msgs": plan_msgs, "code_msgs": code_msgs, "code_text": "".join(pieces),
                      "code_usage": usage, "code_finish": finish}
    return "".join(pieces)


async def probe_errors(question: str, base_url: str, api_key: str) -> str:
    """Auth and model-name errors, seen over plain HTTP."""
    out = {}
    body = {"model": "planner", "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(timeout=60) as http:
        out["no_token"] = (await http.post(f"{base_url}/chat/completions", json=body)).status_code
        r = await http.post(f"{base_url}/chat/completions", json=body, headers={"Authorization": "Bearer nope"})
        out["wrong_token"] = (r.status_code, r.json()["error"]["type"])
        auth = {"Authorization": f"Bearer {api_key}"}
        r = await http.post(f"{base_url}/chat/completions", json={**body, "model": "planer"}, headers=auth)
        out["unknown_model"] = (r.status_code, r.json()["error"])
        r = await http.post(f"{base_url}/chat/completions", json={**body, "n": 2}, headers=auth)
        out["n2"] = r.status_code
        r = await http.post(f"{base_url}/chat/completions", content=b"{not json", headers=auth)
        out["bad_json"] = r.status_code
        r = await http.get(f"{base_url}/models", headers=auth)
        out["models"] = [m["id"] for m in r.json()["data"]]
    SEEN[question] = out
    return "done"


async def completions(question: str, base_url: str, api_key: str) -> str:
    """/v1/completions: a string prompt, then streamed."""
    client = _client(base_url, api_key)
    first = await client.completions.create(model="planner", prompt=question, max_tokens=5)
    pieces = []
    usage = None
    stream = await client.completions.create(model="coder", prompt=question, max_tokens=5, stream=True,
                                             stream_options={"include_usage": True})
    async for chunk in stream:
        usage = chunk.usage or usage
        pieces.extend(c.text for c in chunk.choices)
    SEEN[question] = {"first": first, "streamed": "".join(pieces), "usage": usage}
    return first.choices[0].text


TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                                                           "b": {"type": "number"}}}}}]


async def tool_loop(question: str, base_url: str, api_key: str) -> str:
    """Offer a tool, run the call, send the result back as a tool message; a malformed call is recorded."""
    client = _client(base_url, api_key)
    msgs = [{"role": "user", "content": question}]
    first = await client.chat.completions.create(model="planner", messages=msgs, tools=TOOLS)
    msg = first.choices[0].message
    record = {"first": first}
    if msg.tool_calls:
        args = json.loads(msg.tool_calls[0].function.arguments)
        msgs += [msg.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": str(args["a"] + args["b"])}]
        second = await client.chat.completions.create(model="planner", messages=msgs, tools=TOOLS)
        record |= {"second": second, "msgs": msgs}
        msg = second.choices[0].message
    SEEN[question] = record
    return msg.content or ""


async def crash(question: str, base_url: str, api_key: str) -> str:
    await _client(base_url, api_key).chat.completions.create(model="planner", messages=[{"role": "user", "content": question}])
    raise RuntimeError("the program broke")


async def garbage(question: str) -> int:
    return 42


async def hang(question: str, base_url: str, api_key: str) -> str:
    await _client(base_url, api_key).chat.completions.create(model="planner", messages=[{"role": "user", "content": question}])
    await asyncio.sleep(3600)
    return "never"


async def posts(question: str, base_url: str, api_key: str, result_url: str, reward_url: str) -> str:
    """Posts its answer and a per-call reward; returns something else."""
    reply = await _client(base_url, api_key).chat.completions.create(
        model="planner", messages=[{"role": "user", "content": question}])
    auth = {"Authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(timeout=60) as http:
        await http.post(result_url, json={"answer": "posted 5"}, headers=auth)
        await http.post(reward_url, json={"id": reply.id, "reward": 0.25}, headers=auth)
    return "returned"
