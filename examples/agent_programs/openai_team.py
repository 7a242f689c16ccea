"""A two-role arithmetic team written against the OpenAI API: a planner restates the problem, a solver answers.

Nothing in it knows about teamrl. Against any OpenAI-compatible server serving models named
``planner`` and ``solver``::

    OPENAI_BASE_URL=http://localhost:8000/v1 OPENAI_API_KEY=... python examples/agent_programs/openai_team.py "What is 2 + 3?"

``teamrl train configs/agent_program.yaml`` trains it unchanged: teamrl calls ``solve`` once per
episode with its own endpoint's base URL and key.
"""

from __future__ import annotations

import asyncio
import sys

from openai import AsyncOpenAI

PLANNER = "You restate an arithmetic question as one expression with numbers and operators. Do not solve it."
SOLVER = "You compute arithmetic exactly. Reply with the final answer as a single number."


async def solve(question: str, base_url: str | None = None, api_key: str | None = None) -> str:
    """The team's answer to ``question`` (base_url / api_key None: OPENAI_BASE_URL / OPENAI_API_KEY)."""
    async with AsyncOpenAI(base_url=base_url, api_key=api_key) as client:  # closed on the loop that opened it
        plan = await client.chat.completions.create(
            model="planner", max_tokens=32,
            messages=[{"role": "system", "content": PLANNER}, {"role": "user", "content": question}])
        answer = await client.chat.completions.create(
            model="solver", max_tokens=16,
            messages=[{"role": "system", "content": SOLVER},
                      {"role": "user", "content": f"{question}\nExpression: {plan.choices[0].message.content}"}])
    return answer.choices[0].message.content or ""


if __name__ == "__main__":
    print(asyncio.run(solve(" ".join(sys.argv[1:]) or sys.stdin.read())))
