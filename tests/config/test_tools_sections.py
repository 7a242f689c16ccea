"""teamrl.config.tools.Sections: keys named after registered plug-ins."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from teamrl.config.tools import (
    ConfigError,
    Sections,
    describe,
    from_dict,
    to_dict,
)
from tests.config.toolcfg import AgentCfg, ModelCfg, OptimCfg, errors_of

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
    errs = errors_of(HolderCfg, {"pick": {"a": {"lr": "x", "lrr": 1}, "bb": {}, "b": {"dtype": "fp8"}}})
    assert errs == [
        "pick.a.lr: expected float, got 'x' (str)",
        "unknown key 'pick.a.lrr'; did you mean 'pick.a.lr'?",
        "unknown key 'pick.bb'; did you mean 'pick.b'?",
        "pick.b.dtype: expected one of 'bf16', 'fp32', got 'fp8' (str)",
    ]
    assert errors_of(HolderCfg, {"pick": {"a": {"lr": -1.0}}}) == ["pick.a: lr must be positive, got -1.0"]


def test_alias_spells_the_selected_section():
    assert from_dict(HolderCfg, {"pick": {"name": "b", "options": {"path": "y"}}}).pick.b.path == "y"
    assert from_dict(HolderCfg, {"pick": {"options": {}}}) == HolderCfg()
    assert errors_of(HolderCfg, {"pick": {"options": {"lr": "x"}}}) == ["pick.options.lr: expected float, got 'x' (str)"]


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
