"""The per-model sections of teamrl's configuration (``models.<name>``, with its optimizer, LoRA and Ray
placement) and the top-level ``ray`` section; :mod:`teamrl.config.schema` holds the rest and re-exports these."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from teamrl.engines.registry import EngineName, OpenAIEngineConfig, VLLMEngineConfig

DEVICE_RE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")

def check_device(setting: str) -> str | None:
    """An error message when ``setting`` is not a device name, else None.

    >>> check_device("cuda:1") is None
    True
    >>> check_device("gpu")
    "device 'gpu' is not a device; use auto, cpu, cuda or cuda:N (e.g. cuda:0)"
    """
    if DEVICE_RE.match(setting):
        return None
    return f"device {setting!r} is not a device; use auto, cpu, cuda or cuda:N (e.g. cuda:0)"


@dataclass(kw_only=True)
class OptimConfig:
    lr: float = 1e-5
    """AdamW learning rate."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value before each update (0 disables clipping)."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up over this many training steps (a training step runs one or more optimizer steps: loss.mini_batch_rows, loss.updates_per_batch). 0: none, or warmup_ratio."""
    warmup_ratio: float = 0.0
    """Warm-up as a fraction of train.steps (verl's lr_warmup_steps_ratio, OpenRLHF's lr_warmup_ratio), rounded as schedule_style's original rounds it (verl down, openrlhf up). Only with warmup_steps 0."""
    schedule: Literal["constant", "cosine"] = "constant"
    """Learning rate after warm-up. constant: lr throughout. cosine: from lr down to min_lr_ratio x lr at the end of train.steps."""
    min_lr_ratio: float = 0.0
    """The floor of the cosine as a fraction of lr (verl's min_lr_ratio, OpenRLHF's min_lr / lr)."""
    schedule_steps: int | None = None
    """The schedule's length in training steps (warm-up ratio and cosine are sized in it); null: train.steps. Where an original sizes its schedule in other units, e.g. MARTI's one sample per prompt (a quarter of the optimizer steps it takes); past its end teamrl holds the floor, verl and openrlhf styles go on with the cosine as their originals do."""
    schedule_style: Literal["teamrl", "verl", "openrlhf"] = "teamrl"
    """How the schedule is laid out over training (teamrl/algos/schedule.py). teamrl: one position per training step, warm-up (t + 1) / (W + 1). verl: one position per training step (every optimizer step of a training step at its rate), warm-up linear from min_lr_ratio (cosine) or 0 (constant). openrlhf: one position per optimizer step over the run's optimizer steps (OpenRLHF, MARTI), warm-up linear from 0. Every style is sized in train.steps."""
    states: Literal["float32", "8bit"] = "float32"
    """How AdamW keeps its two moments. float32: torch.optim.AdamW, fused (one kernel per tensor, no temporaries) except for FSDP shards on a CPU, 8 bytes per trained parameter. 8bit: block-wise 8-bit moments (torchao's AdamW8bit; pip install 'teamrl[lowbit]'), 2 bytes per parameter plus one scale per 256 values; tensors under 4096 values keep float32 moments. Checkpoints store the 8-bit codes and scales, and resume exactly."""

    def __post_init__(self) -> None:
        if not self.lr > 0:  # also refuses nan
            raise ValueError(f"lr {self.lr} must be > 0 (e.g. 1e-5)")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas {list(self.betas)} must be two numbers in [0, 1), e.g. [0.9, 0.999]")
        for key in ("weight_decay", "grad_clip", "warmup_steps"):
            if not getattr(self, key) >= 0:
                raise ValueError(f"{key} {getattr(self, key)} must be >= 0")
        if self.schedule_steps is not None and self.schedule_steps < 1:
            raise ValueError(f"schedule_steps {self.schedule_steps} must be >= 1 training steps (or null: train.steps)")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"warmup_ratio {self.warmup_ratio} must be in [0, 1) (a fraction of train.steps, e.g. 0.03)")
        if self.warmup_ratio and self.warmup_steps:
            raise ValueError(f"warmup_steps {self.warmup_steps} and warmup_ratio {self.warmup_ratio} are both set; "
                             f"give the warm-up one way")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio {self.min_lr_ratio} must be in [0, 1] (a fraction of lr, e.g. 0.1)")
        if self.min_lr_ratio and self.schedule != "cosine":
            raise ValueError(f"min_lr_ratio {self.min_lr_ratio} acts only with schedule: cosine (schedule is "
                             f"{self.schedule!r})")


