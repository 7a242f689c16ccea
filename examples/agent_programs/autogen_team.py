"""The same two-role team as ``openai_team.py``, written with AutoGen's AgentChat over its OpenAI model client.

Nothing in it knows about teamrl (``pip install autogen-agentchat "autogen-ext[openai]"``)::

    OPENAI_BASE_URL=http://localhost:8000/v1 OPENAI_API_KEY=... python examples/agent_programs/autogen_team.py "What is 2 + 3?"

With ``workflow.agent_program.program: examples.agent_programs.autogen_team:solve`` teamrl trains it
unchanged.
"""

from __future__ import annotations

import asyncio
import os
import sys

from autogen_agentchat.agents import AssistantAgent
from autogen_ext.models.openai import OpenAIChatCompletionClient

PLANNER = "You restate an arithmetic question as one expression with numbers and operators. Do not solve it."
SOLVER = "You compute arithmetic exactly. Reply with the final answer as a single number."
# AutoGen knows the capabilities of OpenAI's own model names only; other names need them spelled out
MODEL_INFO = {"vision": False, "function_calling": True, "json_output": False, "family": "unknown",
              "structured_output": False}


async def solve(question: str, base_url: str | None = None, api_key: str | None = None) -> str:
    """The team's answer to ``question`` (base_url / api_key None: OPENAI_BASE_URL / OPENAI_API_KEY)."""
    url, key = base_url or os.environ["OPENAI_BASE_URL"], api_key or os.environ["OPENAI_API_KEY"]
    clients = [OpenAIChatCompletionClient(model=name, base_url=url, api_key=key, max_tokens=tokens,
                                          model_info=MODEL_INFO)  # type: ignore[arg-type]
               for name, tokens in (("planner", 32), ("solver", 16))]
    try:
        planner = AssistantAgent("planner", model_client=clients[0], system_message=PLANNER)
        solver = AssistantAgent("solver", model_client=clients[1], system_message=SOLVER)
        plan = await planner.run(task=question)
        answer = await solver.run(task=f"{question}\nExpression: {plan.messages[-1].to_text()}")
        return answer.messages[-1].to_text()
    finally:
        for client in clients:
            await client.close()


if __name__ == "__main__":
    print(asyncio.run(solve(" ".join(sys.argv[1:]) or sys.stdin.read())))
