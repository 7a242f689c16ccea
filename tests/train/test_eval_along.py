"""Held-out evaluation along the way (eval.every)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from teamrl.config.tools import ConfigError
from teamrl.train.trainer import Trainer, eval_metrics
from tests.train.test_trainer import _register_reply_length_task, tiny_config

# mixed rewards (reply-length parity), so both steps train and the weights compared below move
EXTRA = ("task.name=reply_length", "algo.format_penalty=0", "eval.problems=2", "eval.before=false", "eval.after=false")


def test_eval_metrics_flatten_nested_scores():
    result = {"accuracy": 0.25, "pass@1": 0.25, "pass@2": 0.5, "problems": 3, "samples": 2, "failed_episodes": 0,
              "calls_per_episode": {"solver": 1.0, "verifier": 1.0}, "metrics": {"em": 0.0, "f1": 0.5}}
    assert eval_metrics(result) == {
        "eval/accuracy": 0.25, "eval/pass@1": 0.25, "eval/pass@2": 0.5, "eval/problems": 3.0, "eval/samples": 2.0,
        "eval/failed_episodes": 0.0, "eval/calls_per_episode/solver": 1.0, "eval/calls_per_episode/verifier": 1.0,
        "eval/metrics/em": 0.0, "eval/metrics/f1": 0.5}


def test_eval_every_is_validated(tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError, match=r"eval.every -1 must be >= 0"):
        tiny_config(tmp_path, tiny_model_dir, "bad", "eval.every=-1")
    with pytest.raises(ConfigError, match=r"eval.every 5 is more than train.steps 2.*lower eval.every or set it to 0"):
        tiny_config(tmp_path, tiny_model_dir, "bad", "eval.every=5")


def _rows(run: Path) -> list[dict]:
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


def _weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.models["main"].named_parameters()}


def test_an_evaluation_draws_from_the_engines_generator(tmp_path, tiny_model_dir):
    """Why eval.every restores the generators: evaluating samples from the training engines' generator."""
    _register_reply_length_task()
    tr = Trainer(tiny_config(tmp_path, tiny_model_dir, "probe", *EXTRA), progress=False)
    before = tr.engines["main"].generator.get_state()
    tr.evaluate("probe")
    assert not torch.equal(before, tr.engines["main"].generator.get_state())


@pytest.mark.slow  # two runs with evaluations between steps (about 9 s)
def test_eval_every_logs_held_out_curves_and_leaves_training_unchanged(tmp_path, tiny_model_dir):
    _register_reply_length_task()
    extra = (*EXTRA, "eval.before=true")  # logged as eval/... at step 0 with eval.every
    plain = Trainer(tiny_config(tmp_path, tiny_model_dir, "plain", *extra), progress=False)
    w0 = _weights(plain)
    plain.train()
    along = Trainer(tiny_config(tmp_path, tiny_model_dir, "along", *extra, "eval.every=1"), progress=False)
    along.train()
    assert all(not torch.equal(p, w0[n]) for n, p in _weights(plain).items())  # both steps trained
    for n, p in _weights(along).items():
        torch.testing.assert_close(p, _weights(plain)[n], atol=0, rtol=0, msg=n)
    rows = _rows(tmp_path / "along")
    train_rows = [r for r in rows if "rollout/reward_mean" in r]
    eval_rows = [r for r in rows if "eval/accuracy" in r]
    assert train_rows == _rows(tmp_path / "plain")  # the same training, with or without the evaluations
    assert [r["step"] for r in rows] == [0, 0, 1, 1, 2]  # before, step 0, eval after 1 update, step 1, eval after 2
    assert [r["step"] for r in eval_rows] == [0, 1, 2]
    before = json.loads((tmp_path / "along" / "eval_before.json").read_text())
    assert eval_rows[0] == {"step": 0, **eval_metrics(before)}
    assert before == json.loads((tmp_path / "plain" / "eval_before.json").read_text())
    for r in eval_rows[1:]:  # each row is its eval_step<k>.json, recomputed from its recorded episodes
        result = json.loads((tmp_path / "along" / f"eval_step{r['step']}.json").read_text())
        assert r == {"step": r["step"], **eval_metrics(result)}
        eps = [json.loads(l) for l in (tmp_path / "along" / f"eval_step{r['step']}_episodes.jsonl").read_text().splitlines()]
        assert len(eps) == 2 * 2 and r["eval/accuracy"] == pytest.approx(sum(e["reward"] for e in eps) / len(eps))
        assert {"eval/pass@1", "eval/pass@2", "eval/calls_per_episode/solver"} <= r.keys()


@pytest.mark.slow  # about 20 s: three training runs; resume itself is covered by default in tests/train/test_resume.py
def test_resume_with_eval_every_reproduces_an_uninterrupted_run(tmp_path, tiny_model_dir):
    """Interrupted after step 1 (its checkpoint), resumed: the same weights, training rows and eval rows; the final
    evaluation (eval.after) is logged at train.steps as eval/... once."""
    _register_reply_length_task()
    extra = (*EXTRA[:-1], "eval.after=true", "eval.every=1")  # train.steps=2
    straight = Trainer(tiny_config(tmp_path, tiny_model_dir, "straight", *extra), progress=False)
    straight.train()
    # the first step of the same run (a run stopped there has no final evaluation yet)
    Trainer(tiny_config(tmp_path, tiny_model_dir, "resumed", *EXTRA, "eval.every=1", "train.steps=1"),
            progress=False).train()
    run = tmp_path / "resumed"
    assert [r["step"] for r in _rows(run)] == [0, 1]  # its eval after 1 update: dropped by the resume, redone
    resumed = Trainer(tiny_config(tmp_path, tiny_model_dir, "resumed", *extra), resume=True, allow_change=("train.steps", "eval.after"),
                      progress=False)
    assert resumed.start_step == 1
    resumed.train()
    for n, p in _weights(resumed).items():
        torch.testing.assert_close(p, _weights(straight)[n], atol=0, rtol=0, msg=n)
    rows = _rows(tmp_path / "straight")
    assert [(r["step"], "eval/accuracy" in r) for r in rows] == [(0, False), (1, True), (1, False), (2, True)]
    assert _rows(run) == rows
    assert (run / "eval_step1.json").read_text() == (tmp_path / "straight" / "eval_step1.json").read_text()
    summary = json.loads((tmp_path / "straight" / "summary.json").read_text())
    assert rows[-1] == {"step": 2, **eval_metrics(summary["after"])}
    assert not (run / "eval_step2.json").exists()  # the evaluation at train.steps is eval.after's
    # resumed once more after it finished (its final row is dropped by the resume): logged again, once
    again = Trainer(tiny_config(tmp_path, tiny_model_dir, "resumed", *extra), resume=True, allow_change=("train.steps", "eval.after"),
                      progress=False)
    assert again.start_step == 2
    again.train()
    assert _rows(run) == rows
