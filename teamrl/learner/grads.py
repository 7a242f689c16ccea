"""Gradient buffers of a learner's parameters, plain or FSDP-sharded (DTensors): each agent's gradient moved into
the sum of all agents' (and measured on the way), and sharded tensors as plain ones."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def local(t: torch.Tensor) -> torch.Tensor:
    """This worker's shard of an FSDP tensor (a DTensor); any other tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def full(t: torch.Tensor) -> torch.Tensor:
    """A replicated DTensor (an FSDP norm) as a plain tensor; any other tensor itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def move_grads(params: Sequence[torch.Tensor], grad_sum: list[torch.Tensor | None]) -> float:
    """Add the current .grad of every parameter into ``grad_sum``, clear it, return its squared norm (of the
    shards this worker holds, under FSDP)."""
    norms = []
    for i, p in enumerate(params):
        if p.grad is None:
            continue
        norms.append(torch.linalg.vector_norm(local(p.grad).detach(), dtype=torch.float32))  # no squared copy
        held = grad_sum[i]
        grad_sum[i] = p.grad if held is None else held.add_(p.grad)
        p.grad = None
    return float(torch.stack(norms).square().sum()) if norms else 0.0
