"""What runs inside one Ray actor: a model copy with its learner (one data-parallel rank) and/or engine.

A :class:`ModelWorker` is built by the same functions as the in-process path
(:func:`teamrl.engines.registry.build_engine`, :class:`teamrl.learner.learner.TorchLearner` with
:func:`teamrl.runtime.local.learner_settings` and ``param_groups``), so the algorithm exists
once; this file only adds the remote-call surface:

* ``role="learner"``: learner rank ``rank`` of ``world``; rank 0 of a colocated model also hosts
  the engine over the same module (hf: weight sync is free, as in one process).
* ``role="engine"``: an engine with its own copy of the weights (``placement.colocate: false``,
  or a frozen model); :meth:`load_weights` receives the learner's after every update.

The class is plain Python; :mod:`teamrl.runtime.distributed.backend` wraps it with ``ray.remote``.
"""

from __future__ import annotations

import copy
import logging
import os
import random
import socket
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from teamrl import hardware
from teamrl.config.schema import Config
from teamrl.engines.base import Engine, GenOutput, GenRequest, SteppedEngine
from teamrl.metrics.memory import return_memory
from teamrl.team.records import Step

if TYPE_CHECKING:
    from teamrl.learner.learner import TorchLearner

log = logging.getLogger(__name__)


def actor_hardware(hw: hardware.Hardware, num_gpus: float, bf16_speed: float | None) -> hardware.Hardware:
    """The hardware an actor resolves its model against: its own, without GPUs where its placement takes none, and
    with the driver's measured bf16 product speed (:func:`teamrl.hardware.cpu_bf16_speed`) in place of a measurement
    of its own, so that every rank of a model takes the same ``train_autocast: auto``.

    >>> actor_hardware(hardware.Hardware(cpu_bf16="avx512_bf16"), 0, 0.55).cpu_bf16_speed
    0.55
    >>> actor_hardware(hardware.Hardware(gpus=("H100",), gpu_bf16=(True,)), 0, 0.55)  # no bf16 flags: no speed
    Hardware(gpus=(), gpu_bf16=(), cpu_bf16=None, cpu_capped=None, cpu_bf16_speed=None)
    """
    if num_gpus == 0:
        hw = replace(hw, gpus=(), gpu_bf16=())
    return replace(hw, cpu_bf16_speed=bf16_speed if hw.cpu_bf16 else None)


