"""A small config schema that the tests of ``teamrl.config.tools`` validate, load and describe."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from teamrl.config.tools import ConfigError, from_dict


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


def errors_of(cls, data) -> list[str]:
    with pytest.raises(ConfigError) as info:
        from_dict(cls, data)
    return info.value.errors
