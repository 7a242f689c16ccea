"""The ``memory plan`` lines of ``teamrl train --dry-run``: per model, the CPU's phases, whether it fits this machine and
which settings would make it fit, and the GPUs it would need."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from teamrl.plan import CPU_RUNTIME_GIB, GIB, GPU_GIB, ModelPlan, cpu_peak, plan_config, undeclared_calls

if TYPE_CHECKING:
    from teamrl.config.schema import Config


def fsdp_workers_to_fit(p: ModelPlan, gib: float = GPU_GIB) -> int | None:
    """The fewest FSDP workers that put ``p`` under ``gib`` per device (weights and train state divided), or None.

    >>> fsdp_workers_to_fit(ModelPlan("m", 1, 40 * GIB, 60 * GIB, 10 * GIB, 5 * GIB, 1))
    2
    """
    fixed, split = p.activations + p.kv_cache, p.weights + p.train
    room = gib * GIB - fixed
    if room <= 0:
        return None
    return max(1, math.ceil(split / room))


def plans_gpu(cfg: Config) -> bool:
    """Whether the plan is a GPU one: torch sees a GPU, or a model is placed on one (``cuda``, ray ``num_gpus``)."""
    import torch

    return torch.cuda.is_available() or any(
        m.device.startswith("cuda") or m.placement.num_gpus > 0 for m in cfg.models.values())


def g(x: float) -> str:
    """Bytes in GiB, two decimals."""
    return f"{x / GIB:.2f}"


def format_plan(cfg: Config, *, on_gpu: bool = True, bf16_native: bool | None = None) -> str:
    """The ``memory plan`` lines of ``--dry-run``: one per model, then the devices it needs."""
    plans, unknown = plan_config(cfg, on_gpu=on_gpu, bf16_native=bf16_native)
    lines = []
    for p in plans:
        detail = (f"weights {g(p.weights - p.copies)} + engine copies {g(p.copies)} + AdamW {g(p.train - p.grads)} + "
                  f"gradients {g(p.grads)} + activations {g(p.activations - p.logits)} + logits {g(p.logits)} + "
                  f"kv cache {g(p.kv_cache)}")
        if p.phases:
            detail += f"; rollout {g(p.resident + p.rollout_peak)}, update {g(p.resident + p.update_peak)}"
        if p.offloaded:
            detail += f"; {p.offloaded / GIB:.1f} GiB offloaded to CPU memory"
        fit = ""
        if p.per_device > GPU_GIB * GIB:
            n = fsdp_workers_to_fit(p)
            fit = (f"; over {GPU_GIB:.0f} GiB: placement.sharding fsdp with dp_workers >= {n} fits"
                   if n else f"; over {GPU_GIB:.0f} GiB even sharded: lower loss.micro_batch_tokens or max_batch_size")
        lines.append(f"memory plan: model {p.name} ({p.params / 1e9:.2f} B params): {p.per_device / GIB:.1f} GiB "
                     f"per device x {p.devices} device(s) ({detail}){fit}")
    note = undeclared_calls(cfg)
    if note:
        lines.append(f"memory plan: {note}")
    for name in unknown:
        lines.append(f"memory plan: model {name} ({cfg.models[name].path}): shape unknown (not in teamrl.plan.SHAPES "
                     f"and no local config.json); not planned")
    if on_gpu:
        devices = sum(p.devices for p in plans) + len(unknown)
        peak = max((p.per_device for p in plans), default=0.0)
        lines.append(f"memory plan: {devices} GPU(s) needed, at most {peak / GIB:.1f} GiB on one "
                     f"(GPU precision rules; formula: teamrl/plan/)")
    else:  # every model in this process's memory
        total = cpu_peak(plans) + CPU_RUNTIME_GIB * GIB
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        verdict = "fits" if total <= ram else "does NOT fit"
        if all(p.phases for p in plans) and plans:
            resident = sum(p.resident for p in plans) + CPU_RUNTIME_GIB * GIB
            rollout = resident + sum(p.rollout_peak for p in plans)
            update = resident + max(p.update_peak for p in plans)
            lines.append(f"memory plan: the CPU's phases: rollout {rollout / GIB:.1f} GiB, update {update / GIB:.1f} GiB "
                         f"(runtime {CPU_RUNTIME_GIB} GiB included)")
        lines.append(f"memory plan: 1 device (the CPU), {total / GIB:.1f} GiB peak resident memory: all models and "
                     f"{CPU_RUNTIME_GIB} GiB of runtime; this machine has {ram / GIB:.1f} GiB: {verdict} "
                     f"(formula: teamrl/plan/, docs/memory.md)")
        if total > ram:
            fix = knobs_to_fit(cfg, ram, bf16_native=bf16_native)
            lines.append(f"memory plan: {fix[0]} would make it fit ({fix[1] / GIB:.1f} GiB)" if fix else
                         "memory plan: no memory setting makes it fit on this CPU: a smaller model, or --smoke (the "
                         "embedded model, small sizes)")
        gpu_plans, _ = plan_config(cfg, on_gpu=True)
        lines.append(f"memory plan: on {GPU_GIB:.0f} GiB GPUs it would need {gpus_needed(gpu_plans)}")
    return "\n".join(lines)


def knobs_to_fit(cfg: Config, ram: float, *, bf16_native: bool | None = None) -> tuple[str, float] | None:
    """The first of the memory settings, taken in turn and each added to those before it, under which ``cfg``'s CPU
    plan fits ``ram`` bytes: (the overrides, the planned bytes), or None when even all of them do not fit. The order
    is that of their cost in time: logits chunks, one gradient buffer, checkpointing, smaller micro-batches, 8-bit
    AdamW moments; a setting that lowers nothing (the config's own already) is not named."""
    import copy
    from functools import partial

    trained = [n for n, m in cfg.models.items() if m.trainable and any(a.model == n for a in cfg.agents.values())]

    def ckpt(c: Config, n: str) -> None:
        c.models[n].gradient_checkpointing, c.models[n].checkpoint_layers = True, 1.0

    def ckpt_text(n: str) -> str:
        m = cfg.models[n]
        return (f"models.{n}.checkpoint_layers=1" if m.gradient_checkpointing and m.checkpoint_layers < 1
                else f"models.{n}.gradient_checkpointing=true")

    def bits(c: Config, n: str) -> None:
        c.models[n].optim.states = "8bit"

    # each group is taken as one (every trained model's checkpointing together), the cheapest in time first
    groups: list[list[tuple[str, Callable[[Config], None]]]] = [
        [("loss.logits_chunk_tokens=256", lambda c: _cap(c.loss, "logits_chunk_tokens", 256))],
        [("loss.agent_grad_norms=false", lambda c: setattr(c.loss, "agent_grad_norms", False))],
        [(ckpt_text(n), partial(ckpt, n=n)) for n in trained],
        [("loss.micro_batch_tokens=1024", lambda c: _cap(c.loss, "micro_batch_tokens", 1024))],
        [(f"models.{n}.optim.states=8bit", partial(bits, n=n)) for n in trained],
    ]
    trial, said = copy.deepcopy(cfg), []
    last = cpu_peak(plan_config(trial, on_gpu=False, bf16_native=bf16_native)[0])
    for group in groups:
        changed = []
        for text, apply in group:
            before = copy.deepcopy(trial)
            apply(trial)
            if trial != before:
                changed.append(text)
        total = cpu_peak(plan_config(trial, on_gpu=False, bf16_native=bf16_native)[0])
        if total >= last:  # already the config's settings, or no saving here: nothing to name
            continue
        said += changed
        last = total
        if total + CPU_RUNTIME_GIB * GIB <= ram:
            return " ".join(said), total + CPU_RUNTIME_GIB * GIB
    return None


def _cap(section: object, key: str, cap: int) -> None:
    """Set ``section.key`` to ``cap``, unless it is already a smaller positive count (0, None or auto: unbounded)."""
    value = getattr(section, key)
    if not (isinstance(value, int) and 0 < value <= cap):
        setattr(section, key, cap)


def gpus_needed(plans: list[ModelPlan], gib: float = GPU_GIB) -> str:
    """How many GPUs of ``gib`` the models need: one each where it fits, FSDP workers where it does not.

    >>> gpus_needed([ModelPlan("a", 1, 10 * GIB, 10 * GIB, 1 * GIB, 1 * GIB, 1),
    ...              ModelPlan("b", 1, 40 * GIB, 60 * GIB, 10 * GIB, 5 * GIB, 1)])
    '3 GPU(s) (a: 1, b: 2 with placement.sharding fsdp)'
    """
    parts, total = [], 0
    for p in plans:
        n = p.devices if p.per_device <= gib * GIB else fsdp_workers_to_fit(p, gib)
        if n is None:
            return f"more than its GPUs can hold: {p.name} does not fit even sharded (lower micro_batch_tokens)"
        total += n
        parts.append(f"{p.name}: {n}" + ("" if p.per_device <= gib * GIB else " with placement.sharding fsdp"))
    return f"{total} GPU(s) ({', '.join(parts)})"
