"""Data-parallel learner workers over ``torch.distributed`` (gloo on CPU, NCCL on GPU).

:class:`DataParallel` is what :class:`teamrl.learner.learner.TorchLearner` needs to be one of ``world``
workers that each hold the whole model: its rank (which share of the rows it trains on), a sum of
gradients across workers and a gather of Python objects (the metric accumulators).
:class:`ShardedDataParallel` (``placement.sharding: fsdp``) shards the weights, gradients and AdamW
state across the workers with PyTorch FSDP2 (``fully_shard``), optionally offloaded to CPU memory.
Neither knows about Ray; the Ray backend (:mod:`teamrl.runtime.distributed.backend`) starts one
worker per rank and calls :func:`init_process_group` in each.
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
    """This worker's place among the data-parallel learners of one model, each holding every weight.

    >>> DataParallel(rank=0, world=1).rank
    0
    """

    sharded = False

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

    def total(self, local: float) -> float:
        """A sum whose terms are spread over the workers (a squared gradient norm); here each holds them all."""
        return local

    def micro_batches(self, n: int) -> int:
        """How many micro-batches this worker runs when it has ``n`` of its own: ``n`` (nothing else waits on it)."""
        return n

    def gather(self, obj: Any) -> list[Any]:
        """``obj`` of every worker, in rank order."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out


class ShardedDataParallel(DataParallel):
    """Data parallelism with FSDP2: each worker keeps ``1/world`` of every weight, gradient and AdamW moment.

    Each decoder layer is one FSDP unit (its weights are gathered for its forward and backward, then
    freed); the embeddings, final norm and LM head are the root unit. Gradients are reduce-scattered
    as sums (not means: the loss denominators are already those of the whole batch), so each worker
    ends a backward pass holding its shard of the summed gradient; a gradient norm is the square root
    of the workers' summed squared shard norms, exact under sharding. Every FSDP forward and backward
    is a collective, so the learner runs as many micro-batches on every worker (:meth:`micro_batches`).

    ``offload``: the shards (weights, gradients, AdamW state) live in CPU memory and the optimizer
    step runs on the CPU (FSDP2's ``CPUOffloadPolicy``); layers are copied to the GPU for compute.
    """

    sharded = True

    def __init__(self, rank: int, world: int, *, offload: bool = False) -> None:
        super().__init__(rank, world)
        self.offload = offload

    def shard(self, root: torch.nn.Module, layers: list[torch.nn.Module]) -> None:
        """Make ``layers`` (the decoder layers inside ``root``) and ``root`` FSDP units, sharded over the workers."""
        from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, fully_shard

        kw: dict[str, Any] = {"offload_policy": CPUOffloadPolicy()} if self.offload else {}
        for layer in layers:
            fully_shard(layer, **kw)
        fully_shard(root, **kw)
        for m in root.modules():
            if isinstance(m, FSDPModule):
                m.set_gradient_divide_factor(1.0)  # sum, not mean, across workers
                if hasattr(m, "set_force_sum_reduction_for_comms"):  # gloo has no pre-scaled sum
                    m.set_force_sum_reduction_for_comms(True)

    def sum_(self, params: list[torch.Tensor]) -> None:
        """Nothing to do: backward already reduce-scattered each gradient as a sum."""

    def total(self, local: float) -> float:
        return _all_reduce(local, dist.ReduceOp.SUM)

    def micro_batches(self, n: int) -> int:
        """The most micro-batches any worker runs for this agent; each runs that many (idle ones weigh 0)."""
        return int(_all_reduce(n, dist.ReduceOp.MAX))

    def full_weights(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The whole ``state_dict`` on rank 0, on the CPU (an empty dict on the other ranks); a collective."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {n: t for n, t in full.items() if isinstance(t, torch.Tensor)}

    def load_full_weights(self, model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
        """Load a whole ``state_dict`` (every rank holds it) into the shards; a collective."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, dict(state), options=StateDictOptions(full_state_dict=True))

    def full_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's ``state_dict`` with whole (unsharded) moments on rank 0, keyed by parameter index in
        ``optimizer.param_groups`` order like an unsharded optimizer's (so checkpoints move between the two);
        the other ranks get an empty dict. A collective."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        full: dict[str, Any] = dict(get_optimizer_state_dict(
            model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)))
        if not full:
            return {}
        index = {fqn: i for i, fqn in enumerate(_fqns(model, optimizer))}
        return {"state": {index[fqn]: s for fqn, s in full["state"].items()},
                "param_groups": [{**g, "params": [index[fqn] for fqn in g["params"]]} for g in full["param_groups"]]}

    def load_full_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                                  state: dict[str, Any]) -> None:
        """Load what :meth:`full_optimizer_state` returned (or an unsharded optimizer's ``state_dict``); a collective."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        fqns = _fqns(model, optimizer)
        named: dict[str, Any] = {"state": {fqns[int(i)]: s for i, s in state["state"].items()},
                                 "param_groups": [{**g, "params": [fqns[int(i)] for i in g["params"]]}
                                                  for g in state["param_groups"]]}
        set_optimizer_state_dict(model, optimizer, named, options=StateDictOptions(full_state_dict=True))


def _all_reduce(value: float, op: Any) -> float:
    """``value`` reduced over the workers with ``op`` (one float64 on the device NCCL needs, else the CPU)."""
    t = torch.tensor([value], dtype=torch.float64, device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=op)
    return float(t)


def _fqns(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The name in ``model`` of each parameter of ``optimizer``, in ``param_groups`` order."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for g in optimizer.param_groups for p in g["params"]]

