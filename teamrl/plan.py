"""The memory plan of a config: predicted memory per device and the number of devices, loading nothing.

``teamrl train CONFIG --dry-run`` prints one line per trained or frozen model and one total line. The
same formula holds on a CPU and a GPU (bytes are bytes); only the device size it is checked against
differs. A model's shape comes from :data:`SHAPES` (the ``config.json`` of the models the recipes
name), from ``config.json`` in a local model folder, or is unknown (the line says so).

Per model, with P parameters, T trained parameters (P, or the LoRA adapters' under ``lora.rank``)::

    weights    = P x (4 B float32 | 2 B bfloat16)              (+ 2 B x P for a bf16 rollout copy)
                 + the hf engine's decode copies, in its dtype: fused q/k/v and gate/up weights per
                   layer, and on the CPU every linear and the lm_head prepacked once more
    train      = (grads + moments) x T  gradients (4 B; 8 B with their per-agent sum when several agents train
                                        the model and loss.agent_grad_norms is on), AdamW's two moments
                                        (8 B in float32, 2 B in 8 bit)
    activations = tokens x per_token + 12 B x vocab x logits_chunk   (per_token as in
                  teamrl.metrics.memory.auto_micro_batch_tokens) + 2 B x P of bf16 weight casts under autocast
    kv cache   = 2 x layers x kv_heads x head_dim x 2 B x max_batch_size x context
                 context = max_context, else the longest max_new_tokens of its agents + PROMPT_TOKENS

On a GPU the engine keeps its KV cache (CUDA graphs, vLLM's pool) while the learner updates, so a
model needs the sum of the four. On the CPU the engine's cache lives only during a rollout and the
gradients only during an update, and with train.release_memory the hf engine's copies (the rollout
copy, the decode copies) only during a rollout too, so a model needs
``weights - copies + moments x T + max(grads x T + activations, kv cache + copies)``, and the process
:data:`CPU_RUNTIME_GIB` more (Python, torch, transformers, tokenizers, the task). docs/memory.md
compares the plan with measured peaks.

Left out: allocator fragmentation, CUDA context (~0.5 GiB per GPU), the engine's temporary
buffers, a KL reference model's copy, several models' phases overlapping on one CPU, and a vLLM engine's own memory pool (its ``gpu_memory_utilization``).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from teamrl.config.schema import Config, ModelConfig

GIB = 1 << 30
PROMPT_TOKENS = 512
"""Prompt tokens assumed per engine row for the KV cache when a model sets no max_context (the quickstart's
prompts take 100-300; the host loops size the cache to the batch's own prompts)."""
CPU_RUNTIME_GIB = 0.7
"""Resident memory of a training process before any model loads (Python, torch, transformers, the tokenizer; measured
with the quickstart on Linux, docs/memory.md)."""
GPU_GIB = 80.0
"""Device size the plan checks a model against (one H100 80GB)."""


@dataclass(frozen=True)
class Shape:
    """A decoder's dimensions (from its ``config.json``)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    head_dim: int = 0  # 0: hidden // heads

    @property
    def params(self) -> int:
        """Parameters of a Llama/Qwen-style decoder (norms and biases left out: < 0.1%).

        >>> SHAPES["Qwen/Qwen3-4B"].params  # 4.02 B, as the model card
        4022272000
        """
        hd = self.head_dim or self.hidden // self.heads
        attn = self.hidden * hd * (2 * self.heads + 2 * self.kv_heads)
        per_layer = attn + 3 * self.hidden * self.intermediate
        return self.layers * per_layer + self.vocab * self.hidden * (1 if self.tied else 2)


# config.json of each model (num_hidden_layers, hidden_size, intermediate_size, num_attention_heads,
# num_key_value_heads, vocab_size, tie_word_embeddings, head_dim)
SHAPES: dict[str, Shape] = {
    "default": Shape(30, 576, 1536, 9, 3, 49152, True),  # SmolLM2-135M-Instruct
    "Qwen/Qwen3-1.7B": Shape(28, 2048, 6144, 16, 8, 151936, True, 128),
    "Qwen/Qwen3-4B": Shape(36, 2560, 9728, 32, 8, 151936, True, 128),
    "Qwen/Qwen3-8B": Shape(36, 4096, 12288, 32, 8, 151936, False, 128),
    "Qwen/Qwen2.5-0.5B": Shape(24, 896, 4864, 14, 2, 151936, True),
    "Qwen/Qwen2.5-1.5B": Shape(28, 1536, 8960, 12, 2, 151936, True),
    "Qwen/Qwen2.5-3B": Shape(36, 2048, 11008, 16, 2, 151936, True),
    "Qwen/Qwen2.5-7B": Shape(28, 3584, 18944, 28, 4, 152064, False),
    "meta-llama/Llama-3.2-3B": Shape(28, 3072, 8192, 24, 8, 128256, True, 128),
}
for _base in ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-3B", "Qwen/Qwen2.5-7B"):
    SHAPES[_base + "-Instruct"] = SHAPES[_base]
    SHAPES[_base.replace("Qwen2.5-", "Qwen2.5-Coder-")] = SHAPES[_base]
    SHAPES[_base.replace("Qwen2.5-", "Qwen2.5-Coder-") + "-Instruct"] = SHAPES[_base]
SHAPES["meta-llama/Llama-3.2-3B-Instruct"] = SHAPES["meta-llama/Llama-3.2-3B"]
SHAPES["inclusionAI/AReaL-boba-2-8B"] = SHAPES["Qwen/Qwen3-8B"]  # a Qwen3-8B fine-tune


def shape_of(path: str) -> Shape | None:
    """The shape of ``models.<m>.path``: :data:`SHAPES`, else a local folder's ``config.json``, else None."""
    if path in SHAPES:
        return SHAPES[path]
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return None
    c = json.loads(cfg.read_text())
    try:
        return Shape(c["num_hidden_layers"], c["hidden_size"], c["intermediate_size"], c["num_attention_heads"],
                     c.get("num_key_value_heads", c["num_attention_heads"]), c["vocab_size"],
                     bool(c.get("tie_word_embeddings", False)), c.get("head_dim") or 0)
    except KeyError:
        return None


@dataclass(frozen=True)
class ModelPlan:
    """Predicted bytes of one model on each of its devices."""

    name: str
    params: int
    weights: float
    train: float
    activations: float
    kv_cache: float
    devices: int
    offloaded: float = 0.0  # bytes held in CPU memory instead (fsdp offload)
    grads: float = 0.0
    """The part of ``train`` that lives only during an update (gradients, and their per-agent sum)."""
    phases: bool = False
    """The KV cache is freed before the update and the gradients before the rollout (the CPU's engine loops)."""
    copies: float = 0.0
    """The part of ``weights`` that is the engine's (a rollout copy in another dtype, the decode copies)."""
    released: bool = False
    """With ``phases``: the engine's copies are freed while the learner updates (``train.release_memory``)."""

    @property
    def per_device(self) -> float:
        if self.phases:
            kept = self.copies if self.released else 0.0  # freed during the update: counted with the rollout
            return (self.weights - kept + self.train - self.grads
                    + max(self.grads + self.activations, self.kv_cache + kept))
        return self.weights + self.train + self.activations + self.kv_cache


def plan_model(name: str, mc: ModelConfig, shape: Shape, *, tokens: int, logits_chunk: int, context: int,
               ray: bool, on_gpu: bool, bf16_native: bool | None = None, release: bool = True,
               agents: int = 1, agent_norms: bool = True) -> ModelPlan:
    """The :class:`ModelPlan` of model ``name`` (formula: the module docstring).

    Args:
        name, mc: the model's key and config.
        shape: its dimensions.
        tokens: tokens per micro-batch (loss.micro_batch_tokens; 4096 planned for auto).
        logits_chunk: loss.logits_chunk_tokens.
        context: KV-cache tokens per engine row.
        ray: backend ray (dp_workers devices per model).
        on_gpu: plan for a GPU (dtype/rollout_dtype auto resolve as on a bf16 GPU).
        bf16_native: whether the device runs bf16 natively (resolves rollout_dtype and train_autocast auto;
            None: ``on_gpu``).
        release: train.release_memory (on the CPU the engine's copies are freed while the learner updates).
        agents: how many agents train on this model.
        agent_norms: loss.agent_grad_norms (with several agents, a second gradient buffer).

    >>> p = plan_model("m", __import__("teamrl.config.schema", fromlist=["ModelConfig"]).ModelConfig(path="Qwen/Qwen3-4B"),
    ...                SHAPES["Qwen/Qwen3-4B"], tokens=4096, logits_chunk=4096, context=5120, ray=False, on_gpu=True)
    >>> round(p.weights / GIB, 1), round(p.train / GIB, 1), p.devices  # 4.02 B x 4 B + fused copies; x (4 + 8) B
    (23.8, 45.0, 1)
    """
    P = shape.params
    trained = mc.trainable
    lora = mc.lora.rank if trained else 0
    dtype = mc.dtype if mc.dtype != "auto" else ("float32" if trained else ("bfloat16" if on_gpu else "float32"))
    weights = float(P * (4 if dtype == "float32" else 2))
    native = on_gpu if bf16_native is None else bf16_native
    rollout = mc.rollout_dtype if mc.rollout_dtype != "auto" else ("bfloat16" if native else "same")
    copies = 0.0
    if rollout == "bfloat16" and dtype != "bfloat16":
        copies += 2 * P
    if mc.engine == "hf" and not mc.lora.rank:
        copies += decode_copies(shape, packed=not on_gpu) * (2 if "bfloat16" in (rollout, dtype) else 4)
    weights += copies
    T = (2 * lora * shape.hidden * len(mc.lora.targets) * shape.layers) if lora else (P if trained else 0)
    moments = 2 if mc.optim.states == "8bit" else 8
    grad_bytes = 8 if agents > 1 and agent_norms else 4  # a second buffer: the agents' sum beside one agent's own
    train = float((grad_bytes + moments) * T)
    elem = 4 if dtype == "float32" else 2
    per_token = elem * (shape.layers * shape.hidden + 6 * shape.hidden + 3 * shape.intermediate
                        if mc.gradient_checkpointing else shape.layers * (6 * shape.hidden + 3 * shape.intermediate))
    autocast = mc.train_autocast == "bfloat16" or (mc.train_autocast == "auto" and native)
    casts = 2 * P if autocast and dtype == "float32" else 0  # a forward's bf16 weight casts (autocast's cache)
    activations = (tokens * per_token + 12 * shape.vocab * (logits_chunk or tokens) + casts) if trained else 0
    hd = shape.head_dim or shape.hidden // shape.heads
    kv = 2 * shape.layers * shape.kv_heads * hd * 2 * mc.max_batch_size * context
    workers = mc.placement.dp_workers if ray else 1
    offloaded, grads = 0.0, float(grad_bytes * T)
    if ray and mc.placement.sharding == "fsdp":
        weights, train, grads = weights / workers, train / workers, grads / workers
        if mc.placement.offload:
            offloaded, weights, train, grads = weights + train, 0.0, 0.0, 0.0
    return ModelPlan(name, P, weights, train, float(activations), float(kv), workers, offloaded, grads,
                     phases=not on_gpu and mc.engine == "hf", copies=copies,
                     released=release and not ray and trained)


def decode_copies(shape: Shape, *, packed: bool) -> int:
    """Values the hf engine's fast decode loop keeps besides the model's weights (teamrl/engines/decode_weights.py):
    fused q/k/v and gate/up weights per layer, and with ``packed`` (the CPU) every linear and the lm_head once more.

    >>> decode_copies(SHAPES["default"], packed=True) * 2 / 1e9  # SmolLM2-135M in bf16: GB
    0.408305664
    """
    hd = shape.head_dim or shape.hidden // shape.heads
    qkv, o = shape.hidden * hd * (shape.heads + 2 * shape.kv_heads), shape.hidden * hd * shape.heads
    gate_up, down = 2 * shape.hidden * shape.intermediate, shape.hidden * shape.intermediate
    fused = shape.layers * (qkv + gate_up)
    return fused + (shape.layers * (qkv + o + gate_up + down) + shape.vocab * shape.hidden if packed else 0)


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


def plan_config(cfg: Config, *, on_gpu: bool = True, bf16_native: bool | None = None
                ) -> tuple[list[ModelPlan], list[str]]:
    """Plans of every model an agent uses, and the names of those whose shape is unknown."""
    used = sorted({a.model for a in cfg.agents.values()})
    tokens = 4096 if cfg.loss.micro_batch_tokens == "auto" else cfg.loss.micro_batch_tokens
    plans, unknown = [], []
    for name in used:
        mc = cfg.models[name]
        shape = shape_of(mc.path)
        if shape is None:
            unknown.append(name)
            continue
        longest = max((a.max_new_tokens for a in cfg.agents.values() if a.model == name), default=0)
        context = mc.max_context or longest + PROMPT_TOKENS
        agents = sum(a.model == name for a in cfg.agents.values())
        plans.append(plan_model(name, mc, shape, tokens=tokens, logits_chunk=cfg.loss.logits_chunk_tokens,
                                context=context, ray=cfg.backend == "ray", on_gpu=on_gpu, bf16_native=bf16_native,
                                release=cfg.train.release_memory, agents=agents,
                                agent_norms=cfg.loss.agent_grad_norms))
    return plans, unknown


def plans_gpu(cfg: Config) -> bool:
    """Whether the plan is a GPU one: torch sees a GPU, or a model is placed on one (``cuda``, ray ``num_gpus``)."""
    import torch

    return torch.cuda.is_available() or any(
        m.device.startswith("cuda") or m.placement.num_gpus > 0 for m in cfg.models.values())


def format_plan(cfg: Config, *, on_gpu: bool = True, bf16_native: bool | None = None) -> str:
    """The ``memory plan`` lines of ``--dry-run``: one per model, then the devices it needs."""
    plans, unknown = plan_config(cfg, on_gpu=on_gpu, bf16_native=bf16_native)
    lines = []
    for p in plans:
        detail = (f"weights {p.weights / GIB:.1f} + grads/AdamW {p.train / GIB:.1f} + activations "
                  f"{p.activations / GIB:.1f} + kv cache {p.kv_cache / GIB:.1f}")
        if p.offloaded:
            detail += f"; {p.offloaded / GIB:.1f} GiB offloaded to CPU memory"
        fit = ""
        if p.per_device > GPU_GIB * GIB:
            n = fsdp_workers_to_fit(p)
            fit = (f"; over {GPU_GIB:.0f} GiB: placement.sharding fsdp with dp_workers >= {n} fits"
                   if n else f"; over {GPU_GIB:.0f} GiB even sharded: lower loss.micro_batch_tokens or max_batch_size")
        lines.append(f"memory plan: model {p.name} ({p.params / 1e9:.2f} B params): {p.per_device / GIB:.1f} GiB "
                     f"per device x {p.devices} device(s) ({detail}){fit}")
    for name in unknown:
        lines.append(f"memory plan: model {name} ({cfg.models[name].path}): shape unknown (not in teamrl.plan.SHAPES "
                     f"and no local config.json); not planned")
    if on_gpu:
        devices = sum(p.devices for p in plans) + len(unknown)
        peak = max((p.per_device for p in plans), default=0.0)
        lines.append(f"memory plan: {devices} GPU(s) needed, at most {peak / GIB:.1f} GiB on one "
                     f"(GPU precision rules; formula: teamrl/plan.py)")
    else:  # every model in this process's memory
        total = sum(p.per_device for p in plans) + CPU_RUNTIME_GIB * GIB
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        verdict = "fits" if total <= ram else "does NOT fit"
        lines.append(f"memory plan: 1 device (the CPU), {total / GIB:.1f} GiB peak resident memory: all models and "
                     f"{CPU_RUNTIME_GIB} GiB of runtime; this machine has {ram / GIB:.1f} GiB: {verdict} "
                     f"(formula: teamrl/plan.py, docs/memory.md)")
        if total > ram:
            lines.append("memory plan: on a CPU, try --smoke (the embedded model, small sizes) or a smaller model")
        gpu_plans, _ = plan_config(cfg, on_gpu=True)
        lines.append(f"memory plan: on {GPU_GIB:.0f} GiB GPUs it would need {gpus_needed(gpu_plans)}")
    return "\n".join(lines)


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
