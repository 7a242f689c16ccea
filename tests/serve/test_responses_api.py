"""/v1/responses through the official openai client: recorded like chat completions, function calls round-trip."""

from __future__ import annotations

import pytest

pytest.importorskip("openai", reason="the endpoint tests drive it with the openai client (pip install openai)")
pytest.importorskip("starlette", reason="the endpoint needs starlette and uvicorn")

from tests.serve import programs  # noqa: E402
from tests.serve.test_endpoint import Scripted, problems, rollout  # noqa: E402


def test_responses_are_recorded_steps_and_function_calls_round_trip(tokenizer):
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    eng = Scripted(tokenizer, ["It is 2.", call, "The sum is 5."])
    ep, = rollout(tokenizer, eng, program="tests.serve.programs:responses").collect(problems(1, "resp"), 1,
                                                                                     progress=False)
    seen = programs.SEEN["resp: what is 0 + 2?"]
    assert ep.error is None and [s.agent for s in ep.steps] == ["planner", "coder", "coder"]
    first, second, third = ep.steps
    assert seen["first"].output_text == "It is 2." == first.text and seen["first"].status == "completed"
    prompt = tokenizer.decode(first.prompt_ids)
    assert "Answer briefly." in prompt and "resp: what is 0 + 2?" in prompt  # instructions as the system turn
    assert seen["first"].usage.output_tokens == len(first.response_ids)
    assert seen["first"].model_extra["teamrl"]["token_ids"] == first.response_ids
    fc, = seen["second"].output
    assert fc.type == "function_call" and fc.name == "add" and fc.arguments == '{"a": 2, "b": 3}'
    assert '"name": "add"' in tokenizer.decode(second.prompt_ids)  # the tool reached the template
    resent = tokenizer.decode(third.prompt_ids)
    assert "<tool_response>\n5\n</tool_response>" in resent and '"arguments": {"a": 2, "b": 3}' in resent
    assert seen["third"].output_text == "The sum is 5." == third.text == ep.final
    assert seen["events"][:2] == ["response.created", "response.in_progress"]
    assert seen["events"][-1] == "response.completed" and "response.output_text.delta" in seen["events"]


def test_a_client_token_limit_makes_the_response_incomplete(tokenizer):
    eng = Scripted(tokenizer, ["one two three four five six seven eight nine ten eleven"])
    eng.generate = _cut(eng.generate, tokenizer)
    ep, = rollout(tokenizer, eng, program="tests.serve.programs:responses").collect(problems(1, "inc"), 1,
                                                                                     progress=False)
    first = programs.SEEN["inc: what is 0 + 2?"]["first"]  # max_output_tokens=8, reached
    assert first.status == "incomplete" and first.incomplete_details.reason == "max_output_tokens"
    assert programs.SEEN["inc: what is 0 + 2?"]["third"].status == "completed"  # the agent's own limit: completed


def _cut(generate, tokenizer):
    def cut(requests, on_progress=None):
        outs = generate(requests, on_progress)
        for req, out in zip(requests, outs):
            n = req.sampling.max_new_tokens
            if len(out.response_ids) >= n:
                out.response_ids, out.logprobs, out.finish_reason = out.response_ids[:n], out.logprobs[:n], "length"
                out.text = tokenizer.decode(out.response_ids)
        return outs
    return cut
