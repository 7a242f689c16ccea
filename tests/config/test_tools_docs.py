"""teamrl.config.tools: field docs and the dotted-key listing that `teamrl help config` prints."""

from __future__ import annotations

from dataclasses import dataclass

from teamrl.config.tools import (
    describe,
    field_docs,
)
from tests.config.toolcfg import NeedsCfg, OptimCfg, RootCfg

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
