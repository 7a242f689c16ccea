"""The docs site (mkdocs.yml) stays whole without building it: every page of docs/ is in the nav and every nav entry
is a page; the README's links lead to files; the API reference's page walk covers the package; docstrings render as
Markdown. CI builds the site itself with ``mkdocs build --strict`` (the ``docs`` extra)."""

from __future__ import annotations

import importlib.util
import re

import pytest
import yaml

from tests.conftest import REPO

DOCS = REPO / "docs"


def _nav_entries(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [e for v in node.values() for e in _nav_entries(v)]
    if isinstance(node, list):
        return [e for v in node for e in _nav_entries(v)]
    return []


def _load(name: str, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page() -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert config["docs_dir"] == "docs" and config["strict"] is True
    entries = _nav_entries(config["nav"])
    assert "reference/" in entries  # the generated API reference (scripts/docs_api_pages.py)
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    listed = {e for e in entries if e.endswith(".md")}
    assert pages - listed == set(), f"pages missing from mkdocs.yml's nav: {sorted(pages - listed)}"
    assert listed - pages == set(), f"nav entries without a page: {sorted(listed - pages)}"


def test_the_readme_is_short_and_its_links_lead_to_files() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    links = [t.split("#")[0] for t in re.findall(r"\]\(([^)]+)\)", readme) if "://" not in t]
    assert len(links) > 20
    assert [t for t in links if not (REPO / t).exists()] == []


def test_the_readme_test_command_is_what_ci_runs() -> None:
    command = "bash scripts/setup.sh && .venv/bin/python -m pytest"
    assert command in (REPO / "README.md").read_text() and f"\n{command}\n" in (REPO / ".ci" / "run").read_text()


def test_the_api_reference_walks_every_public_module() -> None:
    walk = _load("docs_api_pages_walk", REPO / "scripts" / "docs_api_pages.py").modules
    found = {".".join(parts) for parts in walk()}
    assert {"teamrl", "teamrl.cli", "teamrl.algos", "teamrl.algos.advantages"} <= found
    expected = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
                for p in (REPO / "teamrl").rglob("*.py")
                if "__pycache__" not in p.parts and not any(s.startswith("_") and s != "__init__.py" for s in p.parts)}
    assert found == expected


def test_docstrings_become_markdown() -> None:
    pytest.importorskip("griffe", reason="the docs extra is not installed (pip install -e '.[docs]')")
    markdown = _load("docs_griffe", REPO / "scripts" / "docs_griffe.py").markdown_docstring
    text = "Sum of ``x[0]`` and `y[1]`, shape [B, T].\n\n    >>> f([1])\n    [2]\n\nSee [x].\n```\n[kept]\n```"
    assert markdown(text) == ("Sum of ``x[0]`` and `y[1]`, shape \\[B, T\\].\n\n    ```pycon\n    >>> f([1])\n"
                              "    [2]\n    ```\n\nSee \\[x\\].\n```\n[kept]\n```")
