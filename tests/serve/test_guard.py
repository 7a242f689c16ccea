"""Limits of the agent endpoint: rewards, malformed requests, body size and nesting, all as 4xx in OpenAI's shape."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from teamrl.serve.guard import check_reward, json_depth, parse_json, read_body
from teamrl.serve.openai_api import ApiError

pytest.importorskip("openai", reason="the endpoint tests drive it with the openai client (pip install openai)")
pytest.importorskip("starlette", reason="the endpoint needs starlette and uvicorn")

from tests.serve import programs  # noqa: E402
from tests.serve.test_endpoint import Scripted, problems, rollout  # noqa: E402


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e308, -1e7, 10**400, "1", None, True])
def test_check_reward_refuses_what_is_not_a_finite_number_in_range(value):
    with pytest.raises(ApiError) as err:
        check_reward(value)
    assert err.value.status == 400 and err.value.param == "reward"


def test_check_reward_keeps_the_range():
    assert check_reward(1e6) == 1e6 and check_reward(-3) == -3.0 and check_reward(0.25) == 0.25


def test_parse_json_limits_depth_and_refuses_nan():
    assert json_depth([[{"a": []}]]) == 4  # list, list, dict, list: hand-counted
    assert parse_json(b"[" * 64 + b"]" * 64) is not None
    for body in (b"[" * 65 + b"]" * 65, b"[" * 100_000 + b"]" * 100_000, b'{"reward": NaN}', b"\xff", b"{"):
        with pytest.raises(ApiError) as err:
            parse_json(body)
        assert err.value.status == 400


def test_read_body_stops_at_the_limit():
    async def chunks(n):
        for _ in range(n):
            yield b"x" * 1000

    assert len(asyncio.run(read_body(chunks(3), None, 3000))) == 3000
    with pytest.raises(ApiError) as err:
        asyncio.run(read_body(chunks(5), None, 3000))  # no length announced: refused while reading
    assert err.value.status == 413 and "3000" in str(err.value)
    with pytest.raises(ApiError):
        asyncio.run(read_body(chunks(0), "3001", 3000))  # announced: refused before reading


CHAT = "chat/completions"
MSG = [{"role": "user", "content": "hi"}]
BAD = [  # (route, kind, body, param the error names or None)
    ("reward", "raw", b'{"id": "{id}", "reward": NaN}', None),
    ("reward", "raw", b'{"id": "{id}", "reward": Infinity}', None),
    ("reward", "raw", b'{"id": "{id}", "reward": 1e308}', "reward"),
    ("reward", "raw", b'{"id": "{id}", "reward": -1e7}', "reward"),
    ("reward", "json", {"id": ["x"], "reward": 1}, "id"),
    (CHAT, "json", {"model": "planner", "messages": [{"role": "user", "content": 5}]}, "messages[0]"),
    (CHAT, "json", {"model": "planner", "messages": [{"role": "user", "content": {"a": 1}}]}, "messages[0]"),
    (CHAT, "json", {"model": "planner", "messages": [{"role": {"x": 1}, "content": "hi"}]}, "messages"),
    (CHAT, "json", {"model": "planner", "messages": MSG, "stop": 5}, "stop"),
    (CHAT, "json", {"model": "planner", "messages": MSG, "stream_options": ["include_usage"]}, "stream_options"),
    (CHAT, "json", {"model": "planner", "messages": MSG, "stream": "yes"}, "stream"),
    (CHAT, "json", {"model": "planner", "messages": MSG, "tools": [{"type": "function", "function": 3}]}, "tools"),
    (CHAT, "json", {"model": "planner", "messages": [{"role": "assistant", "content": None, "tool_calls": [1]}]},
     "messages[0]"),
    (CHAT, "raw", b"[" * 100_000 + b"]" * 100_000, None),
    (CHAT, "raw", b'{"model": "planner", "messages": ' + b"[" * 70 + b"]" * 70 + b"}", None),
    (CHAT, "json", {"model": "planner", "messages": MSG, "response_format": {"type": "json_object"}},
     "response_format"),
    (CHAT, "json", {"model": "planner", "messages": MSG,
                    "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
     "response_format"),
    (CHAT, "json", {"model": "planner", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "data:,"}}]}]},
     "messages[0]"),
    ("completions", "json", {"model": "planner", "prompt": [1, 2, 10**9]}, "prompt"),
    ("completions", "json", {"model": "planner", "prompt": [-1]}, "prompt"),
    ("responses", "json", {"model": "planner", "input": [{"role": "user", "content": 5}]}, "input[0]"),
    ("responses", "json", {"model": "planner", "input": "hi", "previous_response_id": "resp_1"},
     "previous_response_id"),
    ("responses", "json", {"model": "planner", "input": "hi", "text": {"format": {"type": "json_object"}}},
     "text.format"),
    ("responses", "json", {"model": "planner", "input": "hi", "tools": [{"type": "web_search"}]}, "tools"),
    ("responses", "json", {"model": "planner", "input": [{"type": "reasoning", "summary": []}]}, "input"),
]


def test_malformed_requests_get_a_4xx_in_openais_shape_and_reach_no_model(tokenizer):
    question = "bad: what is 0 + 2?"
    programs.REQUESTS[question] = [(route, kind, body) for route, kind, body, _ in BAD] + [
        ("reward", "json", {"id": "{id}", "reward": 0.5})]
    ep, = rollout(tokenizer, Scripted(tokenizer, ["ok"]), program="tests.serve.programs:raw_requests").collect(
        problems(1, "bad"), 1, progress=False)
    out = programs.SEEN[question]["out"]
    assert ep.error is None and len(ep.steps) == 1  # only the one valid call reached the model
    for (route, _, body, param), (status, error) in zip(BAD, out):
        assert status == 400, (route, body, status, error)
        assert set(error["error"]) == {"message", "type", "param", "code"}, error
        assert error["error"]["type"] == "invalid_request_error" and error["error"]["message"]
        if param is not None:
            assert error["error"]["param"] == param, (body, error)
    messages = [e["error"]["message"] for _, e in out[:-1]]
    assert "NaN" in messages[0] and "Infinity" in messages[1] and "1e+308" in messages[2]
    assert "json_object" in messages[15] and "image_url" in messages[17] and "1000000000" in messages[18]
    assert out[-1] == (200, {"ok": True}) and ep.step_rewards == {0: 0.5}  # only the valid reward reached the run


def test_oversized_bodies_get_413_and_missing_tokens_401_without_the_body(tokenizer):
    question = "big: what is 0 + 2?"
    big = {"model": "planner", "messages": [{"role": "user", "content": "x" * 5000}]}
    programs.REQUESTS[question] = [(CHAT, "json", big)]
    ep, = rollout(tokenizer, Scripted(tokenizer, ["ok"]), program="tests.serve.programs:raw_requests",
                  max_body_bytes=4096).collect(problems(1, "big"), 1, progress=False)
    status, error = programs.SEEN[question]["out"][0]
    assert status == 413 and "4096" in error["error"]["message"] and error["error"]["code"] == "request_too_large"
    ep, = rollout(tokenizer, Scripted(tokenizer, ["ok"]), program="tests.serve.programs:huge_heads").collect(
        problems(1, "heads"), 1, progress=False)
    seen = programs.SEEN["heads: what is 0 + 2?"]  # answered from the head alone: the 1 GB body never came
    assert seen["no_token"].startswith("HTTP/1.1 401") and seen["token"].startswith("HTTP/1.1 413")


def test_the_health_route_answers_without_a_token():
    import httpx

    from teamrl.serve import endpoint

    r = httpx.get(f"{endpoint().url}/health", timeout=10)
    assert r.status_code == 200 and r.json() == {"ok": True}


def test_max_body_bytes_is_checked():
    from teamrl.serve.agent_program import AgentProgramConfig

    with pytest.raises(ValueError, match="max_body_bytes 10 must be >= 1024"):
        AgentProgramConfig(program="a:b", models={"m": "a"}, max_body_bytes=10)
    assert json.loads(json.dumps({"ok": 1}))  # the module imports without the optional packages


VALUES = [5, "x", [], {}, None, True, [{}], -1]
BASES = {
    "chat/completions": ({"model": "planner", "messages": MSG},
                         ["model", "messages", "stop", "stream", "stream_options", "max_tokens", "max_completion_tokens",
                          "tools", "tool_choice", "logprobs", "top_logprobs", "n", "response_format", "temperature",
                          "seed", "logit_bias"]),
    "completions": ({"model": "planner", "prompt": "hi"}, ["model", "prompt", "stop", "stream", "max_tokens", "echo"]),
    "responses": ({"model": "planner", "input": "hi"},
                  ["model", "input", "instructions", "tools", "tool_choice", "text", "max_output_tokens", "stream",
                   "previous_response_id", "metadata"]),
}
MESSAGE_KEYS = ["role", "content", "tool_calls", "name", "tool_call_id"]


def _fuzz() -> list[tuple[str, str, object]]:
    out = []
    for route, (base, keys) in BASES.items():
        out += [(route, "json", {**base, key: value}) for key in keys for value in VALUES]
    out += [("chat/completions", "json", {"model": "planner", "messages": [{**MSG[0], key: value}]})
            for key in MESSAGE_KEYS for value in VALUES]
    out += [("responses", "json", {"model": "planner", "input": [{"role": "user", "content": "hi", key: value}]})
            for key in ("type", "role", "content", "call_id", "output", "name", "arguments") for value in VALUES]
    return out


@pytest.mark.slow  # over 250 requests through the endpoint (about 16 s)
def test_no_field_of_any_type_makes_a_500(tokenizer):
    question = "fuzz: what is 0 + 2?"
    programs.REQUESTS[question] = _fuzz()
    ep, = rollout(tokenizer, Scripted(tokenizer, ["ok"]), program="tests.serve.programs:raw_requests",
                  flush_window_ms=0).collect(problems(1, "fuzz"), 1, progress=False)
    out = programs.SEEN[question]["out"]
    assert ep.error is None and len(out) == len(programs.REQUESTS[question]) > 250
    wrong = [(req, status, err) for req, (status, err) in zip(programs.REQUESTS[question], out)
             if not (status == 200 or (400 <= status < 500 and set(err["error"]) == {"message", "type", "param",
                                                                                       "code"}))]
    assert wrong == []
