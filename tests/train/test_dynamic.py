"""Dynamic sampling through the trainer: uniform groups are dropped before the update, counts are logged."""

from __future__ import annotations

import json

import pytest

from teamrl.config import tools as configtools
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
    resumed = Trainer(tiny_config(tmp_path, tiny_model_dir, "resumed", *extra), resume=True, allow_change=("train.steps",), progress=False)
    resumed.train()
    after = weights(straight)
    for k, w in weights(resumed).items():
        torch.testing.assert_close(w, after[k], atol=0, rtol=0, msg=k)
    rows = metric_rows(tmp_path / "straight")
    assert rows == metric_rows(tmp_path / "resumed") and any(r["dynamic/steps_dropped"] for r in rows)


# PettingLLMs' group filter (algo.group_filter): per model, advantages computed again over what is kept.

def _step(prompt: int, episode: int, agent: str, model: str, reward: float):
    from teamrl.team.records import Step

    return Step(prompt_index=prompt, episode=episode, agent=agent, agent_call=0, model=model, prompt_ids=[1],
                response_ids=[2], logprobs=[-1.0], temperature=1.0, text="", valid=True, reward=reward)


def test_filter_steps_acts_per_model_and_recomputes_advantages():
    from teamrl.algos.advantages import get_estimator
    from teamrl.scoring.selection import filter_steps

    # drmas groups (prompt, agent); solver on model a, verifier on model b
    rows = [(0, 0, "solver", "a", 1.0), (0, 1, "solver", "a", 0.0), (0, 2, "solver", "a", 0.0),  # mean 1/3
            (1, 3, "solver", "a", 1.0), (1, 4, "solver", "a", 1.0), (1, 5, "solver", "a", 0.0),  # mean 2/3
            (0, 0, "verifier", "b", 0.0), (0, 1, "verifier", "b", 0.0), (0, 2, "verifier", "b", 1.0)]  # mean 1/3
    steps = [_step(*r) for r in rows]
    kept, metrics = filter_steps(steps, get_estimator("drmas"), method="mean", ratio=0.5, eps=1e-6)
    # model a: int(2 * .5) = 1 group dropped, prompt 0's (mean 1/3 < 2/3); model b: int(1 * .5) = 0 dropped
    assert [(s.prompt_index, s.agent) for s in kept] == [(1, "solver")] * 3 + [(0, "verifier")] * 3
    assert metrics == {"filter/steps": 9.0, "filter/steps_kept": 6.0, "filter/steps_dropped": 3.0}
    # uid: each group of 3 drops int(3 * .5) = 1 row, the farthest from its mean; advantages over the two left
    steps = [_step(*r) for r in rows]
    kept, _ = filter_steps(steps, get_estimator("drmas"), method="uid", ratio=0.5, eps=1e-6)
    # prompt 0 solver (1, 0, 0): mean 1/3, the 1 is farthest -> (0, 0) left, advantages 0
    # prompt 1 solver (1, 1, 0): mean 2/3, the 0 is farthest -> (1, 1) left, advantages 0
    assert [s.episode for s in kept if s.agent == "solver"] == [1, 2, 3, 4]
    assert all(s.advantage == 0.0 for s in kept)


def test_a_group_filter_run_trains_on_the_kept_steps(tmp_path, tiny_model_dir):
    _register_reply_length_task()
    cfg = tiny_config(tmp_path, tiny_model_dir, "filtered", "eval.before=false", "eval.after=false", "train.steps=1",
                      "task.name=reply_length", "algo.format_penalty=0", "algo.group_filter=mean",
                      "algo.group_filter_ratio=0.5")
    Trainer(cfg, progress=False).train()
    row = json.loads((tmp_path / "filtered" / "metrics.jsonl").read_text().splitlines()[0])
    assert 0 < row["filter/steps_kept"] < row["filter/steps"]
    assert row["loss/main/rows"] == row["filter/steps_kept"]


@pytest.mark.parametrize("extra, message", [
    (("algo.group_filter=mean",), "group_filter_ratio 0.0 must be in"),
    (("algo.group_filter=dapo", "algo.group_filter_ratio=0.5"), "no effect"),
    (("algo.group_filter=dapo", "algo.dynamic_sampling=true"), "use one of them"),
])
def test_group_filter_settings_are_checked(tmp_path, tiny_model_dir, extra, message):
    with pytest.raises(configtools.ConfigError, match=message):
        tiny_config(tmp_path, tiny_model_dir, "bad", *extra)
