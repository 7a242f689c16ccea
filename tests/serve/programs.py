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


REQUESTS: dict[str, list[tuple[str, str, object]]] = {}
"""Raw requests ``raw_requests`` sends, by question: (route under the episode, body kind, body)."""


async def raw_requests(question: str, base_url: str, api_key: str, reward_url: str) -> str:
    """One valid chat call, then each request of ``REQUESTS[question]``; records (status, error) of each.

    A body kind ``json`` is sent as JSON, ``raw`` as bytes; the route ``reward`` is the reward URL
    (``{id}`` in a raw body becomes the valid call's completion id).
    """
    first = await _client(base_url, api_key).chat.completions.create(
        model="planner", messages=[{"role": "user", "content": question}])
    out = []
    auth = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=60) as http:
        for route, kind, body in REQUESTS[question]:
            url = reward_url if route == "reward" else f"{base_url}/{route}"
            if kind == "json":
                data = json.dumps(body).replace('"{id}"', json.dumps(first.id)).encode()
            else:
                data = body.replace(b"{id}", first.id.encode()) if isinstance(body, bytes) else body
            r = await http.post(url, content=data, headers=auth)
            out.append((r.status_code, r.json() if r.headers.get("content-type", "").startswith("application/json")
                        else r.text))
    SEEN[question] = {"first": first, "out": out}
    return "done"


_GLOBAL: dict[str, openai.AsyncOpenAI] = {}


async def global_client(question: str, base_url: str, api_key: str) -> str:
    """Keeps the first episode's client in module state (like a process-global default client) and uses it."""
    if "client" not in _GLOBAL:
        _GLOBAL["client"] = _client(base_url, api_key)
    await asyncio.sleep(0.05)  # let the other episodes start
    reply = await _GLOBAL["client"].chat.completions.create(
        model="planner", messages=[{"role": "user", "content": question}])
    return reply.choices[0].message.content or ""


async def stops(question: str, base_url: str, api_key: str) -> str:
    """Chat (plain and streamed) and completion calls with stop strings; records what came back."""
    client = _client(base_url, api_key)
    msgs = [{"role": "user", "content": question}]
    chat = await client.chat.completions.create(model="planner", messages=msgs, stop=[" "], logprobs=True)
    stream = await client.chat.completions.create(model="planner", messages=msgs, stop="\nObservation:", stream=True)
    pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    text = await client.completions.create(model="planner", prompt=question, stop=["ell"])
    SEEN[question] = {"chat": chat, "streamed": "".join(pieces), "text": text}
    return chat.choices[0].message.content or ""


async def responses(question: str, base_url: str, api_key: str) -> str:
    """/v1/responses: plain with instructions, then a function-call round trip, streamed."""
    client = _client(base_url, api_key)
    first = await client.responses.create(model="planner", instructions="Answer briefly.", input=question,
                                          max_output_tokens=8)
    tools = [{"type": "function", "name": "add", "description": "Add two numbers",
              "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}]
    items: list = [{"role": "user", "content": [{"type": "input_text", "text": question}]}]
    second = await client.responses.create(model="coder", input=items, tools=tools)
    calls = [o for o in second.output if o.type == "function_call"]
    items += [o.model_dump(exclude_none=True) for o in second.output]
    items += [{"type": "function_call_output", "call_id": c.call_id, "output": "5"} for c in calls]
    events = []
    async with client.responses.stream(model="coder", input=items, tools=tools) as stream:
        async for event in stream:
            events.append(event.type)
        third = await stream.get_final_response()
    SEEN[question] = {"first": first, "second": second, "third": third, "events": events, "items": items}
    return third.output_text


async def _raw(base_url: str, head: str) -> str:
    """Send only a request head (no body) and return the status line of the answer."""
    host, port = base_url.split("//")[1].split("/")[0].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head.encode())
    await writer.drain()
    status = (await asyncio.wait_for(reader.readline(), 10)).decode().strip()
    writer.close()
    return status


async def huge_heads(question: str, base_url: str, api_key: str) -> str:
    """Announce a 1 GB body and send none: the endpoint must answer from the head alone."""
    path = "/" + base_url.split("//")[1].split("/", 1)[1] + "/chat/completions"
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000000\r\n"
            "{auth}\r\n")
    SEEN[question] = {"no_token": await _raw(base_url, head.replace("{auth}", "")),
                      "token": await _raw(base_url, head.replace("{auth}", f"Authorization: Bearer {api_key}\r\n"))}
    return "done"


async def agents_sdk_tool(question: str, base_url: str, api_key: str) -> str:
    """An Agents SDK agent with a function tool, run streamed (Responses API events, function-call outputs)."""
    from agents import Agent, Runner, function_tool, set_default_openai_client, set_tracing_disabled

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    set_default_openai_client(_client(base_url, api_key))
    set_tracing_disabled(True)
    result = Runner.run_streamed(Agent(name="calc", instructions="Use the tool.", model="planner", tools=[add]),
                                 question)
    kinds = [event.type async for event in result.stream_events()]
    SEEN[question] = {"kinds": kinds}
    return str(result.final_output)
