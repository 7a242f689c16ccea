"""Update schedules: sync (every rollout) and async per-model buffers with a policy-lag bound."""

from __future__ import annotations

import json

import pytest
import torch

from teamrl.team.records import Step
from teamrl.train.updates import AsyncUpdates
from tests.train.test_trainer import tiny_config


class RecordingLearner:
    """Records the steps of each update (the schedule under test decides which steps those are)."""

    def __init__(self):
        self.updates: list[list[int]] = []

    def update(self, steps, step=None):
        self.updates.append([s.episode for s in steps])
        return {"grad_norm": 1.0}


def steps(first: int, n: int, model: str = "m") -> list[Step]:
    return [Step(prompt_index=0, episode=first + i, agent="a", agent_call=0, model=model, prompt_ids=[1], response_ids=[2],
                 logprobs=[-1.0], temperature=1.0, text="", valid=True) for i in range(n)]


def test_async_buffer_waits_carries_over_and_bounds_the_lag():
    lr = RecordingLearner()
    up = AsyncUpdates({"m": lr}, min_steps=10, max_steps=8, max_lag=1)
    _, m0 = up.run(steps(0, 6))  # 6 < 10: wait
    assert lr.updates == [] and m0["buffer/m/updated"] == 0.0 and m0["buffer/m/left"] == 6
    _, m1 = up.run(steps(6, 6))  # 12 >= 10: train the oldest 8, keep 4 (now one version old)
    assert lr.updates == [list(range(8))] and m1["buffer/m/left"] == 4 and m1["buffer/m/lag_max"] == 0
    _, m2 = up.run(steps(12, 6))  # 4 old (lag 1 <= 1) + 6 new = 10: train 8 of them
    assert lr.updates[-1] == list(range(8, 16)) and m2["buffer/m/lag_max"] == 1 and m2["buffer/m/lag_mean"] == 0.5
    assert m2["buffer/m/dropped"] == 0 and m2["buffer/m/version"] == 2


def test_async_drops_steps_older_than_max_policy_lag():
    lr = RecordingLearner()
    up = AsyncUpdates({"m": lr}, min_steps=10, max_steps=8, max_lag=0)
    up.run(steps(0, 6))
    up.run(steps(6, 6))  # trains 0..7, keeps 8..11
    _, m = up.run(steps(12, 6))  # 8..11 are one update old > max_lag 0: dropped; 6 < 10 left
    assert m["buffer/m/dropped"] == 4 and m["buffer/m/updated"] == 0 and len(lr.updates) == 1


def test_async_models_update_independently_and_log_teammate_lag():
    a, b = RecordingLearner(), RecordingLearner()
    up = AsyncUpdates({"a": a, "b": b}, min_steps=4, max_steps=0, max_lag=1)
    up.run(steps(0, 4, "a") + steps(10, 2, "b"))  # a updates (v1), b waits
    _, m = up.run(steps(4, 1, "a") + steps(12, 2, "b"))  # b: 4 steps, 2 born before a's update
    assert len(a.updates) == 1 and b.updates == [[10, 11, 12, 13]]
    assert m["buffer/b/team_lag_mean"] == 0.5 and m["buffer/b/lag_max"] == 0


def test_sync_and_async_state_round_trips():
    up = AsyncUpdates({"m": RecordingLearner()}, min_steps=10, max_steps=0, max_lag=1)
    up.run(steps(0, 3))
    again = AsyncUpdates({"m": RecordingLearner()}, min_steps=10, max_steps=0, max_lag=1)
    again.load_state_dict(up.state_dict())
    assert [s.episode for s, _ in again.buffers["m"]] == [0, 1, 2] and again.versions == up.versions


def _metrics(run):
    return [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]


