"""The same two-role team as ``openai_team.py``, written with the OpenAI Agents SDK in its default setup.

Nothing in it knows about teamrl (``pip install openai-agents``): the SDK's default client is set
once with the base URL and key it is given, and each agent runs through the Responses API
(``/v1/responses``), the SDK's default::

    OPENAI_BASE_URL=http://localhost:8000/v1 OPENAI_API_KEY=... python examples/agent_programs/agents_sdk_team.py "What is 2 + 3?"

With ``workflow.agent_program.program: examples.agent_programs.agents_sdk_team:solve`` teamrl trains
it unchanged.
"""

from __future__ import annotations

import asyncio
import os
import sys

from agents import Agent, Runner, set_default_openai_client, set_tracing_disabled
from openai import AsyncOpenAI

PLANNER = "You restate an arithmetic question as one expression with numbers and operators. Do not solve it."
SOLVER = "You compute arithmetic exactly. Reply with the final answer as a single number."


async def solve(question: str, base_url: str | None = None, api_key: str | None = None) -> str:
    """The team's answer to ``question`` (base_url / api_key None: OPENAI_BASE_URL / OPENAI_API_KEY)."""
    set_default_openai_client(AsyncOpenAI(base_url=base_url or os.environ["OPENAI_BASE_URL"],
                                          api_key=api_key or os.environ["OPENAI_API_KEY"]))
    set_tracing_disabled(True)  # traces would be uploaded to OpenAI's servers
    planner = Agent(name="planner", instructions=PLANNER, model="planner")
    solver = Agent(name="solver", instructions=SOLVER, model="solver")
    plan = await Runner.run(planner, question)
    answer = await Runner.run(solver, f"{question}\nExpression: {plan.final_output}")
    return str(answer.final_output)


if __name__ == "__main__":
    print(asyncio.run(solve(" ".join(sys.argv[1:]) or sys.stdin.read())))
