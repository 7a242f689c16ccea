"""Names checked like keys (teamrl/config/names.py): an entry nothing uses is refused with the nearest name, in the
file and in overrides alike; and every validation error comes in one report."""

from __future__ import annotations

import pytest

from teamrl.config import tools as configtools
from teamrl.config.schema import Config, load_config
from tests.conftest import REPO

QUICKSTART = REPO / "configs" / "quickstart.yaml"


def errors(path, *overrides: str) -> list[str]:
    with pytest.raises(configtools.ConfigError) as e:
        load_config(path, list(overrides))
    return e.value.errors


def test_a_misspelled_agent_in_an_override_is_refused_with_the_nearest_name():
    assert errors(QUICKSTART, "agents.solvr.temperature=0.2") == [
        "agents.solvr: no workflow calls agent 'solvr' (math_team calls solver, verifier); did you mean 'solver'? "
        "(rename it or remove it)"]


def test_a_misspelled_model_in_an_override_is_refused_with_the_nearest_name():
    assert errors(QUICKSTART, "models.mian.optim.lr=1e-5") == [
        "models.mian: no agent maps to model 'mian' (agents map to main); did you mean 'main'? (rename it, map an "
        "agent to it (agents.<a>.model: mian) or remove it)"]


def test_the_rule_covers_the_config_file_too(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(QUICKSTART.read_text().replace("  verifier:\n    model: main", "  verifer:\n    model: main"))
    found = errors(path)
    assert ("agents.verifer: no workflow calls agent 'verifer' (math_team calls solver, verifier); did you mean "
            "'verifier'? (rename it or remove it)") in found
    assert "agents: workflow 'math_team' calls agent 'verifier'; add agents.verifier" in found


def test_options_of_a_plugin_that_is_not_selected_are_refused():
    assert errors(QUICKSTART, "task.math.train_path=data/train.jsonl") == [
        "task.math: options of task 'math', which is not selected (task.name is 'arith'); set task.name=math, "
        "or remove them"]


def test_used_names_unused_defaults_and_resolved_configs_pass():
    cfg = load_config(QUICKSTART, ["agents.solver.temperature=0.2", "models.main.optim.lr=1e-5"])
    assert cfg.agents["solver"].temperature == 0.2 and cfg.models["main"].optim.lr == 1e-5
    single = load_config(None, ["workflow.name=single"])  # the defaults' verifier is unused, not the user's doing
    assert configtools.from_dict(Config, configtools.to_dict(single)) == single  # as a run's config.yaml loads
    two = load_config(None, ["workflow.name=single", "models.big.path=x", "agents.solver.model=big"])
    assert set(two.models) == {"big"} and two.agents["solver"].model == "big"


def test_a_type_error_no_longer_hides_the_rules_across_sections():
    found = errors(QUICKSTART, "algo.estimator=drmsa", "rollout.batch_size=abc", "agents.solvr.temperature=0.2")
    assert found[0] == "rollout.batch_size: expected int, got 'abc' (str)"
    assert any(e.startswith("algo.estimator: unknown advantage estimator 'drmsa'; did you mean 'drmas'?") for e in found)
    assert any(e.startswith("agents.solvr: no workflow calls agent 'solvr'") for e in found)
    assert len(found) == 3
