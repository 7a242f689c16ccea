"""The learner contract: what the training loop, the checkpoints and the update schedules ask of a learner.

One learner trains one physical model on the steps of every agent mapped to it. The in-process
:class:`~teamrl.learner.learner.TorchLearner` and the Ray actor proxy
(:class:`~teamrl.runtime.distributed.backend.LearnerProxy`) implement it; the type checker verifies it where
they are built (:mod:`teamrl.runtime`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from teamrl.team.records import Step


@runtime_checkable
class Learner(Protocol):
    """Trains one physical model; saves and restores its weights and optimizer state."""

    def update(self, steps: list[Step], step: int | None = None) -> Mapping[str, float]:
        """Optimizer step(s) on ``steps`` (all of this model's agents) at the learning rate of training step ``step``
        (None: the learner's own count of updates); returns the update's metrics (``loss/...`` names and per-agent
        ``agent/<name>/grad_norm``)."""
        ...

    def weight_files(self) -> dict[str, dict[str, torch.Tensor]]:
        """The trained weights by checkpoint file stem (one per LoRA adapter, else the model's)."""
        ...

    def load_weight_files(self, files: dict[str, dict[str, torch.Tensor]]) -> None:
        """Load weights saved by :meth:`weight_files` (engines are re-synced by the caller or the proxy)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Optimizer, scheduler and learner counters, as tensors and plain values (saved as safetensors)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        ...

    def drop_optimizer_state(self) -> None:
        """Free the optimizer's state once training is over and a checkpoint holds it (the final evaluation runs
        without it); the learner then refuses to update or to give its state."""
        ...