def test_async_training_waits_for_the_buffer_and_resumes_exactly(tmp_path, tiny_model_dir):
    """On a task where random weights get mixed rewards, so both updates train rows and the resume is compared
    on weights that moved."""
    from teamrl.train.trainer import Trainer
    from tests.train.test_trainer import _register_reply_length_task

    _register_reply_length_task()
    extra = ("workflow.name=single", "agents={solver: {max_new_tokens: 6}}", "train.update_mode=async",
             "train.min_buffer_steps=10", "train.max_update_steps=8", "eval.before=false", "eval.after=false",
             "train.steps=3", "task.name=reply_length", "algo.format_penalty=0")
    straight = Trainer(tiny_config(tmp_path, tiny_model_dir, "straight", *extra), progress=False)
    w0 = {n: p.detach().clone() for n, p in straight.models["main"].named_parameters()}
    straight.train()
    m = _metrics(tmp_path / "straight")
    # 6 single-call episodes per step: 6 (wait), 12 (train 8, keep 4), 10 (train 8: 4 one update old)
    assert [x["buffer/main/updated"] for x in m] == [0.0, 1.0, 1.0]
    assert [x["buffer/main/lag_max"] for x in m] == [0.0, 0.0, 1.0]
    assert "loss/main/grad_norm" not in m[0] and "loss/main/rows" in m[1]
    assert m[1]["loss/main/rows_trained"] > 0 and m[2]["loss/main/rows_trained"] > 0  # non-zero advantages
    assert all(not torch.equal(p, w0[n]) for n, p in straight.models["main"].named_parameters())
    first = Trainer(tiny_config(tmp_path, tiny_model_dir, "resumed", *extra, "train.steps=2"), progress=False)
    first.train()
    second = Trainer(tiny_config(tmp_path, tiny_model_dir, "resumed", *extra), resume=True, allow_change=("train.steps",), progress=False)
    second.train()
    for (n, p), (_, q) in zip(straight.models["main"].named_parameters(),
                              second.models["main"].named_parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=0, rtol=0, msg=n)


def test_async_needs_engine_logprobs(tmp_path, tiny_model_dir):
    from teamrl.config.tools import ConfigError

    with pytest.raises(ConfigError, match="old_logprobs: engine"):
        tiny_config(tmp_path, tiny_model_dir, "x", "train.update_mode=async", "loss.old_logprobs=recompute")
    with pytest.raises(ConfigError, match="apply to train.update_mode: async"):
        tiny_config(tmp_path, tiny_model_dir, "x", "train.min_buffer_steps=4")


def test_tree_run_with_rerun_credit_and_sharp_run(tmp_path, tiny_model_dir):
    """One step each: math_tree + tree groups + Shapley by rerun; math_team + Shapley by replay + overlong."""
    from teamrl.train.trainer import Trainer

    common = ("train.steps=1", "eval.before=false", "eval.after=false")
    tree = Trainer(tiny_config(tmp_path, tiny_model_dir, "tree", *common, "workflow.name=math_tree",
                               "agents={solver: {max_new_tokens: 4}, refiner: {max_new_tokens: 4}}",
                               "workflow.math_tree.max_nodes=3", "workflow.math_tree.reward=tree",
                               "algo.estimator=tree", "algo.credit=shapley", "algo.shapley.counterfactual=rerun"),
                   progress=False)
    tree.train()
    [m] = _metrics(tmp_path / "tree")
    assert m["credit/extra_generations"] > 0 and m["credit/coalitions"] > 0
    ep = json.loads((tmp_path / "tree" / "episodes.jsonl").read_text().splitlines()[0])
    assert ep["info"]["nodes"] == 3 and set(ep["info"]["shapley"]) <= {"solver", "refiner"}
    sharp = Trainer(tiny_config(tmp_path, tiny_model_dir, "sharp", *common, "algo.credit=shapley",
                                "algo.overlong_buffer=2", "eval.after=true", "eval.workflow=single"), progress=False)
    results = sharp.train()
    [m] = _metrics(tmp_path / "sharp")
    assert m["credit/extra_generations"] == 0 and m["credit/rescoring_calls"] >= 1
    assert {"agent/solver/shapley_mean", "agent/verifier/shapley_mean", "perf/credit_s"} <= m.keys()
    assert results["after"]["calls_per_episode"]["verifier"] == 0  # evaluated with the single workflow


def test_whole_batches_train_multiples_of_min_steps_and_discard_the_rest():
    """MARTI's per-agent buffers: at least max(rollout, train batch) = 16 samples, whole multiples of 16 trained."""
    lr = RecordingLearner()
    up = AsyncUpdates({"m": lr}, min_steps=16, max_steps=0, max_lag=1, whole_batches=True)
    _, m0 = up.run(steps(0, 12))  # 12 < 16: wait, nothing dropped
    assert lr.updates == [] and m0["buffer/m/left"] == 12 and m0["buffer/m/dropped"] == 0
    _, m1 = up.run(steps(12, 12))  # 24: train 16, discard 8
    assert lr.updates == [list(range(16))] and m1["buffer/m/left"] == 0 and m1["buffer/m/dropped"] == 8
    _, m2 = up.run(steps(24, 33))  # 33: train 32, discard 1
    assert lr.updates[-1] == list(range(24, 56)) and m2["buffer/m/dropped"] == 1
