"""Every recipe: listed, resolved by --dry-run with a memory plan, and run for one real step on a CPU (--smoke)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from teamrl.cli import main
from teamrl.config import files as configfiles
from tests.conftest import REPO

RECIPES = sorted(n for n in configfiles.builtin_names() if n.startswith("recipes/"))
SHARED = REPO.parent / "shared" / "data"


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


# The dry run reads the splits as the run does, and found this recipe's test split short: beside its 600 train
# rooms the 6x6 Sokoban generator finds 29 distinct test rooms of the 100 asked (n_test), so the run fails at its
# first evaluation. Its values are the recipe's to re-trace; until then this case is expected to fail.
SHORT_SPLIT = {"recipes/at_grpo_sokoban"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(
    strict=True, reason="sokoban: only 29 distinct test instances for n_test=100")) if n in SHORT_SPLIT else n
    for n in RECIPES])
def test_dry_run_prints_the_memory_plan_or_names_the_data_to_prepare(name, capsys):
    rc = main(["train", name, "--dry-run"])
    out, err = capsys.readouterr()
    if rc != 0:  # the dry run reads the data as the run does: a recipe's data that is not prepared here is named
        text = Path(configfiles.resolve(name)).read_text()
        missing = re.findall(r"data file not found: (\S+) ", err)
        assert missing and all(Path(m).parent.as_posix() in text for m in missing), err
        return
    assert "memory plan:" in out and "device" in out and "nothing loaded" in out


@pytest.mark.slow
@pytest.mark.parametrize("name", RECIPES)
def test_smoke_runs_one_step_on_a_cpu(name, tmp_path, monkeypatch, capsys):
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is absent (the smoke runs read the offline benchmark files there)")
    monkeypatch.chdir(REPO)  # the smoke data paths are relative to the repository root
    start = time.monotonic()
    assert main(["train", name, "--smoke", f"run_dir={tmp_path / 'run'}", "train.threads=2"]) == 0
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
    print(f"{name}: one step in {time.monotonic() - start:.1f} s")
