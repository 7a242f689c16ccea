"""Stop strings end a reply as OpenAI's do: the text excludes them and the recorded tokens are the returned ones."""

from __future__ import annotations

import pytest

pytest.importorskip("openai", reason="the endpoint tests drive it with the openai client (pip install openai)")
pytest.importorskip("starlette", reason="the endpoint needs starlette and uvicorn")

from tests.serve import programs  # noqa: E402
from tests.serve.test_endpoint import Scripted, problems, rollout  # noqa: E402


def test_stop_strings_cut_text_tokens_and_logprobs_alike(tokenizer):
    eng = Scripted(tokenizer, ["To add 2", "Thought: x\nObservation: y", "hello world"])
    ep, = rollout(tokenizer, eng, program="tests.serve.programs:stops").collect(problems(1, "stop"), 1,
                                                                                 progress=False)
    seen = programs.SEEN["stop: what is 0 + 2?"]
    chat, streamed, text = ep.steps
    assert seen["chat"].choices[0].message.content == "To" == chat.text  # OpenAI returns "To", not "To add"
    assert tokenizer.decode(chat.response_ids) == "To" and len(chat.logprobs) == len(chat.response_ids)
    assert [t.token for t in seen["chat"].choices[0].logprobs.content] == ["To"]
    assert seen["chat"].choices[0].finish_reason == "stop"
    assert seen["streamed"] == "Thought: x" == streamed.text == tokenizer.decode(streamed.response_ids)
    assert len(streamed.logprobs) == len(streamed.response_ids)
    # "ell" starts inside the token "hello": the token is not returned, so neither is any text
    assert seen["text"].choices[0].text == "" == text.text and text.response_ids == [] and text.logprobs == []
    assert seen["text"].usage.completion_tokens == 0
