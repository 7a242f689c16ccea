"""Data-parallel learner workers over ``torch.distributed`` (gloo on CPU, NCCL on GPU).

:class:`DataParallel` is what :class:`teamrl.learner.learner.TorchLearner` needs to be one of ``world``
workers: its rank (which share of the rows it trains on), a sum of gradients across workers and
a gather of Python objects (the metric accumulators). It does not know about Ray; the Ray backend
(:mod:`teamrl.runtime.distributed.backend`) starts one worker per rank and calls :func:`init_process_group`
in each.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def init_process_group(address: str, port: int, rank: int, world: int, *, backend: str) -> None:
    """Join the process group of ``world`` workers whose rank 0 listens on ``address:port``."""
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group(backend, init_method=f"tcp://{address}:{port}", rank=rank, world_size=world)


class DataParallel:
    """This worker's place among the data-parallel learners of one model.

    >>> DataParallel(rank=0, world=1).rank
    0
    """

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world

    def sum_(self, params: list[torch.Tensor]) -> None:
        """Replace every ``p.grad`` by its sum over the workers (one flat all-reduce; missing grads count as 0)."""
        if self.world == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1).float() for g in grads])  # [sum of numel]
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p, g in zip(params, grads):
            n = g.numel()
            p.grad = flat[offset : offset + n].view_as(g).to(g.dtype)
            offset += n

    def gather(self, obj: Any) -> list[Any]:
        """``obj`` of every worker, in rank order."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out
