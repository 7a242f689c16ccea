"""The example programs, run with an HTTP client that logs every response body (by episode URL)."""

from __future__ import annotations

import json

import httpx

LOG: dict[str, list[dict]] = {}


async def _log(response: httpx.Response) -> None:
    await response.aread()
    if response.url.path.endswith("/chat/completions"):
        episode = response.url.path.split("/")[2]
        LOG.setdefault(episode, []).append({"request": json.loads(response.request.content), "body": response.json()})


async def langgraph_solve(question: str, base_url: str, api_key: str) -> str:
    from examples.agent_programs.langgraph_team import build_graph

    async with httpx.AsyncClient(event_hooks={"response": [_log]}, timeout=600) as http:
        graph = build_graph(base_url, api_key, http_async_client=http)
        return (await graph.ainvoke({"question": question}))["answer"]


async def openai_solve(question: str, base_url: str, api_key: str) -> str:
    from openai import AsyncOpenAI

    from examples.agent_programs import openai_team

    async with httpx.AsyncClient(event_hooks={"response": [_log]}, timeout=600) as http:
        original = openai_team.AsyncOpenAI
        openai_team.AsyncOpenAI = lambda **kw: AsyncOpenAI(http_client=http, **kw)  # the program itself unchanged
        try:
            return await openai_team.solve(question, base_url, api_key)
        finally:
            openai_team.AsyncOpenAI = original