@dataclass(kw_only=True)
class LoraConfig:
    rank: int = 0
    """LoRA rank. 0: train every weight of the model. >0: freeze the base weights and train one LoRA adapter per `agents.<name>.adapter` on this model (needs `pip install teamrl[lora]`)."""
    alpha: float = 16.0
    """LoRA scaling numerator (updates are scaled by alpha / rank)."""
    targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Names of the linear modules that get adapters (e.g. q_proj, v_proj, up_proj, down_proj)."""
    dropout: float = 0.0
    """Dropout on the adapter input during training."""

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ValueError(f"lora.rank {self.rank} must be >= 0 (0 = no adapters, full fine-tuning)")
        if self.rank > 0 and self.alpha <= 0:
            raise ValueError(f"lora.alpha {self.alpha} must be > 0; the usual choice is 2 x rank")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"lora.dropout {self.dropout} must be in [0, 1)")
        if self.rank > 0 and not self.targets:
            raise ValueError("lora.targets is empty; name the linear modules to adapt, e.g. [q_proj, v_proj]")


@dataclass(kw_only=True)
class PlacementConfig:
    num_cpus: float = 1.0
    """CPUs (Ray's logical CPUs) reserved for each actor of this model (backend: ray)."""
    num_gpus: float = 0.0
    """GPUs reserved for each actor of this model (backend: ray); a fraction lets several actors share one GPU."""
    dp_workers: int = 1
    """Data-parallel learner workers (backend: ray): each holds a copy of the weights, trains on its share of the rows, and gradients are summed across workers (torch.distributed: gloo on CPU, NCCL on GPU) before one identical optimizer step on each."""
    sharding: Literal["replicate", "fsdp"] = "replicate"
    """How the dp_workers learner workers hold the trained weights. replicate: each holds every weight, gradient and AdamW moment. fsdp: PyTorch FSDP2 (fully_shard) splits them across the workers, each decoder layer gathered only for its own forward and backward, so a worker holds about 1/dp_workers of the weights and optimizer state; gradients are reduce-scattered as sums and per-agent gradient norms stay exact. Needs colocate: false (the engine keeps whole weights in its own actor, sent to it after every update) and full fine-tuning (lora.rank 0, optim.states float32)."""
    offload: bool = False
    """sharding: fsdp on GPUs: keep each worker's shards (weights, gradients, AdamW state) in CPU memory and run the optimizer step on the CPU (FSDP2's CPUOffloadPolicy); layers are copied to the GPU for their forward and backward. Trades update speed for GPU memory, e.g. to fit a model whose weights and AdamW state do not fit the GPUs."""
    colocate: bool = True
    """true: the engine lives in learner worker 0's actor, on the same devices (hf: the very same module, so weight sync is free). false: the engine is its own actor in its own bundle; weights are sent to it through Ray's object store after every update."""
    resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources each actor of this model needs, e.g. {node_a: 0.01} to pin it to the nodes started with --resources='{"node_a": 1}'."""
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    """Ray placement-group strategy of this model's bundles (one per actor). PACK: as few nodes as possible; STRICT_PACK: one node; SPREAD / STRICT_SPREAD: across nodes."""

    def __post_init__(self) -> None:
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ValueError(f"placement.num_cpus {self.num_cpus} and num_gpus {self.num_gpus} must be >= 0")
        if self.dp_workers < 1:
            raise ValueError(f"placement.dp_workers {self.dp_workers} must be >= 1")
        if any(v <= 0 for v in self.resources.values()):
            raise ValueError(f"placement.resources {self.resources}: every amount must be > 0")


@dataclass(kw_only=True)
class RayConfig:
    address: str | None = None
    """Ray cluster to join: 'auto' (the cluster this machine is part of, started with `ray start`), 'ray://host:10001' (Ray Client), a GCS address host:6379; null starts a local Ray instance on this machine."""
    num_cpus: int | None = None
    """CPUs of the local Ray instance started when address is null (null: all of this machine's)."""
    timeout_s: float = 3600.0
    """Longest wait for one remote call (a rollout batch, an update); past it the run stops with an error naming the actor instead of hanging."""

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"ray.timeout_s {self.timeout_s} must be > 0")
        if self.num_cpus is not None and self.num_cpus < 1:
            raise ValueError(f"num_cpus {self.num_cpus} must be >= 1 (or null for all of this machine's)")


