"""The example programs written with agent frameworks run unchanged against the endpoint, each call a Step of its episode.

Each test skips with a reason when its framework is not installed (``pip install 'teamrl[agents]'``).
"""

from __future__ import annotations

import pytest

pytest.importorskip("openai", reason="the endpoint tests drive it with the openai client (pip install openai)")
pytest.importorskip("starlette", reason="the endpoint needs starlette and uvicorn")

from tests.serve.test_endpoint import Scripted, problems, rollout  # noqa: E402

ROLES = {"planner": "planner", "solver": "coder"}


@pytest.mark.parametrize("module, needs", [
    ("openai_team", ["openai"]),
    ("langgraph_team", ["langgraph", "langchain_openai"]),
    ("agents_sdk_team", ["agents"]),
    ("autogen_team", ["autogen_agentchat", "autogen_ext.models.openai"]),
])
def test_example_program_runs_unchanged(tokenizer, module, needs):
    for name in needs:
        pytest.importorskip(name, reason="pip install 'teamrl[agents]'")
    probs = problems(3, f"fw-{module}")
    eps = rollout(tokenizer, Scripted(tokenizer, ["2 + 3", "5"]), models=ROLES,
                  program=f"examples.agent_programs.{module}:solve").collect(probs, 1, progress=False)
    for ep in eps:
        assert ep.error is None, ep.error
        assert [s.agent for s in ep.steps] == ["planner", "coder"] and ep.info.get("misaddressed_calls", 0) >= 0
        assert probs[ep.prompt_index].question in tokenizer.decode(ep.steps[0].prompt_ids)  # its own episode's call
        assert ep.final.strip() == ep.steps[1].text.strip()


def test_agents_sdk_function_tools_streamed(tokenizer):
    pytest.importorskip("agents", reason="pip install 'teamrl[agents]'")
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    eps = rollout(tokenizer, Scripted(tokenizer, [call, "The sum is 5."]),
                  program="tests.serve.programs:agents_sdk_tool").collect(problems(1, "sdktool"), 1, progress=False)
    ep, = eps
    assert ep.error is None and len(ep.steps) == 2 and ep.final == "The sum is 5."
    assert '"name": "add"' in tokenizer.decode(ep.steps[0].prompt_ids)  # the SDK's tool reached the template
    assert "<tool_response>\n5\n</tool_response>" in tokenizer.decode(ep.steps[1].prompt_ids)  # the tool ran
