"""Checkpoints: weights, optimizer and scheduler per physical model, RNG states, data cursor.

Weights are what each learner trains: ``model-<name>.pt`` for a fully trained model, or
``adapter-<name>-<adapter>.pt`` per LoRA adapter (the frozen base is reloaded from its path).

A checkpoint is a directory ``checkpoints/step_<n>`` written under a temporary name and renamed
into place, so a crash mid-write never leaves a half checkpoint; ``checkpoints/latest`` names
the newest complete one.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])


def save(root: Path, step: int, learners: dict[str, Any], trainer_state: dict[str, Any]) -> Path:
    """Write checkpoint ``step`` atomically; returns its directory."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
    try:
        for name, learner in learners.items():
            for key, state in learner.weight_files().items():
                torch.save(state, tmp / f"{key}.pt")
            torch.save(learner.state_dict(), tmp / f"optim-{name}.pt")
        torch.save({**trainer_state, "rng": rng_state(), "step": step}, tmp / "trainer.pt")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    pointer = root / ".latest.tmp"
    pointer.write_text(final.name)
    os.replace(pointer, root / "latest")
    return final


def latest(root: Path) -> Path | None:
    """The newest complete checkpoint under ``root``, or None."""
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    return path if (path / "trainer.pt").is_file() else None


def load(path: Path, learners: dict[str, Any]) -> dict[str, Any]:
    """Restore weights and optimizers in place; returns the trainer state (RNG already restored)."""
    for name, learner in learners.items():
        files = {}
        for key in learner.weight_files():
            f = path / f"{key}.pt"
            if not f.is_file():
                raise FileNotFoundError(f"checkpoint {path} has no weights {key!r} of model {name!r} ({f.name}); "
                                        f"resume with the models and adapters the checkpoint was written with")
            files[key] = torch.load(f, map_location="cpu", weights_only=True)
        learner.load_weight_files(files)
        learner.load_state_dict(torch.load(path / f"optim-{name}.pt", map_location="cpu", weights_only=False))
    state = torch.load(path / "trainer.pt", weights_only=False)
    set_rng_state(state["rng"])
    return state
