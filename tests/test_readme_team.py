"""The "your own team in one file" example of docs/custom-teams.md runs as written."""

from __future__ import annotations

import json
import re
from pathlib import Path

from teamrl.cli import main

PAGE = Path(__file__).resolve().parents[1] / "docs" / "custom-teams.md"


def test_readme_custom_team_trains(tmp_path, tiny_model_dir):
    code = re.search(r"```python\n(# my_team.py\n.*?)```", PAGE.read_text(), re.S).group(1)
    (tmp_path / "my_team.py").write_text(code)
    rc = main(["train", "--import", str(tmp_path / "my_team.py"), f"run_dir={tmp_path / 'run'}",
               f"models.main.path={tiny_model_dir}", "workflow.name=critique", "workflow.options.rounds=2",
               "agents={solver: {max_new_tokens: 4}, critic: {max_new_tokens: 4}}", "rollout.batch_size=2",
               "rollout.group_size=2", "train.steps=1", "eval.before=false", "eval.after=false",
               "algo.format_penalty=0.5"])
    assert rc == 0
    ep = json.loads((tmp_path / "run" / "episodes.jsonl").read_text().splitlines()[0])
    assert [t["agent"] for t in ep["turns"]] == ["solver", "critic", "solver", "critic", "solver"]


def test_user_workflow_options_are_validated(tmp_path, capsys):
    rc = main(["train", "workflow.name=critique", "workflow.options.roundz=2"])
    assert rc == 2
    assert "roundz" in capsys.readouterr().err
