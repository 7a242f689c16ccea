"""teamrl.config.tools: command-line overrides, merging, and loading YAML files."""

from __future__ import annotations

import re

import pytest

from teamrl.config.tools import (
    ConfigError,
    load,
    merge,
    parse_overrides,
)
from tests.config.toolcfg import ModelCfg, OptimCfg, RootCfg

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
        "agents[0].model: unknown model 'policy'",  # the class's own rule runs too, with the bad value left out
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
