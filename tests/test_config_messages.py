"""Config error messages: every range check echoes the offending value; an unknown estimator
gets the same did-you-mean message wherever its name is checked."""

from __future__ import annotations

import pytest

from teamrl.algos.advantages import get_estimator
from teamrl.cli import main
from teamrl.config import tools as configtools
from teamrl.config.schema import load_config
from teamrl.study.ablate import parse_presets

# (overrides joined by "|", the key the message names, the offending value as the message must echo it)
RANGE_CHECKS = [
    ("rollout.batch_size=0", "rollout.batch_size", "0"),
    ("rollout.group_size=0", "rollout.group_size", "0"),
    ("rollout.group_size=-3", "rollout.group_size", "-3"),
    ("eval.samples=-2", "eval.samples", "-2"),
    ("eval.every=-2", "eval.every", "-2"),
    ("loss.updates_per_batch=-2", "loss.updates_per_batch", "-2"),
    ("loss.micro_batch_tokens=-5", "loss.micro_batch_tokens", "-5"),
    ("train.spike_factor=0.5", "train.spike_factor", "0.5"),
    ("train.spike_window=-4", "train.spike_window", "-4"),
    ("train.min_buffer_steps=-6", "train.min_buffer_steps", "-6"),
    ("train.max_update_steps=-6", "train.max_update_steps", "-6"),
    ("train.max_policy_lag=-6", "train.max_policy_lag", "-6"),
    ("algo.overlong_buffer=-7", "algo.overlong_buffer", "-7"),
    ("algo.overlong_penalty=-7.5", "algo.overlong_penalty", "-7.5"),
    ("algo.shapley.exact_max_agents=-1", "shapley.exact_max_agents", "-1"),
    ("algo.shapley.samples=-9", "shapley.samples", "-9"),
    ("models.main.max_batch_size=-3", "max_batch_size", "-3"),
    ("models.main.share_prefix=-3", "share_prefix", "-3"),
    ("models.main.kl_coef=-0.25", "kl_coef", "-0.25"),
    ("models.main.clip_low=-0.25", "clip_low", "-0.25"),
    ("models.main.clip_high=-0.25", "clip_high", "-0.25"),
    ("models.main.lora.rank=-2", "lora.rank", "-2"),
    ("models.main.lora.rank=4|models.main.lora.alpha=-3.5", "lora.alpha", "-3.5"),
    ("models.main.lora.dropout=1.5", "lora.dropout", "1.5"),
    ("models.main.openai.timeout_s=-1.5", "openai.timeout_s", "-1.5"),
    ("models.main.openai.retries=-2", "openai.retries", "-2"),
    ("models.main.openai.concurrency=-2", "openai.concurrency", "-2"),
    ("models.main.vllm.gpu_memory_utilization=1.5", "vllm.gpu_memory_utilization", "1.5"),
    ("models.main.vllm.max_model_len=7", "vllm.max_model_len", "7"),
    ("models.main.vllm.cpu_kv_cache_gb=-1", "vllm.cpu_kv_cache_gb", "-1"),
    ("models.main.placement.num_cpus=-1.5", "placement.num_cpus", "-1.5"),
    ("models.main.placement.dp_workers=-2", "placement.dp_workers", "-2"),
    ("models.main.placement.resources={accel: -2}", "placement.resources", "-2"),
    ("agents.solver.loss_weight=-0.5", "loss_weight", "-0.5"),
    ("agents.solver.temperature=-0.5", "temperature", "-0.5"),
    ("agents.solver.top_p=1.5", "top_p", "1.5"),
    ("agents.solver.top_k=-2", "top_k", "-2"),
    ("agents.solver.max_new_tokens=-8", "max_new_tokens", "-8"),
    ("agents.solver.lr=-0.001", "lr", "-0.001"),
    ("agents.solver.weight_decay=-0.5", "weight_decay", "-0.5"),
]


@pytest.mark.parametrize(("override", "key", "value"), RANGE_CHECKS, ids=[c[0] for c in RANGE_CHECKS])
def test_range_errors_echo_the_value(override: str, key: str, value: str) -> None:
    with pytest.raises(configtools.ConfigError) as info:
        load_config(None, override.split("|"))
    lines = [line for line in info.value.errors if key in line]
    assert lines, info.value.errors
    assert any(value in line.split(key, 1)[1] for line in lines), lines  # the value comes after the key


def test_group_size_message_names_rule_and_value() -> None:
    with pytest.raises(configtools.ConfigError) as info:
        load_config(None, ["rollout.group_size=0"])
    assert info.value.errors == ["rollout.group_size must be >= 1, got 0"]


def test_unknown_estimator_suggests_the_closest_everywhere(capsys) -> None:
    with pytest.raises(ValueError) as lookup:
        get_estimator("drma")
    message = str(lookup.value)
    assert "did you mean 'drmas'?" in message
    with pytest.raises(configtools.ConfigError) as config:
        load_config(None, ["algo.estimator=drma"])
    assert config.value.errors == [f"algo.estimator: {message}"]
    with pytest.raises(ValueError) as presets:
        parse_presets("grpo,drma")
    assert str(presets.value) == f"--presets: {message}"
    assert main(["train", "algo.estimator=drma"]) == 2
    assert "did you mean 'drmas'?" in capsys.readouterr().err


@pytest.mark.parametrize("override", ["temperature=-1", "top_p=0", "top_k=-1", "max_new_tokens=0"])
def test_agent_sampling_rules_are_the_engines_own(override: str) -> None:
    from teamrl.engines.base import SamplingParams

    key, value = override.split("=")
    with pytest.raises(ValueError) as engine:
        SamplingParams(**{key: float(value) if key in ("temperature", "top_p") else int(value)})
    with pytest.raises(configtools.ConfigError) as config:
        load_config(None, [f"agents.solver.{override}"])
    assert f"agents.solver: {engine.value}" in config.value.errors