@dataclass(kw_only=True)
class ModelConfig:
    path: str = "default"
    """'default' (the embedded SmolLM2-135M-Instruct), a local Hugging Face model directory, or a hub id."""
    device: str = "auto"
    """Where this model's engine and learner run: auto (the GPU when torch sees one, separate models taking the visible GPUs in turn; else the CPU), cpu, cuda, or cuda:N. With backend: ray only auto (placement.num_gpus decides)."""
    dtype: Literal["auto", "float32", "bfloat16"] = "float32"
    """Dtype of the trained parameters (and of AdamW's state). float32 is the safe choice: bf16 weights lose updates smaller than their precision. auto: float32 for a trained model; bfloat16 for a frozen one (trainable: false) where bf16 is native (see train_autocast)."""
    train_autocast: Literal["auto", "none", "bfloat16"] = "none"
    """Mixed precision for the training forward/backward. bfloat16: matmuls in bf16 under torch.autocast, weights stay in dtype (about 1.9x faster where a CPU's bf16 products are fast; an Intel Xeon with AVX-512 BF16 but AMX hidden ran them at 0.6x float32's). auto: bfloat16 where bf16 is native (CUDA GPUs with bf16; CPUs with AMX or AVX-512 BF16 whose bf16 products, measured once per process, run at least 0.8x float32's speed), none elsewhere; the choice and its reason are logged and written to the run's config.yaml."""
    rollout_dtype: Literal["auto", "same", "float32", "bfloat16"] = "same"
    """Dtype the engine generates in. same: the engine uses the learner's module itself (no copy, no sync). bfloat16: the engine keeps a bf16 copy refreshed after every update (about 1.75x faster decoding on CPU); its log-probs then differ from the learner's, so pair it with loss.old_logprobs=recompute. auto: bfloat16 where bf16 is native (as train_autocast), same elsewhere."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward instead of keeping them (Hugging Face's gradient_checkpointing_enable, non-reentrant; works with LoRA): activation memory of a micro-batch falls from about layers x (6 hidden + 3 intermediate) to about layers x hidden values per token, for one more forward."""
    checkpoint_layers: float = 1.0
    """With gradient_checkpointing: the fraction of decoder layers recomputed in backward, spread evenly (0.5: every other layer). The others keep their activations: less recomputation (about fraction x one forward) for about (1 - fraction) x layers x (6 hidden + 3 intermediate) values per token more activation memory: a middle point in time and memory, measured on the quickstart in docs/memory.md."""
    engine: EngineName = "hf"
    """Generation backend (docs/scale-out.md). hf: in-process batched decoding with its own KV-cache loop. vllm: an in-process vLLM engine (pip install 'teamrl[vllm]'), weights pushed from the learner after every update. openai: any OpenAI-compatible server (models.<name>.openai.base_url); rollout-only, so the model must be trainable: false."""
    trainable: bool = True
    """false: the model is frozen (no learner, no optimizer; its agents' steps are recorded but not trained on). Required for engine: openai; useful for fixed opponents or helpers."""
    max_batch_size: int = 64
    """Most sequences the engine decodes at once."""
    max_context: int | None = None
    """Most tokens a prompt plus its reply may take on this model (prompt tokens + the call's max_new_tokens). null: the model config's max_position_embeddings, else the tokenizer's model_max_length when it is a real number, else no limit. A call over it is refused before it reaches the engine: in a workflow its episode fails with the reason (counted as rollout/context_length_exceeded), at the agent-program endpoint it gets a 400 with code context_length_exceeded."""
    scheduler: Literal["continuous", "lockstep"] = "lockstep"
    """How the rollout feeds this model's engine. lockstep: when every episode waits, all pending calls go to the engine as one batch, decoded to completion. continuous (engine: hf only): a call that finishes returns at once and its episode's next call joins the running decode batch at the next step. Both are reproducible (same seed, same run). Measured on 32 math-team episodes with natural reply lengths: continuous reached 0.89x lockstep's tokens/s (each joining call is prefilled in a small batch), so lockstep is the default (docs/results/speed.md)."""
    share_prefix: int | Literal["auto"] = "auto"
    """engine: hf. Prefill a token prefix of at least this many tokens, common to several prompts admitted together (the system prompt and problem in a group's verifier prompts), once for all of them, and keep the prefixes it prefilled (up to 4,096 tokens, until the weights change) so that later calls starting with one copy it instead of running it again (0: off; identical prompts are always prefilled once). auto: 16 where the fast decode loop runs (engine: hf without LoRA, an architecture it supports), off elsewhere. Measured on the quickstart's evaluation (benchmarks/eval_prefill.py, docs/results/speed.md): prefill 1.59x faster in float32 with AVX2 emulated (the whole evaluation 1.31x); with bf16 and AMX 1.12x (1.04x) before the kept prefixes, which added 1.14x on the prefill there."""
    cpu_attention: Literal["kernel", "torch"] = "kernel"
    """engine: hf, on CPU. Attention of the fast loop's decode steps, and the work between its products. kernel: teamrl's C kernels (teamrl/engines/cpu/csrc/decode_attention.c, built on first use; the attention about 1.6x faster per call at 8-64 rows; with a Llama-style model with SiLU MLPs, decode steps run rotation + cache write + attention, residual add + RMSNorm and silu(gate) * up as three calls per layer, and prefills the last two: 1.07-1.13x on the float32 rollout with AVX2 emulated, 1.19-1.26x in bf16 with AMX, docs/results/speed.md; in float32 on x86-64 with AVX2 and FMA also a panel product for the decode steps' linears, their one packed copy of the weights: 1.09-1.13x on the float32 rollout), torch's operations where it cannot build (no compiler, not Linux, another architecture; logged). torch: always torch's. Results agree to the rounding of the output, not bit for bit."""
    cuda_graphs: bool = True
    """engine: hf, on a CUDA GPU. true: each decode step of the fast loop (the forward of the running rows and their sampling, on the GPU) is captured once per batch-size and length bucket as a CUDA graph and replayed, so a step costs no per-kernel launches from Python (docs/results/gpu.md); the graphs and the KV cache (max_batch_size rows) stay allocated between rollouts, outside the memory that loss.micro_batch_tokens: auto plans for. false: the same steps launched kernel by kernel, and the cache is freed after each rollout."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer of this model's parameters (with LoRA: of each adapter, unless its agent overrides lr or weight_decay)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters on a frozen base (rank 0: full fine-tuning)."""
    openai: OpenAIEngineConfig = field(default_factory=OpenAIEngineConfig)
    """The server of engine: openai."""
    vllm: VLLMEngineConfig = field(default_factory=VLLMEngineConfig)
    """Options of engine: vllm."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """Where this model's engine and learner run with backend: ray (set with backend: local, it is an error)."""
    kl_coef: float | None = None
    """KL penalty weight for the agents on this model; null takes loss.kl_coef."""
    clip_low: float | None = None
    """PPO ratio clip below 1 for this model; null takes loss.clip_low."""
    clip_high: float | None = None
    """PPO ratio clip above 1 for this model; null takes loss.clip_high."""
    rollout_correction: Literal["none", "token-tis", "token-mis", "seq-tis", "seq-mis"] | None = None
    """Rollout correction of this model's updates; null takes loss.rollout_correction (e.g. correct only the model whose engine is a bf16 copy or a vLLM server)."""

    def __post_init__(self) -> None:
        if check_device(self.device):
            raise ValueError(check_device(self.device))
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size {self.max_batch_size} must be >= 1")
        if isinstance(self.checkpoint_layers, bool) or not 0 < self.checkpoint_layers <= 1:
            raise ValueError(f"checkpoint_layers {self.checkpoint_layers} must be in (0, 1]: the fraction of decoder "
                             f"layers recomputed (1: every layer)")
        if self.checkpoint_layers < 1 and not self.gradient_checkpointing:
            raise ValueError(f"checkpoint_layers {self.checkpoint_layers} needs gradient_checkpointing: true")
        if self.max_context is not None and (isinstance(self.max_context, bool) or self.max_context < 2):
            raise ValueError(f"max_context {self.max_context} must be >= 2 tokens (or null: the model's own limit)")
        if self.share_prefix != "auto" and (isinstance(self.share_prefix, bool) or self.share_prefix < 0):
            raise ValueError(f"share_prefix {self.share_prefix} must be >= 0 (0 = off) or auto")
        for key in ("kl_coef", "clip_low", "clip_high"):
            value = getattr(self, key)
            if value is not None and value < 0:
                raise ValueError(f"{key} {value} must be >= 0 (or null to take loss.{key})")


