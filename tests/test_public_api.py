"""What ``teamrl/__init__.py`` promises: every exported name resolves, and importing teamrl is cheap."""

from __future__ import annotations

import subprocess
import sys

import pytest

import teamrl


@pytest.mark.parametrize("name", sorted(set(teamrl.__all__) - {"__version__"}))
def test_every_exported_name_resolves_to_the_object_of_its_module(name):
    import importlib

    value = getattr(teamrl, name)
    assert value is getattr(importlib.import_module(teamrl._EXPORTS[name]), name)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Trainerr'"):
        teamrl.Trainerr  # noqa: B018


def test_import_teamrl_loads_neither_torch_nor_transformers():
    code = "import sys, teamrl; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_readme_team_imports_from_the_top_level():
    from teamrl import Parsed, register_agent, register_workflow  # docs/custom-teams.md

    assert callable(register_agent) and callable(register_workflow) and Parsed("x", valid=True).valid
