"""Held-out evaluation of an environment task: success rate and average turns, through the shipped AT-GRPO config."""

from __future__ import annotations

from teamrl.config.schema import load_config
from teamrl.train.trainer import Trainer
from tests.conftest import REPO


def test_eval_reports_success_rate_and_average_turns(tmp_path, tiny_model_dir):
    cfg = load_config(REPO / "configs" / "plan_path_at_grpo.yaml", [
        f"run_dir={tmp_path}", f"models.main.path={tiny_model_dir}", "agents.tool.max_new_tokens=8",
        "agents.planner.max_new_tokens=8", "eval.problems=3", "eval.samples=2", "train.steps=1"])
    trainer = Trainer(cfg, progress=False)
    result = trainer.evaluate("before")
    assert result["problems"] == 3 and 0.0 <= result["success_rate"] <= 1.0
    assert result["success_rate"] == result["accuracy"]  # a replayed success is the episode's reward
    assert 1.0 <= result["avg_turns"] <= 3.0  # max_turns 3; eval runs env_team: one tool and one plan call a turn
    assert result["calls_per_episode"]["tool"] == result["calls_per_episode"]["planner"] == result["avg_turns"]
