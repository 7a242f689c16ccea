from __future__ import annotations

import pickle
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import pytest
import yaml

from teamrl.config.tools import (
    ConfigError,
    Sections,
    describe,
    field_docs,
    from_dict,
    load,
    merge,
    parse_overrides,
    to_dict,
)

# ---------------------------------------------------------------------------
# Test schema
# ---------------------------------------------------------------------------


@dataclass(kw_only=True)
class OptimCfg:
    lr: float = 1e-5
    """AdamW learning rate."""
    schedule: Literal["constant", "cosine"] = "constant"
    """Learning-rate schedule.
    constant: fixed; cosine: cosine decay."""
    betas: tuple[float, ...] = (0.9, 0.999)
    """Adam betas."""
    warmup_steps: int = 0

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"lr must be positive, got {self.lr}")


@dataclass(kw_only=True)
class ModelCfg:
    path: str = ""
    """Checkpoint path or hub id."""
    dtype: Literal["bf16", "fp32"] = "bf16"
    """Parameter dtype."""
    max_len: int | None = None
    """Context length; None = model default."""


@dataclass(kw_only=True, frozen=True)
class AgentCfg:
    role: str = "solver"
    """Role name."""
    model: str = "policy"
    """Key into `models`."""
    trainable: bool = True
    """Whether this agent is updated."""


@dataclass(kw_only=True)
class RootCfg:
    seed: int = 0
    """Random seed."""
    name: str = "run"
    """Run name."""
    optim: OptimCfg = field(default_factory=OptimCfg)
    """Optimizer settings."""
    models: dict[str, ModelCfg] = field(
        default_factory=lambda: {"policy": ModelCfg(path="org/policy")}
    )
    """Models by name."""
    agents: list[AgentCfg] = field(default_factory=lambda: [AgentCfg()])
    """The team."""
    tags: list[str] = field(default_factory=list)
    """Free-form tags."""
    critic: OptimCfg | None = None
    """Optional critic optimizer."""
    extra: Any = None
    """Anything."""

    def __post_init__(self) -> None:
        errs = [
            f"agents[{i}].model: unknown model {a.model!r}"
            for i, a in enumerate(self.agents)
            if a.model not in self.models
        ]
        if errs:
            raise ConfigError(errs)


@dataclass(kw_only=True)
class NeedsCfg:
    must: int
    """No default."""
    inner: RootCfg = field(default_factory=RootCfg)


def _errors(cls, data) -> list[str]:
    with pytest.raises(ConfigError) as info:
        from_dict(cls, data)
    return info.value.errors


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
    errs = _errors(RootCfg, {"optim": {"lrr": 1e-4}})
    assert errs == ["unknown key 'optim.lrr'; did you mean 'optim.lr'?"]


def test_unknown_key_without_close_match_lists_valid_keys():
    (err,) = _errors(RootCfg, {"optim": {"zzzzzz": 1}})
    assert err.startswith("unknown key 'optim.zzzzzz'; valid keys are:")
    for k in ("lr", "schedule", "betas", "warmup_steps"):
        assert k in err


def test_unknown_key_inside_dict_of_dataclasses():
    errs = _errors(RootCfg, {"models": {"policy": {"pth": "x"}}})
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
    assert _errors(OptimCfg, {"warmup_steps": False}) == [
        "warmup_steps: expected int, got False (bool)"
    ]
    assert _errors(OptimCfg, {"lr": True}) == ["lr: expected float, got True (bool)"]


def test_float_rejected_for_int():
    assert _errors(OptimCfg, {"warmup_steps": 3.0}) == [
        "warmup_steps: expected int, got 3.0 (float)"
    ]


def test_int_accepted_for_float():
    cfg = from_dict(OptimCfg, {"lr": 2, "betas": [1, 0.5]})
    assert cfg.lr == 2.0 and type(cfg.lr) is float
    assert cfg.betas == (1.0, 0.5) and all(type(b) is float for b in cfg.betas)


def test_literal_error_lists_options():
    (err,) = _errors(ModelCfg, {"dtype": "float16"})
    assert err.startswith("dtype: expected one of 'bf16', 'fp32', got 'float16' (str)")


def test_optional():
    assert from_dict(ModelCfg, {"max_len": None}).max_len is None
    assert from_dict(ModelCfg, {"max_len": 5}).max_len == 5
    assert _errors(ModelCfg, {"max_len": "long"}) == [
        "max_len: expected int | None, got 'long' (str)"
    ]
    # Optional dataclass: nested errors keep their paths.
    assert from_dict(RootCfg, {"critic": {"lr": 0.5}}).critic == OptimCfg(lr=0.5)
    assert _errors(RootCfg, {"critic": {"lr": "x"}}) == [
        "critic.lr: expected float, got 'x' (str)"
    ]


