"""examples/own_task: a dataset and a reward function in one file train a step from the command line, and the
example's files are what docs/own-task.md shows."""

from __future__ import annotations

import json
import sys

from teamrl.cli import main
from teamrl.tasks.base import TASKS
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "own_task"


def test_the_example_trains_a_step_on_its_own_data_and_reward(tmp_path, tiny_model_dir, capsys):
    run = tmp_path / "capitals"
    try:
        rc = main(["train", str(EXAMPLE / "capitals.yaml"), "--import", str(EXAMPLE / "capitals.py"),
                   f"models.main.path={tiny_model_dir}", f"run_dir={run}", "train.steps=1", "rollout.batch_size=2",
                   "rollout.group_size=2", "agents.solver.max_new_tokens=4", "eval.problems=2", "eval.samples=1"])
    finally:
        TASKS.pop("capitals", None)
        sys.modules.pop("capitals", None)
    assert rc == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0] and "rollout/reward_mean" in rows[0]
    episodes = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    assert episodes and "capital of" in json.dumps(episodes[0])
    assert (run / "checkpoints" / "step_1").is_dir()
    out = capsys.readouterr().out
    assert f"teamrl eval --checkpoint {run}" in out  # the next steps


def test_the_docs_page_shows_the_examples_files():
    page = (REPO / "docs" / "own-task.md").read_text()
    source = (EXAMPLE / "capitals.py").read_text()
    start = source.index("def reward(")
    assert source[start:source.index('    """', start)].strip() in page
    assert "teamrl train examples/own_task/capitals.yaml --import examples/own_task/capitals.py" in page
