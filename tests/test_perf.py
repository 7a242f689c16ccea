"""Per-step throughput and MFU metrics."""

from __future__ import annotations

import json

import pytest

from teamrl.metrics.perf import ModelPerf, PerfMeter, mfu, peak_tflops
from teamrl.team.records import Step


def _step(model: str, prompt: int, response: int) -> Step:
    return Step(prompt_index=0, episode=0, agent="a", agent_call=0, model=model, prompt_ids=[1] * prompt,
                response_ids=[2] * response, logprobs=[0.0] * response, temperature=1.0, text="", valid=True)


def test_peaks_by_device_name():
    assert peak_tflops("NVIDIA H200", "bfloat16") == 989.4
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "float32") == 19.5
    assert peak_tflops("NVIDIA H100 PCIe", "bfloat16") == 756.0
    assert peak_tflops("NVIDIA GeForce RTX 4090", "bfloat16") is None


def test_tokens_per_second_and_mfu_formula(tokenizer):
    from tests.conftest import make_tiny_model

    meter = PerfMeter({"m": make_tiny_model(tokenizer)}, {"m": "float32"})
    steps = [_step("m", 10, 5), _step("m", 20, 15)]
    out = meter.metrics(steps, rollout_s=2.0, update_s=0.5, trained={"m"})
    assert out == {"perf/tokens_per_s/rollout": 25.0, "perf/tokens_per_s/update": 100.0}  # no MFU on a CPU
    assert meter.metrics(steps, 2.0, 0.5, trained=set())["perf/tokens_per_s/update"] == 0.0
    meter.models["m"] = ModelPerf(params=1_000_000_000, device="cuda:0", peak=1000.0)  # a GPU of 1000 TFLOP/s
    out = meter.metrics(steps, rollout_s=2.0, update_s=0.5, trained={"m"})
    assert out["perf/mfu/update"] == pytest.approx(6e9 * 50 / 0.5 / 1e15)
    assert out["perf/mfu/rollout"] == pytest.approx(mfu(2e9 * 50, 2.0, 1000.0))


def test_mfu_of_ray_actors_counts_the_engine_gpus_for_rollout_and_the_learner_gpus_for_update():
    """Model a: engine on its own GPU, learner on 2 more; model b: engine and learner on one GPU (a fraction each)."""
    meter = PerfMeter({}, {}, remote={
        "a": ModelPerf(params=10**9, device="n1:0", peak=1000.0, learner_devices=("n1:1", "n1:2")),
        "b": ModelPerf(params=10**8, device="n1:3", peak=500.0, learner_devices=("n1:3",)),
    })
    steps = [_step("a", 30, 10), _step("b", 15, 5)]  # 40 tokens of a, 20 of b
    out = meter.metrics(steps, rollout_s=2.0, update_s=0.5, trained={"a", "b"})
    assert out["perf/mfu/rollout"] == pytest.approx((2e9 * 40 + 2e8 * 20) / 2.0 / ((1000 + 500) * 1e12))
    assert out["perf/mfu/update"] == pytest.approx((6e9 * 40 + 6e8 * 20) / 0.5 / ((2 * 1000 + 500) * 1e12))
    only_b = meter.metrics(steps, rollout_s=2.0, update_s=0.5, trained={"b"})
    assert only_b["perf/mfu/update"] == pytest.approx(6e8 * 20 / 0.5 / (500 * 1e12))
    assert PerfMeter({}, {}, remote={"a": ModelPerf(10**9, "cpu", None)}).metrics(steps[:1], 1.0, 1.0).keys() == {
        "perf/tokens_per_s/rollout", "perf/tokens_per_s/update"}  # an unknown peak: no MFU


def test_trainer_writes_throughput(tmp_path, tiny_model_dir):
    from teamrl.config.schema import load_config
    from teamrl.train.trainer import Trainer

    cfg = load_config(None, [f"run_dir={tmp_path}", f"models.main.path={tiny_model_dir}", "rollout.batch_size=1",
                             "rollout.group_size=2", "train.steps=1", "eval.before=false", "eval.after=false",
                             "agents.solver.max_new_tokens=4", "agents.verifier.max_new_tokens=2"])
    Trainer(cfg, progress=False).train()
    m = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert m["perf/tokens_per_s/rollout"] > 0 and "perf/tokens_per_s/update" in m
    assert "perf/peak_rss_gb/update" in m
    written = (tmp_path / "config.yaml").read_text()
    assert "device: cpu" in written and "dtype: auto" not in written  # the resolved config
