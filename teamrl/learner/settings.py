"""A learner's settings, parameter groups, optimizer, learning-rate schedule and micro-batch budgets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from teamrl.algos.schedule import Schedule
from teamrl.learner import lowbit
from teamrl.metrics.memory import auto_micro_batch_tokens, free_memory_bytes
from teamrl.models import CausalLM

if TYPE_CHECKING:
    from transformers.modeling_layers import GradientCheckpointingLayer


@dataclass(frozen=True)
class LearnerSettings:
    """Everything a learner needs, resolved from the config (see ``teamrl.config.schema``)."""

    lr: float
    betas: tuple[float, float]
    weight_decay: float
    grad_clip: float
    warmup_steps: float  # positions of the schedule (training steps), warmup_ratio resolved
    schedule: str
    total_steps: int
    clip_low: float
    clip_high: float
    dual_clip: float | None
    agg: str
    level: str
    kl_coef: float
    kl_kind: str
    entropy_coef: float
    micro_batch_tokens: int | str  # "auto": chosen from the device's free memory when the learner is built
    updates_per_batch: int
    mini_batch_rows: int = 0  # > 0: consecutive mini-batches of this many rows instead of updates_per_batch
    drop_remainder: bool = False  # with mini_batch_rows: rows that fill no whole mini-batch are not trained
    old_logprobs: str = "engine"
    autocast: bool = False
    logits_chunk_tokens: int = 0
    fused_adamw: bool = False
    optim_states: str = "float32"  # "8bit": torchao's AdamW8bit
    pack_rows: bool = False  # micro-batches as packed rows without padding (learner/packing.py)
    share_prefixes: bool = False  # and common prefixes computed once
    agent_grad_norms: bool = True  # each agent's gradient apart (exact per-agent norms; one more gradient buffer)
    trim_micro_batches: bool = False  # on the CPU, glibc's free heap pages returned after each micro-batch
    rollout_correction: str = "none"  # teamrl.algos.correction.MODES
    correction_threshold: float = 2.0
    correction_lower: float | None = None
    correction_veto: float | None = None
    logprob_temperature: float = 0.0  # > 0: the learner scores every row at this temperature, not its sampling one
    schedule_style: str = "teamrl"  # teamrl.algos.schedule.STYLES
    min_lr_ratio: float = 0.0


@dataclass
class ParamGroup:
    """Parameters trained together with one learning rate, weight decay and gradient clip."""

    name: str
    params: dict[str, torch.nn.Parameter]
    lr: float
    weight_decay: float


def schedule_of(s: LearnerSettings) -> Schedule:
    """The learning-rate schedule of ``s`` (:mod:`teamrl.algos.schedule`)."""
    return Schedule(s.schedule, s.schedule_style, max(1, s.total_steps), float(s.warmup_steps), s.min_lr_ratio)


def set_rates(optimizer: torch.optim.Optimizer, base_lrs: list[float], factor: float) -> None:
    """Every parameter group's learning rate: its base rate x ``factor``."""
    for group, lr in zip(optimizer.param_groups, base_lrs):
        group["lr"] = lr * factor


def split_mini_batches(n: int, *, updates: int = 1, rows: int = 0, drop_remainder: bool = False) -> list[list[int]]:
    """The mini-batches (row indices; one optimizer step each) of a batch of ``n`` rows.

    ``rows`` = 0: ``min(updates, n)`` mini-batches, row i in mini-batch i mod that number (sizes differ by at
    most one). ``rows`` > 0: consecutive runs of ``rows`` rows in batch order, as verl's and PettingLLMs'
    ``ppo_mini_batch_size`` split; the last, shorter one is kept unless ``drop_remainder``, which leaves
    those rows untrained (MARTI drops what fills no whole batch).

    >>> split_mini_batches(5, updates=2)
    [[0, 2, 4], [1, 3]]
    >>> split_mini_batches(5, rows=2), split_mini_batches(5, rows=2, drop_remainder=True)
    ([[0, 1], [2, 3], [4]], [[0, 1], [2, 3]])
    """
    if rows <= 0:
        k = min(updates, n)
        return [list(range(i, n, k)) for i in range(k)]
    end = n - n % rows if drop_remainder else n
    return [list(range(i, min(i + rows, end))) for i in range(0, end, rows)]


def build_optimizer(groups: list[dict[str, Any]], s: LearnerSettings) -> torch.optim.Optimizer:
    """AdamW over ``groups``: torch's (fused where ``fused_adamw``) for float32 moments, torchao's AdamW8bit for 8-bit ones."""
    if s.optim_states == "8bit":
        optimizer = lowbit.adamw_8bit(groups, betas=s.betas)
    else:
        optimizer = torch.optim.AdamW(groups, betas=s.betas, **({"fused": True} if s.fused_adamw else {}))
    optimizer.register_step_post_hook(_count_writes)
    return optimizer


def _count_writes(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """Count a step's writes in each weight's version counter: torch's fused kernel does not (the per-tensor step's
    in-place ops do), and the engine keys its decode copies and kept prefixes on it (they would outlive the weights
    they were made from when the engine shares the learner's module). One more count is harmless."""
    torch.autograd.graph.increment_version([p for g in optimizer.param_groups for p in g["params"]
                                            if not hasattr(p, "device_mesh")])  # FSDP's shards: no engine shares them


def auto_micro_batch(model: CausalLM, s: LearnerSettings, trainable: int, device: torch.device | None = None) -> int:
    """``loss.micro_batch_tokens: auto`` for ``model`` computing on ``device`` (default: where its weights are;
    :func:`teamrl.metrics.memory.auto_micro_batch_tokens`)."""
    c = model.config
    p = next(model.parameters())
    device = device or p.device
    return auto_micro_batch_tokens(
        free_memory_bytes(device), device_type=device.type, layers=c.num_hidden_layers, hidden=c.hidden_size,
        intermediate=getattr(c, "intermediate_size", None) or 4 * c.hidden_size, vocab=c.vocab_size,
        trainable=trainable, elem=p.element_size(), autocast=s.autocast, logits_chunk=s.logits_chunk_tokens,
        checkpointing=checkpointed_fraction(model), moment_bytes=2 if s.optim_states == "8bit" else 8)


def checkpointed_fraction(model: CausalLM) -> float:
    """The fraction of ``model``'s decoder layers that gradient checkpointing recomputes (0.0 with it off;
    ``models.<m>.checkpoint_layers``)."""
    if not checkpointing_on(model):
        return 0.0
    flags = [layer.gradient_checkpointing for layer in checkpointable_layers(model)]
    return sum(flags) / len(flags) if flags else 1.0


def checkpointable_layers(model: CausalLM) -> list[GradientCheckpointingLayer]:
    """``model``'s layers that Hugging Face checkpoints one by one (its decoder layers), in order."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def checkpointing_on(model: CausalLM) -> bool:
    """Whether Hugging Face activation (gradient) checkpointing is enabled on ``model``."""
    name = "is_activation_checkpointing" if hasattr(model, "is_activation_checkpointing") else "is_gradient_checkpointing"
    return bool(getattr(model, name, False))