def test_long_values_truncated():
    (err,) = _errors(RootCfg, {"name": list(range(1000))})
    got = err.split("got ", 1)[1]
    assert len(got) < 80 and "..." in got and got.endswith("(list)")


def test_post_init_value_error_collected_with_path():
    errs = _errors(RootCfg, {"optim": {"lr": -1.0}, "critic": {"lr": 0}, "seed": "x"})
    assert sorted(errs) == sorted(
        [
            "optim: lr must be positive, got -1.0",
            "critic: lr must be positive, got 0.0",
            "seed: expected int, got 'x' (str)",
        ]
    )


def test_post_init_config_error_merged():
    errs = _errors(
        RootCfg,
        {"agents": [{"model": "nope"}, {}, {"model": "other"}], "optim": {"lrr": 1}},
    )
    assert errs == [
        "unknown key 'optim.lrr'; did you mean 'optim.lr'?",
        "agents[0].model: unknown model 'nope'",
        "agents[2].model: unknown model 'other'",
    ]


def test_post_init_error_prefixed_with_path_when_nested():
    errs = _errors(NeedsCfg, {"must": 1, "inner": {"agents": [{"model": "x"}]}})
    assert errs == ["inner: agents[0].model: unknown model 'x'"]


def test_required_field():
    assert _errors(NeedsCfg, {}) == ["must: required"]
    assert from_dict(NeedsCfg, {"must": 2}).must == 2


def test_path_prefix_and_non_mapping_root():
    assert _errors(OptimCfg, {"lr": "x"}) == ["lr: expected float, got 'x' (str)"]
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

    errs = _errors(C, {"m": {1: 2, "a": "b"}})
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
    (err,) = _errors(C, {"pair": [1]})
    assert err.startswith("pair: expected tuple[int, str] (2 items)")


def test_config_error_pickles_and_accepts_single_message():
    e = ConfigError("boom")
    assert e.errors == ["boom"] and str(e) == "1 config error(s):\n  boom"
    e2 = pickle.loads(pickle.dumps(ConfigError(["a", "b"])))
    assert e2.errors == ["a", "b"]
    assert isinstance(e2, ValueError)


# ---------------------------------------------------------------------------
# Sections: keys named after registered plug-ins
# ---------------------------------------------------------------------------

REGISTRY: dict[str, type | None] = {"a": OptimCfg, "b": ModelCfg, "free": None}


@dataclass(kw_only=True)
class PickCfg(Sections):
    name: str = "a"
    """The selected plug-in."""

    kind: ClassVar[str] = "plug-in"
    alias: ClassVar[str | None] = "options"

    @classmethod
    def section_types(cls) -> dict[str, type | None]:
        return dict(REGISTRY)


@dataclass(kw_only=True)
class HolderCfg:
    pick: PickCfg = field(default_factory=PickCfg)
    """A plug-in and its options."""


def test_sections_take_their_defaults_and_read_as_attributes():
    cfg = from_dict(HolderCfg, {"pick": {"name": "b", "b": {"path": "x"}}})
    assert cfg == HolderCfg(pick=PickCfg(name="b", sections={"b": ModelCfg(path="x")}))
    assert cfg.pick.selected is cfg.pick.b and cfg.pick.a == OptimCfg() and cfg.pick.free == {}
    assert from_dict(HolderCfg, to_dict(cfg)) == cfg
    assert to_dict(cfg)["pick"] == {"name": "b", "a": to_dict(OptimCfg()), "b": to_dict(ModelCfg(path="x")), "free": {}}
    with pytest.raises(AttributeError):
        cfg.pick.c  # noqa: B018


def test_section_errors_name_their_keys():
    errs = _errors(HolderCfg, {"pick": {"a": {"lr": "x", "lrr": 1}, "bb": {}, "b": {"dtype": "fp8"}}})
    assert errs == [
        "pick.a.lr: expected float, got 'x' (str)",
        "unknown key 'pick.a.lrr'; did you mean 'pick.a.lr'?",
        "unknown key 'pick.bb'; did you mean 'pick.b'?",
        "pick.b.dtype: expected one of 'bf16', 'fp32', got 'fp8' (str)",
    ]
    assert _errors(HolderCfg, {"pick": {"a": {"lr": -1.0}}}) == ["pick.a: lr must be positive, got -1.0"]


def test_alias_spells_the_selected_section():
    assert from_dict(HolderCfg, {"pick": {"name": "b", "options": {"path": "y"}}}).pick.b.path == "y"
    assert from_dict(HolderCfg, {"pick": {"options": {}}}) == HolderCfg()
    assert _errors(HolderCfg, {"pick": {"options": {"lr": "x"}}}) == ["pick.options.lr: expected float, got 'x' (str)"]


