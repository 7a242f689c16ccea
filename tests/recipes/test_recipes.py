"""Every recipe: listed, resolved by --dry-run with a memory plan, and run for one real step on a CPU (--smoke)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from teamrl.cli import main
from teamrl.config import files as configfiles

RECIPES = sorted(n for n in configfiles.builtin_names() if n.startswith("recipes/"))


def test_there_are_recipes_for_each_seed_paper():
    names = {n.removeprefix("recipes/") for n in RECIPES}
    assert {"drmas_math", "drmas_search", "drmas_search_hetero", "at_grpo_sokoban", "at_grpo_code", "mars2_code",
            "magrpo_code", "sharp_math"} <= names


def test_every_value_of_a_recipe_says_where_it_comes_from():
    for name in RECIPES:
        lines = (configfiles.builtin_dir() / f"{name}.yaml").read_text().splitlines()
        body = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
        for ln in body:
            key, _, value = ln.partition(":")
            if value.strip() and "#" not in value:
                pytest.fail(f"{name}: {ln.strip()!r} has no source comment")
        # a source names a line ("file:LINE" or ":LINE") or says the original does not set the value
        for ln in body:
            comment = ln.partition("#")[2]
            if comment and not re.search(r":\d+|does not|not found|not set|not reproduced|the paper", comment):
                pytest.fail(f"{name}: {ln.strip()!r}: the comment names no line and does not say the original lacks it")


SLOW_DATA = {"recipes/at_grpo_sokoban"}  # its data check generates 6,500 Sokoban rooms (about 10 s)
USER_DATA = {"recipes/at_grpo_code", "recipes/mars2_code"}  # train on the user's own files (their headers say which)


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if n in SLOW_DATA else []) for n in RECIPES])
def test_dry_run_prints_the_memory_plan(name, capsys):
    """Every recipe's plans; a recipe whose data files are the user's to make then fails the run's own data check,
    naming files its header says to prepare."""
    assert main(["train", name, "--dry-run"]) == (2 if name in USER_DATA else 0)
    captured = capsys.readouterr()
    out = captured.out
    assert "memory plan:" in out and "device" in out
    if name in USER_DATA:
        text = Path(configfiles.resolve(name)).read_text()
        missing = re.findall(r"data file not found: (\S+) ", captured.err)
        assert missing and all(Path(m).parent.as_posix() in text for m in missing), captured.err
        assert "nothing loaded" not in out
    else:
        assert "nothing loaded" in out
    assert re.search(r"training plan: model \S+: lr 0% \S+, 10% \S+, 50% \S+, 90% \S+, 100% \S+ ", out), out
    assert "chat template kwargs" in out
    phases = re.findall(r"^time plan: (\w+) .* floor .* planned ", out, re.M)  # on an H100's data sheet here
    assert {"rollout", "update"} <= set(phases) and "time plan: step ~" in out and "data sheet" in out, out


@pytest.mark.slow
@pytest.mark.parametrize("name", RECIPES)
def test_smoke_runs_one_step_on_a_cpu(name, tmp_path, monkeypatch, capsys):
    """From a folder with nothing beside it: the smoke variant makes its own data (teamrl.smoke_data)."""
    monkeypatch.chdir(tmp_path)
    start = time.monotonic()
    assert main(["train", name, "--smoke", f"run_dir={tmp_path / 'run'}", "train.threads=2"]) == 0
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
    print(f"{name}: one step in {time.monotonic() - start:.1f} s")
