"""Every recipe's manifest of sources (configs/recipes/sources/<name>.yaml) against the recipe as resolved: each entry's
key holds the manifest's value, every value the recipe sets has an entry, and each location names a file and line."""

from __future__ import annotations

import importlib.util
import re

import pytest
import yaml

from teamrl.config import files as configfiles
from teamrl.config import tools as configtools
from teamrl.config.schema import load_config
from tests.conftest import REPO

RECIPES = sorted(n.removeprefix("recipes/") for n in configfiles.builtin_names() if n.startswith("recipes/"))
SOURCES = REPO / "configs" / "recipes" / "sources"


def _script():
    spec = importlib.util.spec_from_file_location("recipe_sources", REPO / "scripts" / "recipe_sources.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _get(tree, dotted: str):
    for part in dotted.split("."):
        tree = tree[part]
    return tree


@pytest.mark.parametrize("name", RECIPES)
def test_each_manifest_entry_holds_in_the_resolved_recipe(name):
    m = yaml.safe_load((SOURCES / f"{name}.yaml").read_text())
    assert m["recipe"] == f"recipes/{name}" and m["values"]
    cfg = configtools.to_dict(load_config(str(configfiles.builtin_dir() / "recipes" / f"{name}.yaml"), []))
    for entry in m["values"]:
        assert _get(cfg, entry["key"]) == entry["teamrl"], (name, entry["key"])
        assert all(re.fullmatch(r"[\w./-]+\.(sh|yaml|py|md|json):\d+(-\d+)?", at) for at in entry["at"]), entry
    if name != "sharp_math":  # SHARP's code is not published: its recipe names no commit
        assert m["originals"] and all(re.fullmatch(r"[0-9a-f]{40}", o["commit"]) for o in m["originals"]), name


@pytest.mark.parametrize("name", RECIPES)
def test_every_value_a_recipe_sets_is_in_its_manifest(name):
    keys = {e["key"] for e in yaml.safe_load((SOURCES / f"{name}.yaml").read_text())["values"]}
    text = (configfiles.builtin_dir() / "recipes" / f"{name}.yaml").read_text()
    assert [k for k, _ in _script().recipe_values(text) if k not in keys] == []


def test_the_manifests_are_the_recipes_own():
    """A recipe edited without its manifest (or the other way round) fails here: regenerate with
    python scripts/recipe_sources.py."""
    assert _script().main(["--check"]) == 0
