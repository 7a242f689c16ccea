"""The docs' inventories of the tree stay true: the layout of docs/layout.md names every module and package of
``teamrl/`` and nothing that is not there; every ``teamrl/...`` path docs/architecture.md gives exists."""

from __future__ import annotations

import re

from tests.conftest import REPO

PACKAGE = REPO / "teamrl"


def _layout_block() -> str:
    page = (REPO / "docs" / "layout.md").read_text()
    return page[page.index("```") + 3:page.index("```", page.index("```") + 3)]


def _layout_names() -> set[str]:
    """The names docs/layout.md gives under ``teamrl/`` (``team/``, ``config.py``, ...)."""
    names: set[str] = set()
    for line in _layout_block().splitlines():
        if not line.startswith("  ") or line.startswith("   "):
            continue
        entry = line.strip().split("  ")[0]  # the name column ends at the first double space
        names |= {n for n in entry.split() if n.endswith((".py", "/"))}
    return names


def test_the_layout_page_names_every_module_and_package() -> None:
    tree = {p.name + "/" if p.is_dir() else p.name for p in PACKAGE.iterdir()
            if p.name != "__pycache__" and (p.is_dir() or p.suffix == ".py")}
    named = _layout_names()
    assert tree - named == set(), f"in teamrl/ but not in docs/layout.md: {sorted(tree - named)}"
    assert named - tree == set(), f"in docs/layout.md but not in teamrl/: {sorted(named - tree)}"


def test_every_path_in_architecture_md_exists() -> None:
    text = (REPO / "docs" / "architecture.md").read_text()
    paths = set(re.findall(r"`(teamrl/[\w/.]+)`", text))
    assert len(paths) > 10  # the concept table's paths were found
    missing = sorted(p for p in paths if not (REPO / p.rstrip("/")).exists())
    assert missing == [], f"docs/architecture.md names paths that do not exist: {missing}"
