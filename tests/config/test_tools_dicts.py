"""teamrl.config.tools: dataclasses to and from plain mappings, and the errors a bad mapping gives."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field

import pytest
import yaml

from teamrl.config.tools import (
    ConfigError,
    from_dict,
    to_dict,
)
from tests.config.toolcfg import AgentCfg, ModelCfg, NeedsCfg, OptimCfg, RootCfg, errors_of

# ---------------------------------------------------------------------------
# to_dict / from_dict
# ---------------------------------------------------------------------------


def test_defaults_from_empty_mapping():
    assert from_dict(RootCfg, {}) == RootCfg()


def test_round_trip():
    cfg = RootCfg(
        seed=7,
        name="x",
        optim=OptimCfg(lr=3e-4, schedule="cosine", betas=(0.8, 0.9), warmup_steps=5),
        models={"policy": ModelCfg(path="a", max_len=128), "judge": ModelCfg(dtype="fp32")},
        agents=[AgentCfg(role="a"), AgentCfg(role="b", model="judge", trainable=False)],
        tags=["t1", "t2"],
        critic=OptimCfg(lr=1.0),
        extra={"k": [1, 2]},
    )
    d = to_dict(cfg)
    assert d["optim"]["betas"] == [0.8, 0.9]  # tuples become lists
    assert d["models"]["judge"] == {"path": "", "dtype": "fp32", "max_len": None}
    # YAML-safe and stable through a dump/load cycle.
    assert yaml.safe_load(yaml.safe_dump(d)) == d
    back = from_dict(RootCfg, d)
    assert back == cfg
    assert isinstance(back.optim.betas, tuple)
    assert isinstance(back.agents[1], AgentCfg)


def test_to_dict_rejects_non_dataclass():
    with pytest.raises(TypeError):
        to_dict(3)


def test_dataclass_instance_accepted_as_value():
    cfg = from_dict(RootCfg, {"optim": OptimCfg(lr=2.0)})
    assert cfg.optim.lr == 2.0


def test_unknown_key_with_suggestion():
    errs = errors_of(RootCfg, {"optim": {"lrr": 1e-4}})
    assert errs == ["unknown key 'optim.lrr'; did you mean 'optim.lr'?"]


def test_unknown_key_without_close_match_lists_valid_keys():
    (err,) = errors_of(RootCfg, {"optim": {"zzzzzz": 1}})
    assert err.startswith("unknown key 'optim.zzzzzz'; valid keys are:")
    for k in ("lr", "schedule", "betas", "warmup_steps"):
        assert k in err


def test_unknown_key_inside_dict_of_dataclasses():
    errs = errors_of(RootCfg, {"models": {"policy": {"pth": "x"}}})
    assert errs == ["unknown key 'models.policy.pth'; did you mean 'models.policy.path'?"]


def test_many_errors_reported_together():
    data = {
        "seed": True,
        "optim": {"lr": "fast", "schedule": "cosin"},
        "models": {"policy": {"dtype": "fp8"}, "judge": "not-a-mapping"},
        "agents": [{"trainable": "yes"}, 3],
        "tags": ["ok", 5],
        "bogus": 1,
    }
    with pytest.raises(ConfigError) as info:
        from_dict(RootCfg, data)
    errs = info.value.errors
    expected_prefixes = [
        "seed: expected int, got True (bool)",
        "optim.lr: expected float, got 'fast' (str)",
        "optim.schedule: expected one of 'constant', 'cosine', got 'cosin' (str); "
        "did you mean 'cosine'?",
        "models.policy.dtype: expected one of 'bf16', 'fp32', got 'fp8' (str)",
        "models.judge: expected a mapping (ModelCfg), got 'not-a-mapping' (str)",
        "agents[0].trainable: expected bool, got 'yes' (str)",
        "agents[1]: expected a mapping (AgentCfg), got 3 (int)",
        "tags[1]: expected str, got 5 (int)",
        "unknown key 'bogus'",
    ]
    assert len(errs) == len(expected_prefixes)
    for prefix in expected_prefixes:
        assert any(e.startswith(prefix) for e in errs), (prefix, errs)
    text = str(info.value)
    assert text.splitlines()[0] == f"{len(errs)} config error(s):"
    assert all(e in text for e in errs)


def test_bool_rejected_for_int_and_float():
    assert errors_of(OptimCfg, {"warmup_steps": False}) == [
        "warmup_steps: expected int, got False (bool)"
    ]
    assert errors_of(OptimCfg, {"lr": True}) == ["lr: expected float, got True (bool)"]


def test_float_rejected_for_int():
    assert errors_of(OptimCfg, {"warmup_steps": 3.0}) == [
        "warmup_steps: expected int, got 3.0 (float)"
    ]


def test_int_accepted_for_float():
    cfg = from_dict(OptimCfg, {"lr": 2, "betas": [1, 0.5]})
    assert cfg.lr == 2.0 and type(cfg.lr) is float
    assert cfg.betas == (1.0, 0.5) and all(type(b) is float for b in cfg.betas)


def test_literal_error_lists_options():
    (err,) = errors_of(ModelCfg, {"dtype": "float16"})
    assert err.startswith("dtype: expected one of 'bf16', 'fp32', got 'float16' (str)")


def test_optional():
    assert from_dict(ModelCfg, {"max_len": None}).max_len is None
    assert from_dict(ModelCfg, {"max_len": 5}).max_len == 5
    assert errors_of(ModelCfg, {"max_len": "long"}) == [
        "max_len: expected int | None, got 'long' (str)"
    ]
    # Optional dataclass: nested errors keep their paths.
    assert from_dict(RootCfg, {"critic": {"lr": 0.5}}).critic == OptimCfg(lr=0.5)
    assert errors_of(RootCfg, {"critic": {"lr": "x"}}) == [
        "critic.lr: expected float, got 'x' (str)"
    ]


def test_long_values_truncated():
    (err,) = errors_of(RootCfg, {"name": list(range(1000))})
    got = err.split("got ", 1)[1]
    assert len(got) < 80 and "..." in got and got.endswith("(list)")


def test_post_init_value_error_collected_with_path():
    errs = errors_of(RootCfg, {"optim": {"lr": -1.0}, "critic": {"lr": 0}, "seed": "x"})
    assert sorted(errs) == sorted(
        [
            "optim: lr must be positive, got -1.0",
            "critic: lr must be positive, got 0.0",
            "seed: expected int, got 'x' (str)",
        ]
    )


def test_post_init_config_error_merged():
    errs = errors_of(
        RootCfg,
        {"agents": [{"model": "nope"}, {}, {"model": "other"}], "optim": {"lrr": 1}},
    )
    assert errs == [
        "unknown key 'optim.lrr'; did you mean 'optim.lr'?",
        "agents[0].model: unknown model 'nope'",
        "agents[2].model: unknown model 'other'",
    ]


def test_post_init_error_prefixed_with_path_when_nested():
    errs = errors_of(NeedsCfg, {"must": 1, "inner": {"agents": [{"model": "x"}]}})
    assert errs == ["inner: agents[0].model: unknown model 'x'"]


def test_required_field():
    assert errors_of(NeedsCfg, {}) == ["must: required"]
    assert from_dict(NeedsCfg, {"must": 2}).must == 2


def test_path_prefix_and_non_mapping_root():
    assert errors_of(OptimCfg, {"lr": "x"}) == ["lr: expected float, got 'x' (str)"]
    with pytest.raises(ConfigError) as info:
        from_dict(OptimCfg, {"lr": "x"}, path="train.optim")
    assert info.value.errors == ["train.optim.lr: expected float, got 'x' (str)"]
    with pytest.raises(ConfigError) as info:
        from_dict(OptimCfg, [1, 2])  # type: ignore[arg-type]
    assert info.value.errors[0].startswith("<root>: expected a mapping (OptimCfg)")


def test_non_str_dict_key():
    @dataclass(kw_only=True)
    class C:
        m: dict[str, int] = field(default_factory=dict)

    errs = errors_of(C, {"m": {1: 2, "a": "b"}})
    assert errs == [
        "m: expected keys of type str, got 1 (int)",
        "m.a: expected int, got 'b' (str)",
    ]


def test_fixed_tuple_and_bare_containers():
    @dataclass(kw_only=True)
    class C:
        pair: tuple[int, str] = (0, "")
        anything: list = field(default_factory=list)
        mapping: dict = field(default_factory=dict)

    c = from_dict(C, {"pair": [1, "a"], "anything": [1, "x"], "mapping": {"k": [1]}})
    assert c.pair == (1, "a") and c.anything == [1, "x"] and c.mapping == {"k": [1]}
    (err,) = errors_of(C, {"pair": [1]})
    assert err.startswith("pair: expected tuple[int, str] (2 items)")


def test_config_error_pickles_and_accepts_single_message():
    e = ConfigError("boom")
    assert e.errors == ["boom"] and str(e) == "1 config error(s):\n  boom"
    e2 = pickle.loads(pickle.dumps(ConfigError(["a", "b"])))
    assert e2.errors == ["a", "b"]
    assert isinstance(e2, ValueError)