def sharding_errors(name: str, mc: ModelConfig) -> list[str]:
    """What ``placement.sharding: fsdp`` and ``placement.offload`` cannot be combined with."""
    pl, key = mc.placement, f"models.{name}.placement"
    if pl.sharding != "fsdp":
        return [f"{key}.offload: true offloads the shards of sharding: fsdp; set sharding: fsdp or offload: false"] \
            if pl.offload else []
    errors = []
    if not mc.trainable:
        errors.append(f"{key}.sharding: fsdp shards a learner, and a frozen model (trainable: false) has none; "
                      f"set sharding: replicate")
    if pl.colocate:
        errors.append(f"{key}.sharding: fsdp leaves no worker with whole weights for a colocated engine; "
                      f"set {key}.colocate: false (the engine gets its own actor)")
    if mc.lora.rank > 0:
        errors.append(f"{key}.sharding: fsdp is for full fine-tuning; with LoRA (lora.rank {mc.lora.rank}) the "
                      f"trained adapters are small: set sharding: replicate")
    if mc.optim.states != "float32":
        errors.append(f"{key}.sharding: fsdp keeps float32 AdamW moments (optim.states {mc.optim.states!r}); "
                      f"set optim.states: float32 (offload: true moves them off the GPU instead)")
    if pl.offload and pl.num_gpus == 0:
        errors.append(f"{key}.offload: the workers run on the CPU (num_gpus 0), so there is nothing to offload; "
                      f"set offload: false or num_gpus > 0")
    return errors
