"""Calls a function-mode program makes through a process-global client land in the program's own episode."""

from __future__ import annotations

import pytest

pytest.importorskip("openai", reason="the endpoint tests drive it with the openai client (pip install openai)")
pytest.importorskip("starlette", reason="the endpoint needs starlette and uvicorn")

from teamrl.train.trainer import rollout_metrics  # noqa: E402
from tests.serve.test_endpoint import Scripted, problems, rollout  # noqa: E402


def test_a_global_client_cannot_send_calls_to_another_episode(tokenizer):
    probs = problems(4, "glob")
    eps = rollout(tokenizer, Scripted(tokenizer, ["ok"]), program="tests.serve.programs:global_client").collect(
        probs, 1, progress=False)
    assert [ep.error for ep in eps] == [None] * 4
    assert [len(ep.steps) for ep in eps] == [1, 1, 1, 1]  # before: one episode held every call, the others none
    for ep in eps:  # each call is the one its own program made (its own question in the prompt)
        assert probs[ep.prompt_index].question in tokenizer.decode(ep.steps[0].prompt_ids)
    assert sorted(ep.info.get("misaddressed_calls", 0) for ep in eps) == [0, 1, 1, 1]
    metrics = rollout_metrics(eps, [s for ep in eps for s in ep.steps])
    assert metrics["agent_program/misaddressed_calls"] == 3 and metrics["rollout/episodes_without_calls"] == 0