def test_sections_follow_the_registry():
    with pytest.raises(ConfigError):
        from_dict(HolderCfg, {"pick": {"c": {}}})
    REGISTRY["c"] = AgentCfg
    try:
        assert from_dict(HolderCfg, {"pick": {"c": {"role": "x"}}}).pick.c == AgentCfg(role="x")
        assert "pick.c.role: str = solver" in describe(HolderCfg)
    finally:
        del REGISTRY["c"]
    text = describe(HolderCfg)
    assert "pick.name: str = a" in text and "pick.a.lr: float = 1.0e-05" in text and "pick.free: dict[str, Any] = {}" in text
    assert "pick.sections" not in text


# ---------------------------------------------------------------------------
# Overrides and merge
# ---------------------------------------------------------------------------


def test_parse_overrides():
    got = parse_overrides(
        ["a.b=3", "x=[1,2]", "name=foo", "lr=1e-5", "a.c=true", "s='3'", "n=", "e=a=b"]
    )
    assert got == {
        "a": {"b": 3, "c": True},
        "x": [1, 2],
        "name": "foo",
        "lr": 1e-5,
        "s": "3",
        "n": "",
        "e": "a=b",
    }
    assert isinstance(got["lr"], float)


def test_empty_override_is_the_empty_string():
    # a shell turns key='' into key=; null still gives None
    assert parse_overrides(["a.b=", "c=null", "d=''"]) == {"a": {"b": ""}, "c": None, "d": ""}


def test_parse_overrides_later_wins():
    assert parse_overrides(["a=1", "a.b=2"]) == {"a": {"b": 2}}
    assert parse_overrides(["a.b=2", "a=1"]) == {"a": 1}
    assert parse_overrides(["a={x: 1}", "a.y=2"]) == {"a": {"x": 1, "y": 2}}


def test_parse_overrides_errors_collected():
    with pytest.raises(ConfigError) as info:
        parse_overrides(["a.b", "ok=1", "=3", "a..b=1", "x=[1,"])
    errs = info.value.errors
    assert len(errs) == 4
    assert "expected key=value" in errs[0] and "'a.b'" in errs[0]
    assert "expected key=value" in errs[1] and "expected key=value" in errs[2]
    assert "invalid YAML" in errs[3]


def test_merge_deep_and_pure():
    base = {"a": {"b": 1, "c": {"d": 2}}, "l": [1, 2], "s": 1}
    over = {"a": {"c": {"e": 3}}, "l": [3], "n": {"x": 1}}
    out = merge(base, over)
    assert out == {"a": {"b": 1, "c": {"d": 2, "e": 3}}, "l": [3], "s": 1, "n": {"x": 1}}
    assert base == {"a": {"b": 1, "c": {"d": 2}}, "l": [1, 2], "s": 1}
    assert over == {"a": {"c": {"e": 3}}, "l": [3], "n": {"x": 1}}
    assert merge({"a": {"b": 1}}, {"a": 5}) == {"a": 5}
    assert merge({"a": 5}, {"a": {"b": 1}}) == {"a": {"b": 1}}


# ---------------------------------------------------------------------------
# load
# ---------------------------------------------------------------------------


def test_load_defaults_only():
    assert load(RootCfg, None) == RootCfg()


def test_load_file_and_overrides(tmp_path):
    p = tmp_path / "cfg.yaml"
    p.write_text(
        "seed: 3\n"
        "optim:\n"
        "  lr: 3e-4\n"
        "models:\n"
        "  policy:\n"
        "    path: org/p\n"
    )
    cfg = load(RootCfg, p, ["models.big.path=foo", "optim.schedule=cosine", "seed=4"])
    assert cfg.seed == 4
    assert cfg.optim == OptimCfg(lr=3e-4, schedule="cosine")
    assert cfg.models == {"policy": ModelCfg(path="org/p"), "big": ModelCfg(path="foo")}
    # str path works too
    assert load(RootCfg, str(p)).seed == 3


def test_load_overrides_validated():
    with pytest.raises(ConfigError) as info:
        load(RootCfg, None, ["optim.lr=fast", "models.big.dtyp=fp32"])
    assert info.value.errors == [
        "optim.lr: expected float, got 'fast' (str)",
        "unknown key 'models.big.dtyp'; did you mean 'models.big.dtype'?",
    ]


def test_load_yaml_syntax_error_has_path_and_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("seed: 1\noptim:\n  lr: [1, 2\nname: x\n")
    with pytest.raises(ConfigError) as info:
        load(RootCfg, p)
    (err,) = info.value.errors
    assert str(p) in err
    assert re.search(r"line \d+", err)
    assert "YAML syntax error" in err