class ModelWorker:
    """One actor of model ``name``: a learner rank (with the engine on rank 0 when colocated) or an engine."""

    def __init__(self, cfg: Config, name: str, *, role: str, rank: int = 0, world: int = 1,
                 with_engine: bool = False, threads: int = 1, bf16_speed: float | None = None) -> None:
        from teamrl.engines.registry import build_engine
        from teamrl.runtime import local

        torch.set_num_threads(max(1, threads))
        random.seed(cfg.train.seed)
        torch.manual_seed(cfg.train.seed)
        self.name, self.role, self.rank, self.world = name, role, rank, world
        self.placement = cfg.models[name].placement
        # the actor's own (Ray makes its placement.num_gpus GPUs visible to it), with the driver's bf16 speed
        hw = actor_hardware(hardware.detect(measure=False), cfg.models[name].placement.num_gpus, bf16_speed)
        # This actor's own model only, in the actor's copy of the config: re-validating the whole config
        # would refuse a concrete device under backend: ray, which is the user's rule, not the actor's.
        mc, line = hardware.resolve_model(name, cfg.models[name], hw, 0)
        log.info("%s", line)
        cfg = copy.copy(cfg)  # a shallow copy is not re-validated; the caller's config stays as it was
        object.__setattr__(cfg, "models", {**cfg.models, name: mc})
        self.model, self.tokenizer = local.load_model(cfg, name)
        self.device = next(self.model.parameters()).device  # where it computes (before any FSDP offload)
        self.params = sum(p.numel() for p in self.model.parameters())
        self.precision = "bfloat16" if "bfloat16" in (mc.dtype, mc.train_autocast) else "float32"
        with_engine = with_engine or role == "engine"
        self._engine: Engine | None = build_engine(cfg, name, self.tokenizer, self.model) if with_engine else None
        self._stepped_engine = self._engine if isinstance(self._engine, SteppedEngine) else None  # checked once
        self._own_learner: TorchLearner | None = None
        if role == "learner":
            self._learner = lambda dp: local.make_learner(cfg, name, self.model, dp)
            if world == 1 and self.placement.sharding == "replicate":  # else built by join(), in its process group
                self._own_learner = self._learner(None)
        else:
            self.model.requires_grad_(False)

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise RuntimeError(f"model {self.name!r}: this {self.role} actor holds no engine")
        return self._engine

    @property
    def learner(self) -> TorchLearner:
        if self._own_learner is None:
            raise RuntimeError(f"model {self.name!r}: this {self.role} actor holds no learner (or has not joined "
                               f"its process group yet)")
        return self._own_learner

    # ------------------------------------------------------------------ placement and data parallelism

    def where(self) -> dict[str, Any]:
        """Node, process and devices of this actor (for placement checks and logs)."""
        import ray

        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "pid": os.getpid(), "gpu_ids": ray.get_gpu_ids(),
                "threads": torch.get_num_threads()}

    def perf(self) -> dict[str, Any]:
        """Size and device of this actor's model for MFU: the GPU as ``node:gpu id`` (actors sharing a GPU
        share the name) with its peak TFLOP/s in the model's precision; ``cpu`` and no peak on a CPU."""
        import ray

        from teamrl.metrics.perf import peak_tflops

        if self.device.type != "cuda":
            return {"params": self.params, "device": "cpu", "peak": None}
        gpus = ",".join(str(g) for g in ray.get_gpu_ids())
        return {"params": self.params, "device": f"{ray.get_runtime_context().get_node_id()}:{gpus}",
                "peak": peak_tflops(torch.cuda.get_device_name(self.device), self.precision)}

    def rendezvous(self) -> tuple[str, int]:
        """Address and a free port of this actor's node, for rank 0 to host the process group."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), s.getsockname()[1]

    def join(self, address: str, port: int) -> None:
        """Join the model's data-parallel group (gloo on CPU, NCCL on GPU) and build the learner (which shards
        the model across the group under ``placement.sharding: fsdp``)."""
        from teamrl.runtime.distributed.dp import DataParallel, ShardedDataParallel, init_process_group

        device = next(self.model.parameters()).device.type
        init_process_group(address, port, self.rank, self.world, backend="nccl" if device == "cuda" else "gloo")
        self._own_learner = self._learner(
            ShardedDataParallel(self.rank, self.world, offload=self.placement.offload)
            if self.placement.sharding == "fsdp" else DataParallel(self.rank, self.world))

    # ------------------------------------------------------------------ engine

    def generate(self, requests: list[GenRequest]) -> list[GenOutput]:
        return self.engine.generate(requests)

    def add(self, requests: list[GenRequest]) -> list[int]:
        return self._stepped().add(requests)

    def step(self) -> list[tuple[int, GenOutput]]:
        return self._stepped().step()

    def _stepped(self) -> SteppedEngine:
        if self._stepped_engine is None:
            raise TypeError(f"model {self.name!r}: this actor's engine has no step API; use scheduler: lockstep")
        return self._stepped_engine

    def reset(self) -> None:
        self.engine.reset()

    def sync_weights(self) -> None:
        self.engine.sync_weights()

    def release_memory(self) -> None:
        self.engine.release_memory()

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """An engine actor receives the learner's weights, then syncs its engine (e.g. vLLM) from them."""
        self.model.load_state_dict(state)
        self.engine.sync_weights()

    def generator_state(self) -> torch.Tensor:
        return self.engine.generator.get_state()

    def set_generator_state(self, state: torch.Tensor) -> None:
        self.engine.generator.set_state(state)

    # ------------------------------------------------------------------ learner

    def update(self, steps: list[Step], step: int | None = None) -> dict[str, float]:
        return self.learner.update(steps, step)

    def weights(self) -> dict[str, torch.Tensor]:
        """The trained module's weights on the CPU (what an engine actor loads). Under FSDP every rank must call
        it (the shards are gathered); rank 0 gets them all, the others an empty dict."""
        if self._own_learner is not None and self._own_learner.sharded:
            return self._own_learner.dp.full_weights(self.model)
        return {k: v.detach().cpu() for k, v in self.model.state_dict().items()}

    def weight_files(self) -> dict[str, dict[str, torch.Tensor]]:
        return {k: {n: t.detach().cpu() for n, t in v.items()} for k, v in self.learner.weight_files().items()}

    def load_weight_files(self, files: dict[str, dict[str, torch.Tensor]]) -> None:
        self.learner.load_weight_files(files)

    def state_dict(self) -> dict[str, Any]:
        return self.learner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.learner.load_state_dict(state)

    def drop_optimizer_state(self) -> None:
        self.learner.drop_optimizer_state()
        return_memory()  # the actor's process gives the freed moments back
