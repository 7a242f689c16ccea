"""The agent-program endpoint answers a call over the model's context limit with OpenAI's 400
``context_length_exceeded`` (nothing reaches the model, the episode goes on); the tiny model's limit is 512."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("openai", reason="the endpoint tests drive it with the openai client (pip install openai)")
pytest.importorskip("starlette", reason="the endpoint needs starlette and uvicorn")

import httpx  # noqa: E402

from teamrl.domains.math.arith import ArithConfig, ArithTask  # noqa: E402
from teamrl.engines.base import SamplingParams  # noqa: E402
from teamrl.engines.hf import HFEngine  # noqa: E402
from teamrl.serve.agent_program import AgentProgramConfig  # noqa: E402
from teamrl.tasks.base import Problem  # noqa: E402
from teamrl.team.agents import get_agent  # noqa: E402
from teamrl.team.team import AgentBinding, Dispatcher  # noqa: E402
from teamrl.team.workflows import get_workflow  # noqa: E402
from teamrl.train.rollout import Rollout  # noqa: E402
from tests.conftest import make_tiny_model  # noqa: E402

SEEN: dict[str, dict] = {}


async def over_long(question: str, base_url: str, api_key: str) -> str:
    """A call that fits, one whose prompt tokens do not, and a 100,000-message request."""
    auth = {"Authorization": f"Bearer {api_key}"}
    out: dict = {}
    async with httpx.AsyncClient(timeout=120) as http:
        fits = {"model": "planner", "messages": [{"role": "user", "content": question}], "max_tokens": 4}
        out["fits"] = (await http.post(f"{base_url}/chat/completions", json=fits, headers=auth)).status_code
        long = {**fits, "messages": [{"role": "user", "content": "What is 3 + 4? " * 200}]}
        r = await http.post(f"{base_url}/chat/completions", json=long, headers=auth)
        out["long"] = (r.status_code, r.json())
        start = time.perf_counter()
        many = {**fits, "messages": [{"role": "user", "content": "hi"}] * 100_000}
        r = await http.post(f"{base_url}/chat/completions", json=many, headers=auth)
        out["many"] = (r.status_code, r.json()["error"]["code"], time.perf_counter() - start)
        r = await http.post(f"{base_url}/completions", json={"model": "planner", "prompt": [1] * 600}, headers=auth)
        out["ids"] = (r.status_code, r.json()["error"]["code"])
    SEEN[question] = out
    return "done"


def test_over_long_calls_get_openais_context_length_error(tokenizer) -> None:
    cfg = AgentProgramConfig(models={"planner": "planner"}, program="tests.serve.test_context_limit:over_long")
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    bindings = {a: AgentBinding(get_agent(a), "m", sp, "") for a in cfg.agents}
    engine = HFEngine(make_tiny_model(tokenizer), tokenizer, seed=0)
    ro = Rollout(Dispatcher({"m": engine}), bindings, get_workflow("agent_program"), cfg, ArithTask(ArithConfig()))
    problem = Problem(id="ctx", question="ctx: what is 1 + 2?", answer="3")
    ep, = ro.collect([problem], 1, progress=False)
    seen = SEEN[problem.question]
    assert ep.error is None and len(ep.steps) == 1 and seen["fits"] == 200  # only the call that fits was made
    status, body = seen["long"]
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"  # the old code answered 200
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == "messages"
    assert "maximum context length is 512 tokens" in body["error"]["message"]
    status, code, seconds = seen["many"]
    assert (status, code) == (400, "context_length_exceeded") and seconds < 30
    assert seen["ids"] == (400, "context_length_exceeded")  # /v1/completions with 600 token ids
