from __future__ import annotations

from pathlib import Path

import pytest

from teamrl.cli import main
from teamrl.config import tools as configtools
from teamrl.config.schema import Config, load_config

CONFIGS = sorted(p for p in (Path(__file__).resolve().parents[1] / "configs").rglob("*.yaml")
                 if "sources" not in p.parts)  # recipes/sources/: the manifests, not configs


def test_there_are_shipped_configs():
    assert CONFIGS, "no YAML under configs/"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_yaml_loads(path):
    cfg = load_config(path)
    assert isinstance(cfg, Config)
    # the resolved config round-trips (what a run writes to config.yaml loads back equal)
    assert configtools.from_dict(Config, configtools.to_dict(cfg)) == cfg


def test_unknown_keys_suggest_and_all_errors_come_together():
    with pytest.raises(configtools.ConfigError) as e:
        load_config(None, ["rollout.group_sise=4", "models.main.optim.lr=fast", "loss.agg=token_mean"])
    msg = str(e.value)
    assert "did you mean 'rollout.group_size'" in msg
    assert "models.main.optim.lr: expected float" in msg
    assert "loss.agg" in msg and "token-mean" in msg
    assert "3 config error(s)" in msg


def test_agent_on_missing_model_and_missing_workflow_agent():
    with pytest.raises(configtools.ConfigError) as e:
        load_config(None, ["agents={solver: {model: big}}"])
    msg = str(e.value)
    assert "agents.solver.model: 'big' is not in models" in msg
    assert "calls agent 'verifier'" in msg


def test_unknown_estimator_lists_presets():
    with pytest.raises(configtools.ConfigError, match="unknown advantage estimator 'dr_mas'.*did you mean 'drmas'"):
        load_config(None, ["algo.estimator=dr_mas"])


def test_cli_reports_config_errors_with_exit_code_2(capsys):
    assert main(["train", "--help-config"]) == 0
    assert "rollout.group_size" in capsys.readouterr().out
    assert main(["train", "missing.yaml"]) == 2
    assert "not found" in capsys.readouterr().err


def test_mars2_plus_objective_fills_what_the_config_leaves_at_defaults():
    """MARS2's code (MARTI's launch scripts: OpenRLHF's GSPO loss with vLLM IS correction, KL k3 1e-3)."""
    cfg = load_config(None, ["algo.objective=mars2+", "loss.clip_high=0.28"])
    assert (cfg.algo.estimator, cfg.algo.eps, cfg.loss.level, cfg.loss.agg, cfg.loss.clip_low) == (
        "tree", 1e-9, "sequence", "seq-mean-token-mean", 0.2)
    assert cfg.loss.clip_high == 0.28  # set by the config: kept
    assert (cfg.loss.rollout_correction, cfg.loss.rollout_correction_threshold, cfg.loss.rollout_correction_veto,
            cfg.loss.old_logprobs) == ("token-tis", 2.0, 1e-4, "engine")
    assert (cfg.loss.kl_coef, cfg.loss.kl_kind) == (1e-3, "k3")
    assert cfg.algo.overlong_buffer == max(1, min(a.max_new_tokens for a in cfg.agents.values()) // 16)


def test_rollout_correction_rules():
    with pytest.raises(configtools.ConfigError, match="old_logprobs: recompute"):
        load_config(None, ["loss.rollout_correction=token-tis"])
    load_config(None, ["loss.rollout_correction=token-tis", "loss.level=sequence"])  # MARS2's GSPO form takes both
    for bad, match in (("loss.rollout_correction_threshold=0.5", "must be a finite number > 1"),
                       ("loss.rollout_correction_lower=0", r"must be in \(0, 1\]"),
                       ("loss.rollout_correction_veto=1.5", r"must be in \(0, 1\)"),
                       ("loss.rollout_correction_veto=1e-4", "applies with a rollout correction")):
        with pytest.raises(configtools.ConfigError, match=match):
            load_config(None, [bad])
    load_config(None, ["loss.rollout_correction=seq-mis", "loss.old_logprobs=recompute"])
    with pytest.raises(configtools.ConfigError, match="choose one of|token-tis"):
        load_config(None, ["loss.rollout_correction=tis"])
    # async with recompute needs a correction on every trained model (the decoupled objective)
    with pytest.raises(configtools.ConfigError, match="decoupled"):
        load_config(None, ["train.update_mode=async", "loss.old_logprobs=recompute"])
    load_config(None, ["train.update_mode=async", "loss.old_logprobs=recompute", "loss.rollout_correction=token-tis"])
    with pytest.raises(configtools.ConfigError, match="decoupled"):
        load_config(None, ["train.update_mode=async", "loss.old_logprobs=recompute", "loss.rollout_correction=token-tis",
                           "models.main.rollout_correction=none"])


def test_rollout_correction_per_model():
    from teamrl.runtime.local import learner_settings

    cfg = load_config(Path("configs/math_team_separate.yaml"), ["loss.old_logprobs=recompute",
                                                                 "loss.rollout_correction=seq-mis",
                                                                 "loss.rollout_correction_threshold=1.5"])
    names = list(cfg.models)
    cfg2 = load_config(Path("configs/math_team_separate.yaml"), ["loss.old_logprobs=recompute",
                                                                  f"models.{names[0]}.rollout_correction=token-tis"])
    assert {n: learner_settings(cfg, n).rollout_correction for n in names} == dict.fromkeys(names, "seq-mis")
    assert learner_settings(cfg, names[0]).correction_threshold == 1.5
    assert [learner_settings(cfg2, n).rollout_correction for n in names] == ["token-tis"] + ["none"] * (len(names) - 1)


def test_empty_override_sets_an_empty_string():
    # `teamrl train cfg.yaml workflow.env_single.action_prefix=''` reaches us as "...action_prefix="
    cfg = load_config("configs/sokoban_single.yaml", ["workflow.env_single.action_prefix="])
    assert cfg.workflow.env_single.action_prefix == ""


def test_rae_settings_are_checked():
    with pytest.raises(configtools.ConfigError, match=r"algo.rae_decay 1.5 must be in \(0, 1\)"):
        load_config("configs/tictactoe_selfplay.yaml", ["algo.rae_decay=1.5"])
    with pytest.raises(configtools.ConfigError, match="rae does not combine with algo.dynamic_sampling"):
        load_config("configs/tictactoe_selfplay.yaml", ["algo.dynamic_sampling=true"])
    assert load_config("configs/tictactoe_selfplay.yaml").algo.estimator == "rae"
