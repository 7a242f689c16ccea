"""The openai engine against a real HTTP server on 127.0.0.1 (a tiny model served by the hf engine)."""

from __future__ import annotations

import json
import math
import socket

import pytest

from teamrl.config import tools as configtools
from teamrl.config.schema import load_config
from teamrl.engines.base import GenRequest, SamplingParams
from teamrl.engines.hf import HFEngine
from teamrl.engines.openai import OpenAIEngine, OpenAIEngineError
from teamrl.train.trainer import Trainer
from tests.conftest import make_tiny_model
from tests.engines.openai_server import CompletionsServer


@pytest.fixture(scope="module")
def server(tokenizer):
    srv = CompletionsServer(HFEngine(make_tiny_model(tokenizer, seed=3), tokenizer, seed=0))
    yield srv
    srv.close()


def prompt(tokenizer, text: str) -> list[int]:
    return list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                              tokenize=True, return_dict=False))


def test_greedy_outputs_match_the_served_engine_token_for_token(server, tokenizer):
    local = HFEngine(make_tiny_model(tokenizer, seed=3), tokenizer, seed=0)
    reqs = [GenRequest(prompt(tokenizer, q), SamplingParams(temperature=0.0, max_new_tokens=n))
            for q, n in [("1+1?", 5), ("What is 7*6?", 9), ("hi", 3)]]
    engine = OpenAIEngine(server.base_url, "tiny", tokenizer, concurrency=3)
    done = []
    outs = engine.generate(reqs, on_progress=done.append)
    want = local.generate(reqs)
    assert sum(done) == 3
    for o, w, r in zip(outs, want, reqs, strict=True):
        assert o.response_ids == w.response_ids and len(o.response_ids) <= r.sampling.max_new_tokens
        assert o.logprobs == pytest.approx(w.logprobs, abs=1e-6)
        assert o.text == w.text and o.finish_reason == w.finish_reason
    body = server.requests[-1]
    assert body["prompt"] in [r.prompt_ids for r in reqs]
    assert body["return_tokens_as_token_ids"] is True and body["logprobs"] == 1


def test_per_request_sampling_and_stop_strings_reach_the_server(server, tokenizer):
    engine = OpenAIEngine(server.base_url, "tiny", tokenizer)
    sampling = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=4, stop=("\n",))
    engine.generate([GenRequest(prompt(tokenizer, "x"), sampling)])
    body = server.requests[-1]
    assert (body["temperature"], body["top_p"], body["top_k"], body["max_tokens"], body["stop"]) == (0.7, 0.9, 20, 4, ["\n"])
    assert isinstance(body["seed"], int)


def test_sampling_is_reproducible_through_the_engine_generator(server, tokenizer):
    reqs = [GenRequest(prompt(tokenizer, "count"), SamplingParams(temperature=1.0, max_new_tokens=6))] * 3
    a = OpenAIEngine(server.base_url, "tiny", tokenizer, seed=5).generate(reqs)
    b = OpenAIEngine(server.base_url, "tiny", tokenizer, seed=5).generate(reqs)
    assert [o.response_ids for o in a] == [o.response_ids for o in b]


def served(tokenizer, req: GenRequest):
    """What the test server answers to ``req`` (its engine, a fresh copy with the same seeds)."""
    return HFEngine(make_tiny_model(tokenizer, seed=3), tokenizer, seed=0).generate([req])[0]


def test_retokenize_mode_keeps_the_servers_logprobs_where_the_counts_agree(server, tokenizer):
    """One token ("\n") re-tokenizes to itself: the ids and the server's log-probs are kept."""
    req = GenRequest(prompt(tokenizer, "q"), SamplingParams(temperature=0.0, max_new_tokens=1))
    engine = OpenAIEngine(server.base_url, "tiny", tokenizer, token_ids="retokenize")
    out, want = engine.generate([req])[0], served(tokenizer, req)
    assert out.text == want.text and out.response_ids == want.response_ids == tokenizer.encode(out.text,
                                                                                              add_special_tokens=False)
    assert out.logprobs == pytest.approx(want.logprobs, abs=1e-6) and all(v <= 0 for v in out.logprobs)


