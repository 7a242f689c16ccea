"""Config rules of the agent→model assignment: per-agent settings that cannot apply are rejected."""

from __future__ import annotations

import pytest

from teamrl.config import tools as configtools
from teamrl.config.schema import load_config

LORA = "models.main.lora.rank=8"
TEAM = "agents={solver: {}, verifier: {}}"  # dotted agent overrides below apply on top of this


def errors(*overrides: str) -> str:
    with pytest.raises(configtools.ConfigError) as e:
        load_config(None, [TEAM, *overrides])
    return str(e.value)


def test_per_agent_lr_on_fully_shared_weights_says_what_to_do():
    msg = errors("agents.verifier.lr=1e-4")
    assert "agents.verifier.lr: 0.0001 cannot apply" in msg and "shares every weight of model 'main' with solver" in msg
    assert "its own model (agents.verifier.model)" in msg and "agents.verifier.adapter: verifier" in msg


def test_per_agent_weight_decay_on_a_shared_adapter_is_rejected():
    msg = errors(LORA, "agents.solver.adapter=both", "agents.verifier.adapter=both", "agents.solver.weight_decay=0.1")
    assert "agents.solver.weight_decay" in msg and "adapter 'both' of model 'main'" in msg


def test_adapter_needs_lora_and_lora_needs_adapters():
    msg = errors("agents.solver.adapter=s")
    assert "agents.solver.adapter: 's' needs LoRA on model 'main'" in msg and "models.main.lora.rank" in msg
    msg = errors(LORA, "agents.solver.adapter=s")
    assert "agents.verifier.adapter: model 'main' trains LoRA adapters (lora.rank=8)" in msg
    assert "set agents.verifier.adapter (e.g. verifier)" in msg


def test_all_assignment_errors_come_together():
    msg = errors("agents.solver.lr=1e-4", "agents.verifier.weight_decay=0.1", "algo.estimator=dr_mas")
    assert "3 config error(s)" in msg
    assert "agents.solver.lr" in msg and "agents.verifier.weight_decay" in msg and "dr_mas" in msg


@pytest.mark.parametrize("override, text", [
    ("models.main.lora.dropout=1.5", "lora.dropout 1.5 must be in [0, 1)"),
    ("models.main.lora.targets=[]", "lora.targets is empty"),
    ("models.main.kl_coef=-1", "kl_coef -1.0 must be >= 0"),
    ("agents.solver.lr=0", "lr 0.0 must be > 0"),
])
def test_invalid_lora_and_override_values(override, text):
    msg = errors(LORA if "lora" in override else "train.steps=2", override)
    assert text in msg


@pytest.mark.parametrize("overrides", [
    ("agents={solver: {lr: 1e-4}}", "workflow.name=single"),
    (TEAM, LORA, "agents.solver.adapter=s", "agents.verifier.adapter=v", "agents.solver.lr=1e-4",
     "agents.verifier.lr=3e-4"),
    (TEAM, "models={a: {}, b: {}}", "agents.solver.model=a", "agents.verifier.model=b", "agents.verifier.lr=3e-4"),
])
def test_per_agent_settings_on_weights_the_agent_owns_are_accepted(overrides):
    cfg = load_config(None, list(overrides))
    assert any(a.lr for a in cfg.agents.values())


def test_per_model_loss_overrides_default_to_the_loss_section(tmp_path):
    from teamrl.runtime.local import learner_settings

    cfg = load_config(None, ["loss.kl_coef=0.05", "models.main.clip_high=0.28"])
    s = learner_settings(cfg, "main")
    assert (s.kl_coef, s.clip_low, s.clip_high) == (0.05, 0.2, 0.28)
