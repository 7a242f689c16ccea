"""The same two-role team as ``openai_team.py``, written as a LangGraph graph over langchain-openai's ChatOpenAI.

Nothing in it knows about teamrl (``pip install langgraph langchain-openai``)::

    OPENAI_BASE_URL=http://localhost:8000/v1 OPENAI_API_KEY=... python examples/agent_programs/langgraph_team.py "What is 2 + 3?"

With ``workflow.agent_program.program: examples.agent_programs.langgraph_team:solve`` teamrl trains
it unchanged.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any, TypedDict

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

PLANNER = "You restate an arithmetic question as one expression with numbers and operators. Do not solve it."
SOLVER = "You compute arithmetic exactly. Reply with the final answer as a single number."


class State(TypedDict, total=False):
    question: str
    plan: str
    answer: str


def build_graph(base_url: str, api_key: str, **client: Any) -> Any:
    """The compiled graph: planner -> solver (``client``: extra ChatOpenAI options, e.g. an http client)."""
    planner = ChatOpenAI(model="planner", base_url=base_url, api_key=api_key, max_tokens=32, **client)
    solver = ChatOpenAI(model="solver", base_url=base_url, api_key=api_key, max_tokens=16, **client)

    async def plan(state: State) -> State:
        reply = await planner.ainvoke([SystemMessage(PLANNER), HumanMessage(state["question"])])
        return {"plan": reply.content}

    async def answer(state: State) -> State:
        reply = await solver.ainvoke([SystemMessage(SOLVER),
                                      HumanMessage(f"{state['question']}\nExpression: {state['plan']}")])
        return {"answer": reply.content}

    graph = StateGraph(State)
    graph.add_node("plan", plan)
    graph.add_node("answer", answer)
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "answer")
    graph.add_edge("answer", END)
    return graph.compile()


async def solve(question: str, base_url: str | None = None, api_key: str | None = None) -> str:
    """The team's answer to ``question`` (base_url / api_key None: OPENAI_BASE_URL / OPENAI_API_KEY)."""
    graph = build_graph(base_url or os.environ["OPENAI_BASE_URL"], api_key or os.environ["OPENAI_API_KEY"])
    return (await graph.ainvoke({"question": question}))["answer"]


if __name__ == "__main__":
    print(asyncio.run(solve(" ".join(sys.argv[1:]) or sys.stdin.read())))