def test_retokenize_mode_gives_nan_logprobs_where_the_counts_differ(server, tokenizer):
    """Five "\n" tokens re-tokenize to two ids: the ids are rebuilt from the text, the log-probs are NaN."""
    req = GenRequest(prompt(tokenizer, "q"), SamplingParams(temperature=0.0, max_new_tokens=5))
    engine = OpenAIEngine(server.base_url, "tiny", tokenizer, token_ids="retokenize")
    out, want = engine.generate([req])[0], served(tokenizer, req)
    assert out.text == want.text and out.response_ids == tokenizer.encode(out.text, add_special_tokens=False)
    assert len(out.response_ids) == 2 and len(want.response_ids) == 5
    assert len(out.logprobs) == 2 and all(math.isnan(v) for v in out.logprobs)


def test_transient_errors_are_retried(server, tokenizer):
    engine = OpenAIEngine(server.base_url, "tiny", tokenizer, retries=2)
    server.fail_next, n = 2, len(server.requests)
    req = GenRequest(prompt(tokenizer, "q"), SamplingParams(temperature=0.0, max_new_tokens=2))
    out = engine.generate([req])
    assert server.fail_next == 0 and len(server.requests) == n + 3  # two 503s, then the answer
    assert out[0].response_ids == served(tokenizer, req).response_ids


def test_unreachable_server_names_the_url(tokenizer):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engine = OpenAIEngine(f"http://127.0.0.1:{port}/v1", "tiny", tokenizer, retries=1, timeout_s=2)
    with pytest.raises(OpenAIEngineError, match=rf"http://127.0.0.1:{port}/v1/completions failed after 2 attempts"):
        engine.generate([GenRequest([1, 2, 3], SamplingParams(max_new_tokens=2))])


def test_client_errors_fail_at_once_with_the_server_message(server, tokenizer):
    engine = OpenAIEngine(server.base_url, "no-such-model", tokenizer, retries=3)
    n = len(server.requests)
    with pytest.raises(OpenAIEngineError, match="HTTP 404.*no-such-model"):
        engine.generate([GenRequest([1, 2, 3], SamplingParams(max_new_tokens=2))])
    assert len(server.requests) == n + 1


def test_config_rejects_training_a_model_on_a_server():
    with pytest.raises(configtools.ConfigError, match="openai is rollout-only.*trainable: false"):
        load_config(None, ["models.main.engine=openai", "models.main.openai.base_url=http://x/v1"])
    with pytest.raises(configtools.ConfigError, match="frozen.*agents.solver.lr"):
        load_config(None, ["models={main: {}, judge: {trainable: false}}", "agents.solver.model=judge",
                           "agents.solver.lr=0.1"])


def test_team_trains_its_solver_with_a_frozen_verifier_on_a_server(server, tmp_path, tiny_model_dir):
    cfg = load_config(None, [
        f"run_dir={tmp_path / 'run'}", f"models.main.path={tiny_model_dir}",
        f"models.judge={{path: {tiny_model_dir}, engine: openai, trainable: false, "
        f"openai: {{base_url: '{server.base_url}', model: tiny}}}}",
        "agents.verifier.model=judge", "agents.solver.max_new_tokens=6", "agents.verifier.max_new_tokens=4",
        "rollout.batch_size=2", "rollout.group_size=2", "train.steps=2", "loss.entropy_coef=0.01",
        "eval.problems=2", "eval.samples=1", "eval.before=false", "task.arith.n_test=4",
    ])
    n = len(server.requests)
    tr = Trainer(cfg, progress=False)
    assert set(tr.learners) == {"main"} and set(tr.engines) == {"main", "judge"} and "judge" not in tr.models
    before = {k: p.detach().clone() for k, p in tr.models["main"].named_parameters()}
    tr.train()
    assert len(server.requests) - n >= 2 * 2 * 2  # every episode asked the verifier at least once per step
    assert any(not p.equal(before[k]) for k, p in tr.models["main"].named_parameters())
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["agent/verifier/calls"] >= 4 and "loss/judge/loss" not in metrics[-1]
    assert json.loads((tmp_path / "run" / "eval_after.json").read_text())["problems"] == 2
