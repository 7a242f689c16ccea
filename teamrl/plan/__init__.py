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
    activations = tokens x per_token + scores + 12 B x vocab x min(logits_chunk, tokens)
                  + 2 B x P of bf16 weight casts under autocast
                 tokens    = min(loss.micro_batch_tokens, one agent's share of a step's update: update_tokens
                             x the share of it one optimizer step trains: optimizer_step_share)
                 per_token = layers x layer_bytes                          without checkpointing
                           = elem x layers x hidden + layer_bytes          with checkpointing
                           = elem x k x hidden + (layers - k + 1) x layer_bytes   with k of the layers
                             checkpointed (checkpoint_layers < 1)
                 layer_bytes = 43 hidden + 8 intermediate   fp32 weights under bf16 autocast
                             = 50 hidden + 16 intermediate  fp32 without autocast
                             = 25 hidden + 8 intermediate   bf16 weights
                 scores    = on the CPU, 6 B x min(heads x tokens x row, PLAIN_SCORES) per layer (one layer
                             when checkpointed, layers - k + 1 with k checkpointed): the attention
                             probabilities kept for the backward;
                             row = UPDATE_PROMPT_TOKENS + the longest max_new_tokens
    kv cache   = 2 x layers x kv_heads x head_dim x (2 B | 4 B: the engine's dtype) x max_batch_size x context
                 context = max_context, else the longest max_new_tokens of its agents + PROMPT_TOKENS

On a GPU the engine keeps its KV cache (CUDA graphs, vLLM's pool) while the learner updates, so a
model needs the sum of the four. On the CPU the engine's cache lives only during a rollout and the
gradients only during an update, and with train.release_memory the hf engine's copies (the rollout
copy, the decode copies) only during a rollout too, so a model needs
``weights - copies + moments x T + max(grads x T + activations, kv cache + copies)``. Several models in
one CPU process (:func:`cpu_peak`) hold their resident parts, every KV cache and copy at once in a rollout, and
one model's gradients and activations at a time in an update (the learners update in turn). The process holds
:data:`CPU_RUNTIME_GIB` more (Python, torch, transformers, tokenizers, the task). docs/memory.md
compares the plan with measured peaks.

A KL penalty adds a frozen copy of the weights (the reference policy; LoRA's reference is its base with the
adapters off). Left out: allocator fragmentation, CUDA context (~0.5 GiB per GPU), the engine's temporary
buffers, and a vLLM engine's own memory pool (its ``gpu_memory_utilization``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from teamrl.plan.shapes import SHAPES, Shape, shape_of

if TYPE_CHECKING:
    from teamrl.config.schema import Config, ModelConfig

__all__ = ["SHAPES", "Shape", "shape_of"]  # and the plan's own names below

GIB = 1 << 30
PROMPT_TOKENS = 128
"""Prompt tokens assumed per engine row for the KV cache when a model sets no max_context (the shipped CPU configs'
prompts take 20-210 tokens; the host loops size the cache to the batch's own prompts). A task with long prompts
(retrieved documents, a long history) sets models.<m>.max_context."""
UPDATE_PROMPT_TOKENS = 64
"""Prompt tokens planned per group of an update (the shipped tasks' prompts take 60-200 tokens, and a prefix the
rows of a micro-batch share is computed once)."""
REPLY_SHARE = 0.75
"""Share of the replies' max_new_tokens an update computes: replies end early, and those of a group that open alike
share their first tokens."""
SCORE_BYTES = 6
"""Bytes kept per attention probability on the CPU: fp32 and its bf16 copy."""
PLAIN_SCORES = 1 << 24
"""teamrl.learner.packing.PLAIN_SCORES (the plan imports nothing heavy): probabilities kept per layer at most."""
CPU_RUNTIME_GIB = 0.7
"""Resident memory of a training process before any model loads (Python, torch, transformers, the tokenizer; measured
with the quickstart on Linux, docs/memory.md)."""
GPU_GIB = 80.0
"""Device size the plan checks a model against (one H100 80GB)."""


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
    logits: float = 0.0
    """The part of ``activations`` that is one chunk's logits."""

    @property
    def _kept(self) -> float:
        return self.copies if self.phases and self.released else 0.0  # freed during the update: the rollout's

    @property
    def resident(self) -> float:
        """With ``phases``: what stays between phases (weights but released copies, AdamW's moments)."""
        return self.weights - self._kept + self.train - self.grads

    @property
    def update_peak(self) -> float:
        """With ``phases``: what the update adds (gradients, activations)."""
        return self.grads + self.activations

    @property
    def rollout_peak(self) -> float:
        """With ``phases``: what the rollout adds (KV cache, the released copies)."""
        return self.kv_cache + self._kept

    @property
    def per_device(self) -> float:
        if self.phases:
            return self.resident + max(self.update_peak, self.rollout_peak)
        return self.weights + self.train + self.activations + self.kv_cache


def cpu_peak(plans: list[ModelPlan]) -> float:
    """Bytes of several models in one CPU process, runtime apart: each keeps its resident part; a rollout holds every
    model's KV cache and copies at once, an update one model's gradients and activations at a time (the learners
    update in turn, each freeing its own before the next).

    >>> a = ModelPlan("a", 1, 4 * GIB, 3 * GIB, 2 * GIB, 1 * GIB, 1, grads=1 * GIB, phases=True)
    >>> cpu_peak([a]) / GIB, cpu_peak([a, a]) / GIB  # 6 + max(3, 1); 12 + max(3, 1 + 1)
    (9.0, 15.0)
    """
    if not all(p.phases for p in plans):
        return sum(p.per_device for p in plans)
    return (sum(p.resident for p in plans)
            + max(max((p.update_peak for p in plans), default=0.0), sum(p.rollout_peak for p in plans)))


def plan_model(name: str, mc: ModelConfig, shape: Shape, *, tokens: int, logits_chunk: int, context: int,
               ray: bool, on_gpu: bool, bf16_native: bool | None = None, release: bool = True,
               agents: int = 1, agent_norms: bool = True, row_tokens: int | None = None,
               kl: bool = False, engine: bool = True) -> ModelPlan:
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
            None: ``on_gpu``). On a CPU whose bf16 products are slow training resolves train_autocast to none
            (teamrl.hardware.bf16_fast), so ``--dry-run`` plans the resolved config, where no auto is left.
        release: train.release_memory (on the CPU the engine's copies are freed while the learner updates).
        agents: how many agents train on this model.
        agent_norms: loss.agent_grad_norms (with several agents, a second gradient buffer).
        kl: a KL penalty on this model (a frozen copy of its weights as the reference, LoRA apart).
        engine: whether an engine samples from the model (a distillation teacher no agent uses has none: no decode
            copies and no KV cache).
        row_tokens: keys a trained token attends (a row's length; None: ``context``); on the CPU the attention
            probabilities of small segments are kept for the backward (teamrl.learner.packing.PLAIN_SCORES).

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
    if engine and rollout == "bfloat16" and dtype != "bfloat16":
        copies += 2 * P
    engine_bytes = 2 if "bfloat16" in (rollout, dtype) else 4  # the dtype the engine decodes in, and its KV cache's
    if engine and mc.engine == "hf" and not mc.lora.rank:
        copies += decode_copies(shape, packed=not on_gpu) * engine_bytes
    reference = float(P * (4 if dtype == "float32" else 2)) if kl and trained and not lora else 0.0
    weights += copies + reference
    T = (2 * lora * shape.hidden * len(mc.lora.targets) * shape.layers) if lora else (P if trained else 0)
    moments = 2 if mc.optim.states == "8bit" else 8
    grad_bytes = 8 if agents > 1 and agent_norms else 4  # a second buffer: the agents' sum beside one agent's own
    train = float((grad_bytes + moments) * T)
    elem = 4 if dtype == "float32" else 2
    autocast = mc.train_autocast == "bfloat16" or (mc.train_autocast == "auto" and native)
    layer = layer_bytes(shape.hidden, shape.intermediate, fp32=dtype == "float32", autocast=autocast)
    ckpt = len(checkpointed_layers(shape.layers, mc.checkpoint_layers)) if mc.gradient_checkpointing else 0
    per_token = activation_bytes_per_token(shape.layers, ckpt, hidden=shape.hidden, layer=layer, elem=elem)
    casts = 2 * P if autocast and dtype == "float32" else 0  # a forward's bf16 weight casts (autocast's cache)
    if not on_gpu:  # attention probabilities, fp32 and their bf16 copy, of every layer (one at a time when checkpointed)
        kept = shape.layers - ckpt + (1 if ckpt else 0)
        per_layer = min(shape.heads * tokens * (row_tokens or context), PLAIN_SCORES)
        scores = (SCORE_BYTES if autocast or dtype != "float32" else 4) * per_layer * kept
    else:
        scores = 0
    logits = 12 * shape.vocab * min(logits_chunk or tokens, tokens) if trained else 0
    activations = (tokens * per_token + scores + logits + casts) if trained else 0
    hd = shape.head_dim or shape.hidden // shape.heads
    kv = 2 * shape.layers * shape.kv_heads * hd * engine_bytes * mc.max_batch_size * context if engine else 0
    workers = mc.placement.dp_workers if ray else 1
    offloaded, grads = 0.0, float(grad_bytes * T)
    if ray and mc.placement.sharding == "fsdp":
        weights, train, grads = weights / workers, train / workers, grads / workers
        if mc.placement.offload:
            offloaded, weights, train, grads = weights + train, 0.0, 0.0, 0.0
    return ModelPlan(name, P, weights, train, float(activations), float(kv), workers, offloaded, grads,
                     phases=not on_gpu and mc.engine == "hf", copies=copies,
                     released=release and not ray and trained, logits=float(logits))


def checkpointed_layers(n: int, fraction: float) -> set[int]:
    """Which of ``n`` layers a ``checkpoint_layers`` of ``fraction`` recomputes: round(fraction x n) of them
    (at least one), spread evenly, the first included.

    >>> sorted(checkpointed_layers(6, 0.5)), sorted(checkpointed_layers(30, 1 / 3))[:4], len(checkpointed_layers(30, 0.01))
    ([0, 2, 4], [0, 3, 6, 9], 1)
    """
    k = max(1, min(n, round(fraction * n)))
    return {i * n // k for i in range(k)}


def activation_bytes_per_token(layers: int, checkpointed: int, *, hidden: int, layer: int, elem: int) -> int:
    """Bytes of activations a micro-batch keeps per token for its backward with ``checkpointed`` of ``layers``
    recomputed: a checkpointed layer keeps only its input (``elem`` x ``hidden``), the others all ``layer`` bytes of
    :func:`layer_bytes`, and the layer being recomputed holds its own while its backward runs.

    >>> shape = dict(hidden=576, layer=37056, elem=4)  # SmolLM2-135M, fp32 weights under bf16 autocast
    >>> activation_bytes_per_token(30, 0, **shape), activation_bytes_per_token(30, 30, **shape)
    (1111680, 106176)
    >>> activation_bytes_per_token(30, 15, **shape)  # every other layer: 15 x 2304 + 16 x 37056
    627456
    """
    if not checkpointed:
        return layers * layer
    return elem * checkpointed * hidden + (layers - checkpointed + 1) * layer


def layer_bytes(hidden: int, intermediate: int, *, fp32: bool, autocast: bool) -> int:
    """Bytes one decoder layer keeps per token for its backward, attention probabilities apart: its two RMSNorms'
    inputs and normalised outputs in the weights' dtype, the inputs of its linears (under autocast a bf16 cast of the
    input per linear), q/k/v after RoPE, and the MLP's gate, up, SiLU and product; counted from a Llama layer's
    autograd graph and checked against measured update peaks (docs/memory.md).

    >>> layer_bytes(576, 1536, fp32=True, autocast=True)  # SmolLM2-135M: 43 x 576 + 8 x 1536
    37056
    """
    c_h, c_i = (43, 8) if fp32 and autocast else ((50, 16) if fp32 else (25, 8))
    return c_h * hidden + c_i * intermediate


def decode_copies(shape: Shape, *, packed: bool) -> int:
    """Values the hf engine's fast decode loop keeps besides the model's weights (teamrl/engines/decode_weights.py):
    fused q/k/v and gate/up weights per layer, and with ``packed`` (the CPU) every linear and the lm_head once more.

    >>> decode_copies(SHAPES["default"], packed=True) * 2 / 1e9  # SmolLM2-135M in bf16: GB
    0.408305664
    """
    hd = shape.head_dim or shape.hidden // shape.heads
    qkv, gate_up = shape.hidden * hd * (shape.heads + 2 * shape.kv_heads), 2 * shape.hidden * shape.intermediate
    return shape.layers * (qkv + gate_up) + (step_weights(shape) if packed else 0)


def step_weights(shape: Shape) -> int:
    """Values of the weights a decode step multiplies by: every layer's linears and the lm_head, which the hf engine
    keeps once more on the CPU, packed for its products: oneDNN's in bf16, the C library's panel product in float32
    (teamrl/engines/decode_weights.py; where that library does not build, oneDNN's and one row bucket's MKL copies,
    one copy more than planned).

    >>> step_weights(SHAPES["default"]) * 4 / 1e9  # SmolLM2-135M in float32: GB
    0.537919488
    """
    hd = shape.head_dim or shape.hidden // shape.heads
    qkv, o = shape.hidden * hd * (shape.heads + 2 * shape.kv_heads), shape.hidden * hd * shape.heads
    return shape.layers * (qkv + o + 3 * shape.hidden * shape.intermediate) + shape.vocab * shape.hidden


def plan_config(cfg: Config, *, on_gpu: bool = True, bf16_native: bool | None = None
                ) -> tuple[list[ModelPlan], list[str]]:
    """Plans of every model an agent uses, and the names of those whose shape is unknown."""
    used = sorted({a.model for a in cfg.agents.values()}
                  | {m for m in cfg.algo.distill.models() if cfg.models[m].engine != "openai"})  # weights
    budget = 4096 if cfg.loss.micro_batch_tokens == "auto" else cfg.loss.micro_batch_tokens
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
        step = update_tokens(cfg, name)
        # a micro-batch holds at most one agent's share of one optimizer step's rows
        tokens = min(budget, max(1, math.ceil(step * optimizer_step_share(cfg, name))))
        plans.append(plan_model(name, mc, shape, tokens=tokens, logits_chunk=cfg.loss.logits_chunk_tokens,
                                context=context, ray=cfg.backend == "ray", on_gpu=on_gpu, bf16_native=bf16_native,
                                release=cfg.train.release_memory, agents=agents,
                                agent_norms=cfg.loss.agent_grad_norms,
                                row_tokens=min(context, UPDATE_PROMPT_TOKENS + longest),
                                kl=(mc.kl_coef if mc.kl_coef is not None else cfg.loss.kl_coef) > 0,
                                engine=agents > 0))  # a distillation teacher no agent samples from has no engine
    return plans, unknown


def update_tokens(cfg: Config, model: str) -> int:
    """Tokens of the largest micro-batch content a step's update builds for ``model``, planned: the learner builds its
    micro-batches agent by agent (each agent's gradient apart), so this is the largest of the agents on ``model``.
    Per agent and group: the first call computes its prompt once (:data:`UPDATE_PROMPT_TOKENS`) and
    :data:`REPLY_SHARE` of its ``group_size`` replies' max_new_tokens; every later call of an episode
    (:func:`calls_per_episode`) sees that episode's own state (another agent's reply, the environment after a move),
    so each row brings a prompt of its own and its reply, unless the workflow declares ``calls_share_prompt`` (a tree's
    nodes all open with the problem: a reply each).

    >>> from teamrl.config.schema import load_config
    >>> update_tokens(load_config(None, ["rollout.batch_size=8", "rollout.group_size=8"]), "main")  # 8 x (64 + 0.75 x 8 x 64) + 8 x 1 x 8 x (64 + 0.75 x 64)
    10752
    """
    from teamrl.team.registry import get_workflow

    groups, calls, size = cfg.rollout.batch_size, calls_per_episode(cfg), cfg.rollout.group_size
    later = 0 if get_workflow(cfg.workflow.name).calls_share_prompt else UPDATE_PROMPT_TOKENS
    return max((groups * (UPDATE_PROMPT_TOKENS + int(REPLY_SHARE * size * a.max_new_tokens))
                + groups * (calls - 1) * size * (later + int(REPLY_SHARE * a.max_new_tokens))
                for a in cfg.agents.values() if a.model == model), default=0)


def optimizer_step_share(cfg: Config, model: str) -> float:
    """Share of a step's rows (of the largest agent on ``model``) that one optimizer step trains: 1 /
    ``loss.updates_per_batch``, or ``loss.mini_batch_rows`` of the rows that agent makes per step
    (``batch_size x calls x group_size``, :func:`calls_per_episode`), at most all of them.

    >>> from teamrl.config.schema import load_config
    >>> optimizer_step_share(load_config(None, ["rollout.batch_size=4", "rollout.group_size=8",
    ...                                         "loss.mini_batch_rows=16"]), "main")  # 16 of 4 x 2 calls x 8 rows
    0.25
    """
    if cfg.loss.mini_batch_rows:
        rows = cfg.rollout.batch_size * calls_per_episode(cfg) * cfg.rollout.group_size
        return min(1.0, cfg.loss.mini_batch_rows / max(1, rows))
    return 1.0 / cfg.loss.updates_per_batch


def calls_per_episode(cfg: Config, workflow: str | None = None) -> int:
    """Calls an agent makes per problem at most, as the workflow (``workflow``, else the config's) declares them from
    its options and the task's (``register_workflow(..., calls=...)``); 1 for a workflow that declares none
    (:func:`undeclared_calls`).

    >>> from teamrl.config.schema import load_config
    >>> calls_per_episode(load_config(None, ["workflow.math_team.max_loops=3"]))
    3
    """
    from teamrl.team.registry import get_workflow

    name = workflow or cfg.workflow.name
    spec = get_workflow(name)
    if spec.calls is None:
        return 1
    calls = spec.calls(getattr(cfg.workflow, name, None), getattr(cfg.task, cfg.task.name, None))
    return max(1, int(calls))


def undeclared_calls(cfg: Config) -> str | None:
    """A note where the config's workflow does not declare its calls per problem (the plan then assumes 1)."""
    from teamrl.team.registry import get_workflow

    if get_workflow(cfg.workflow.name).calls is None:
        return (f"workflow {cfg.workflow.name!r} does not declare its calls per problem (register_workflow(..., "
                f"calls=...)): the plan counts one call per agent, and a step's update may be larger")
    return None
