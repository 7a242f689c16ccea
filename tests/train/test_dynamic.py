"""Dynamic sampling through the trainer: uniform groups are dropped before the update, counts are logged."""

from __future__ import annotations

import json

import pytest

from teamrl import configtools
from teamrl.train.trainer import Trainer
from tests.train.test_trainer import _register_reply_length_task, tiny_config


def run(tmp_path, model_dir, name: str, *extra: str) -> tuple[Trainer, dict]:
    cfg = tiny_config(tmp_path, model_dir, name, "eval.before=false", "eval.after=false", "train.steps=1",
                      "algo.dynamic_sampling=true", "algo.dynamic_sampling_refill=1", *extra)
    trainer = Trainer(cfg, progress=False)
    trainer.train()
    return trainer, json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[0])


def test_uniform_groups_are_dropped_and_refilled(tmp_path, tiny_model_dir):
    """Random weights never answer arithmetic in format: every group is uniform, one refill round, no update."""
    trainer, row = run(tmp_path, tiny_model_dir, "uniform")
    assert row["dynamic/steps_dropped"] == row["dynamic/steps"] > 0 and row["dynamic/steps_kept"] == 0
    assert row["dynamic/refill_rounds"] == 1 and trainer.sampler.cursor == 4  # 2 problems + 2 more
    assert row["dynamic/steps"] == 2 * 2 * 3 * row["rollout/calls_per_episode"]  # 2 rounds x 2 problems x 3 episodes
    assert "loss/main/rows" not in row


def test_groups_with_reward_variance_are_trained(tmp_path, tiny_model_dir):
    """Rewarded by reply length, (problem, agent) groups vary: they are kept and only they are trained."""
    _register_reply_length_task()
    trainer, row = run(tmp_path, tiny_model_dir, "spread", "task.name=reply_length", "algo.format_penalty=0")
    assert row["dynamic/steps_kept"] > 0
    assert row["dynamic/steps_kept"] + row["dynamic/steps_dropped"] == row["dynamic/steps"]
    assert row["loss/main/rows"] == row["dynamic/steps_kept"]
    assert "mismatch/model/main/kl_k3" in row and "mismatch/solver/kl_k3" in row


def test_refill_needs_dynamic_sampling(tmp_path, tiny_model_dir):
    with pytest.raises(configtools.ConfigError, match="dynamic_sampling_refill"):
        tiny_config(tmp_path, tiny_model_dir, "bad", "algo.dynamic_sampling_refill=2")


def test_resume_with_dynamic_sampling_is_exact(tmp_path, tiny_model_dir):
    """Refill rounds move the problem sampler and the engines' generators: both are checkpointed."""
    import torch

    from tests.train.test_resume import metric_rows, weights

    _register_reply_length_task()
    extra = ("task.name=reply_length", "algo.format_penalty=0", "eval.before=false", "eval.after=false",
             "algo.dynamic_sampling=true", "algo.dynamic_sampling_refill=1", "rollout.group_size=2")
    straight = Trainer(tiny_config(tmp_path, tiny_model_dir, "straight", *extra), progress=False)
    straight.train()
    Trainer(tiny_config(tmp_path, tiny_model_dir, "resumed", *extra, "train.steps=1"), progress=False).train()
    resumed = Trainer(tiny_config(tmp_path, tiny_model_dir, "resumed", *extra), resume=True, progress=False)
    resumed.train()
    after = weights(straight)
    for k, w in weights(resumed).items():
        torch.testing.assert_close(w, after[k], atol=0, rtol=0, msg=k)
    rows = metric_rows(tmp_path / "straight")
    assert rows == metric_rows(tmp_path / "resumed") and any(r["dynamic/steps_dropped"] for r in rows)