def test_load_duplicate_key_is_an_error(tmp_path):
    p = tmp_path / "dup.yaml"
    p.write_text("seed: 1\nname: a\nseed: 2\n")
    with pytest.raises(ConfigError) as info:
        load(RootCfg, p)
    (err,) = info.value.errors
    assert str(p) in err and "line 3" in err and "duplicate key 'seed'" in err


def test_load_yaml_merge_keys_allowed(tmp_path):
    p = tmp_path / "anchors.yaml"
    p.write_text(
        "models:\n"
        "  policy: &base {path: a, dtype: fp32}\n"
        "  judge:\n"
        "    <<: *base\n"
        "    path: b\n"
    )
    cfg = load(RootCfg, p)
    assert cfg.models["judge"] == ModelCfg(path="b", dtype="fp32")


def test_load_missing_file(tmp_path):
    p = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load(RootCfg, p)
    assert str(p) in str(info.value) and "not found" in str(info.value)


def test_load_empty_and_non_mapping_file(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    assert load(RootCfg, empty) == RootCfg()
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError) as info:
        load(RootCfg, lst)
    assert str(lst) in str(info.value) and "mapping" in str(info.value)


# ---------------------------------------------------------------------------
# Docs
# ---------------------------------------------------------------------------


def test_field_docs():
    docs = field_docs(OptimCfg)
    assert docs["lr"] == "AdamW learning rate."
    assert docs["schedule"] == "Learning-rate schedule.\nconstant: fixed; cosine: cosine decay."
    assert "warmup_steps" not in docs
    assert field_docs(RootCfg)["models"] == "Models by name."
    # Copy is returned; the cache cannot be corrupted.
    docs["lr"] = "changed"
    assert field_docs(OptimCfg)["lr"] == "AdamW learning rate."


def test_field_docs_inherited_and_local_class():
    @dataclass(kw_only=True)
    class Child(OptimCfg):
        extra: int = 1
        """Child field."""

    docs = field_docs(Child)
    assert docs["extra"] == "Child field."
    assert docs["lr"] == "AdamW learning rate."


def test_describe_lists_every_dotted_key():
    text = describe(RootCfg)
    keys = {line.split(":", 1)[0] for line in text.splitlines() if not line.startswith(" ")}
    expected = {
        "seed", "name", "extra", "tags", "optim", "models", "agents", "critic",
        *(f"optim.{k}" for k in ("lr", "schedule", "betas", "warmup_steps")),
        *(f"critic.{k}" for k in ("lr", "schedule", "betas", "warmup_steps")),
        *(f"models.<name>.{k}" for k in ("path", "dtype", "max_len")),
        *(f"agents[<i>].{k}" for k in ("role", "model", "trainable")),
    }
    assert keys == expected
    assert "optim.lr: float = 1.0e-05" in text
    assert "    AdamW learning rate." in text
    assert "optim.schedule: 'constant' | 'cosine' = constant" in text
    assert "models.<name>.max_len: int | None = null" in text
    assert "critic: OptimCfg | None = null" in text
    assert "    Learning-rate schedule.\n    constant: fixed; cosine: cosine decay." in text


def test_describe_prefix_and_required():
    text = describe(NeedsCfg, prefix="x.")
    assert "x.must: int  (required)" in text
    assert "x.inner.optim.lr: float = 1.0e-05" in text


# ---------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_keys = st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True)
_scalars = st.one_of(
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.booleans(),
    st.none(),
    st.text("abcxyz -_./", max_size=8),
)


@settings(max_examples=60, deadline=None)
@given(path=st.lists(_keys, min_size=1, max_size=4), value=_scalars)
def test_override_value_round_trips_through_yaml_text(path, value):
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    if text.endswith("\n..."):
        text = text[: -len("\n...")].strip()
    got = parse_overrides([".".join(path) + "=" + text])
    for key in path:
        got = got[key]
    assert got == value and type(got) is type(value)


_trees = st.recursive(
    _scalars, lambda inner: st.dictionaries(_keys, inner, max_size=3), max_leaves=10
)


@settings(max_examples=60, deadline=None)
@given(a=st.dictionaries(_keys, _trees, max_size=4), b=st.dictionaries(_keys, _trees, max_size=4))
def test_merge_properties(a, b):
    assert merge(a, {}) == a
    assert merge({}, b) == b
    out = merge(a, b)
    assert set(out) == set(a) | set(b)
    for k, v in b.items():
        if not isinstance(v, dict):
            assert out[k] == v
    assert merge(out, b) == out  # idempotent
