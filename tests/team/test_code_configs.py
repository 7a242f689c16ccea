"""The shipped code configs train a step with a tiny model: every agent is called as its workflow says and rewarded."""

from __future__ import annotations

import json
import shutil

import pytest

from teamrl.config.schema import load_config
from teamrl.train.trainer import Trainer
from tests.conftest import REPO
from tests.train.test_resume import shrink

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

# config -> (calls per agent per episode or tree, as the workflow fixes them for replies holding no code or tests)
CALLS = {
    "code_single": {"coder": 1},
    "code_pair": {"aux_coder": 1, "main_coder": 1},
    "code_team": {"coder": 2, "tester": 2},  # no tests written: no agreement, so max_turns (2) turns
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_one_step_records_every_agent(name, tmp_path, tiny_model_dir):
    config = REPO / "configs" / f"{name}.yaml"
    cfg = load_config(config, shrink(config, tiny_model_dir, tmp_path / "run", 1))
    Trainer(cfg, progress=False).train()
    [row] = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    episodes = cfg.rollout.batch_size * cfg.rollout.group_size
    assert row["rollout/failed_episodes"] == 0.0
    for agent, n in CALLS[name].items():
        assert row[f"agent/{agent}/calls"] == n * episodes
        assert f"agent/{agent}/reward_mean" in row


def test_code_tree_spends_its_node_budget(tmp_path, tiny_model_dir):
    """Random replies never pass: stop_on_success never fires, so each tree has max_nodes (6) nodes."""
    config = REPO / "configs" / "code_tree.yaml"
    cfg = load_config(config, shrink(config, tiny_model_dir, tmp_path / "run", 1))
    Trainer(cfg, progress=False).train()
    [row] = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["rollout/calls_per_episode"] == 6.0
    assert row["agent/coder/calls"] + row["agent/code_refiner/calls"] == 6 * cfg.rollout.batch_size
