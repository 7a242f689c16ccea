"""teamrl's configuration: one typed, documented, closed schema.

A run is configured by a YAML file plus ``key=value`` overrides (dotted keys). Every field is
documented below (``teamrl train --help-config`` prints them all); unknown keys are errors with
a suggestion, and all errors are reported together (see :mod:`teamrl.configtools`).

Plug-ins bring their own options: ``task.<name>`` and ``workflow.<name>`` are validated against
the config class each task and workflow registered (built-in ones and those of an ``--import``
file alike), and ``models.<m>.engine`` is interpreted by :mod:`teamrl.engines.registry`, which
also holds the engines' options and rules. Rules across sections (agents mapped to existing
models, the workflow's agents all present, a known advantage estimator) are checked in
:meth:`Config.__post_init__`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from teamrl import configtools
from teamrl.algos.advantages import get_estimator
from teamrl.engines.base import SamplingParams
from teamrl.engines.registry import EngineName, OpenAIEngineConfig, VLLMEngineConfig, engine_errors
from teamrl.hardware import check_device
from teamrl.suggest import did_you_mean
from teamrl.tasks.base import task_configs
from teamrl.team.registry import WORKFLOWS, workflow_configs


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
    """Linear learning-rate warm-up over this many updates."""
    schedule: Literal["constant", "cosine"] = "constant"
    """Learning rate after warm-up. constant: lr throughout. cosine: decays to 0 at the last step."""
    states: Literal["float32", "8bit"] = "float32"
    """How AdamW keeps its two moments. float32: torch.optim.AdamW (fused on CUDA), 8 bytes per trained parameter. 8bit: block-wise 8-bit moments (torchao's AdamW8bit; pip install 'teamrl[lowbit]'), 2 bytes per parameter plus one scale per 256 values; tensors under 4096 values keep float32 moments. Checkpoints store the 8-bit codes and scales, and resume exactly."""


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


@dataclass(kw_only=True)
class ModelConfig:
    path: str = "default"
    """'default' (the embedded SmolLM2-135M-Instruct), a local Hugging Face model directory, or a hub id."""
    device: str = "auto"
    """Where this model's engine and learner run: auto (the GPU when torch sees one, separate models taking the visible GPUs in turn; else the CPU), cpu, cuda, or cuda:N. With backend: ray only auto (placement.num_gpus decides)."""
    dtype: Literal["auto", "float32", "bfloat16"] = "float32"
    """Dtype of the trained parameters (and of AdamW's state). float32 is the safe choice: bf16 weights lose updates smaller than their precision. auto: float32 for a trained model; bfloat16 for a frozen one (trainable: false) where bf16 is native (see train_autocast)."""
    train_autocast: Literal["auto", "none", "bfloat16"] = "none"
    """Mixed precision for the training forward/backward. bfloat16: matmuls in bf16 under torch.autocast, weights stay in dtype (about 1.9x faster on CPUs with AVX-512 bf16). auto: bfloat16 where bf16 is native (CUDA GPUs with bf16; CPUs with AMX or AVX-512 BF16), none elsewhere; the choice and its reason are logged and written to the run's config.yaml."""
    rollout_dtype: Literal["auto", "same", "float32", "bfloat16"] = "same"
    """Dtype the engine generates in. same: the engine uses the learner's module itself (no copy, no sync). bfloat16: the engine keeps a bf16 copy refreshed after every update (about 1.75x faster decoding on CPU); its log-probs then differ from the learner's, so pair it with loss.old_logprobs=recompute. auto: bfloat16 where bf16 is native (as train_autocast), same elsewhere."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward instead of keeping them (Hugging Face's gradient_checkpointing_enable, non-reentrant; works with LoRA): activation memory of a micro-batch falls from about layers x (6 hidden + 3 intermediate) to about layers x hidden values per token, for one more forward."""
    engine: EngineName = "hf"
    """Generation backend (docs/scale-out.md). hf: in-process batched decoding with its own KV-cache loop. vllm: an in-process vLLM engine (pip install 'teamrl[vllm]'), weights pushed from the learner after every update. openai: any OpenAI-compatible server (models.<name>.openai.base_url); rollout-only, so the model must be trainable: false."""
    trainable: bool = True
    """false: the model is frozen (no learner, no optimizer; its agents' steps are recorded but not trained on). Required for engine: openai; useful for fixed opponents or helpers."""
    max_batch_size: int = 64
    """Most sequences the engine decodes at once."""
    scheduler: Literal["continuous", "lockstep"] = "lockstep"
    """How the rollout feeds this model's engine. lockstep: when every episode waits, all pending calls go to the engine as one batch, decoded to completion. continuous (engine: hf only): a call that finishes returns at once and its episode's next call joins the running decode batch at the next step. Both are reproducible (same seed, same run). Measured on 32 math-team episodes with natural reply lengths: continuous reached 0.89x lockstep's tokens/s (each joining call is prefilled in a small batch), so lockstep is the default (docs/results/speed.md)."""
    share_prefix: int = 0
    """engine: hf. Prefill a token prefix of at least this many tokens, common to several prompts admitted together (the system prompt and problem in a group's verifier prompts), once for all of them (0: off; identical prompts are always prefilled once). Measured: prefill 1.16x faster for 32 prompts of ~133 tokens sharing ~66 (docs/results/speed.md)."""
    cpu_attention: Literal["kernel", "torch"] = "kernel"
    """engine: hf, on CPU. Attention of the fast loop's decode steps. kernel: teamrl's C kernel (teamrl/engines/csrc/decode_attention.c, built on first use; about 1.6x faster per call at 8-64 rows), torch's scaled_dot_product_attention where it cannot build (no compiler, not Linux, another architecture; logged). torch: always torch's. Results agree to the rounding of the output, not bit for bit."""
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

    def __post_init__(self) -> None:
        if check_device(self.device):
            raise ValueError(check_device(self.device))
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size {self.max_batch_size} must be >= 1")
        if self.share_prefix < 0:
            raise ValueError(f"share_prefix {self.share_prefix} must be >= 0 (0 = off)")
        for key in ("kl_coef", "clip_low", "clip_high"):
            value = getattr(self, key)
            if value is not None and value < 0:
                raise ValueError(f"{key} {value} must be >= 0 (or null to take loss.{key})")


@dataclass(kw_only=True)
class AgentConfig:
    model: str = "main"
    """Name of the entry in `models` that plays this agent. Agents naming the same model share its weights and its generation batches."""
    adapter: str | None = None
    """Name of this agent's LoRA adapter on its model (needs models.<model>.lora.rank > 0). Agents naming the same adapter share it; each adapter has its own optimizer group."""
    loss_weight: float = 1.0
    """Multiplies this agent's per-token loss (the only per-agent training knob on fully shared weights)."""
    lr: float | None = None
    """Learning rate of the weights only this agent trains (its own model or its own adapter); null takes the model's optim.lr."""
    weight_decay: float | None = None
    """AdamW weight decay of the weights only this agent trains; null takes the model's optim.weight_decay."""
    temperature: float = 1.0
    """Sampling temperature for this agent's calls (0 = greedy)."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1 = off)."""
    top_k: int = 0
    """Top-k sampling (0 = off)."""
    max_new_tokens: int = 64
    """Most tokens per reply; longer replies are cut (finish_reason 'length')."""
    system_prompt: str | None = None
    """Replaces the registered agent's system prompt."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keywords of the model's chat template for this agent's prompts, e.g. {enable_thinking: false} (Qwen3)."""
    tool_format: Literal["auto", "hermes", "mistral", "llama3"] = "auto"
    """How tool calls are read from this agent's replies when tools are offered. hermes: <tool_call>{json}</tool_call> (SmolLM2, Qwen2.5, Qwen3). mistral: [TOOL_CALLS] [...]. llama3: a bare {"name", "parameters"} object. auto: from the chat template (hermes when it names none)."""

    def __post_init__(self) -> None:
        if self.loss_weight < 0:
            raise ValueError(f"loss_weight {self.loss_weight} must be >= 0")
        self.sampling()  # the engines' own rules for temperature, top_p, top_k and max_new_tokens
        if self.lr is not None and self.lr <= 0:
            raise ValueError(f"lr {self.lr} must be > 0 (or null to take the model's optim.lr)")
        if self.weight_decay is not None and self.weight_decay < 0:
            raise ValueError(f"weight_decay {self.weight_decay} must be >= 0")

    def sampling(self, temperature: float | None = None) -> SamplingParams:
        """How this agent's calls are sampled (``temperature`` replaces its own, e.g. eval.temperature)."""
        return SamplingParams(temperature=self.temperature if temperature is None else temperature,
                              top_p=self.top_p, top_k=self.top_k, max_new_tokens=self.max_new_tokens)


@dataclass(kw_only=True)
class TaskConfig(configtools.Sections):
    name: str = "arith"
    """Registered task. arith: synthetic arithmetic (seeded). math: GSM8K/MATH-style data from a path or a Hugging Face dataset id. search: open-domain QA answered with a search engine. Tasks registered in an --import file work too. Each task's options are task.<name>, checked against the config class it registered (task.options is another spelling of the selected task's)."""

    kind: ClassVar[str] = "task"
    alias: ClassVar[str | None] = "options"

    @classmethod
    def section_types(cls) -> dict[str, type | None]:
        return task_configs()


@dataclass(kw_only=True)
class WorkflowConfig(configtools.Sections):
    name: str = "math_team"
    """Registered workflow that runs each episode: math_team (solver + verifier, Dr. MAS), search_team (router + searcher + answerer, Dr. MAS), math_tree (agents expand a search tree, MARS2; docs/credit.md), agent_program (an existing program written against the OpenAI API, trained unchanged; docs/agent-programs.md) or single (one agent). Each workflow's options are workflow.<name>, checked against the config class it registered (workflow.options is another spelling of the selected workflow's)."""

    kind: ClassVar[str] = "workflow"
    alias: ClassVar[str | None] = "options"

    @classmethod
    def section_types(cls) -> dict[str, type | None]:
        return workflow_configs()


@dataclass(kw_only=True)
class ShapleyConfig:
    counterfactual: Literal["workflow", "rerun"] = "workflow"
    """How a coalition's value is obtained (docs/credit.md). workflow: the workflow's own counterfactual (math_team: read off the recorded episode, no generation). rerun: run the workflow again with the agents outside the coalition replaced by their neutral reply; the others generate anew (extra generation, counted in credit/extra_generations)."""
    exact_max_agents: int = 6
    """Exact Shapley values (all 2^n coalitions) for episodes with at most this many agents; above it, permutation sampling."""
    samples: int = 64
    """Random orderings of the agents for permutation sampling (teams larger than exact_max_agents)."""
    seed: int = 0
    """Seed of the sampled orderings (combined with the training step and the episode index)."""
    global_weight: float = 1.0
    """Weight of the team's reward in each agent's credited reward: global_weight * R + credit_weight * phi_agent (SHARP)."""
    credit_weight: float = 1.0
    """Weight of the agent's Shapley value phi_agent in its credited reward."""

    def __post_init__(self) -> None:
        if self.exact_max_agents < 1:
            raise ValueError(f"shapley.exact_max_agents {self.exact_max_agents} must be >= 1")
        if self.exact_max_agents > 12:
            raise ValueError(f"shapley.exact_max_agents {self.exact_max_agents} means up to 2^{self.exact_max_agents} "
                             f"coalitions per episode; use at most 12 and permutation sampling above it")
        if self.samples < 1:
            raise ValueError(f"shapley.samples {self.samples} must be >= 1")


@dataclass(kw_only=True)
class AlgoConfig:
    estimator: str = "drmas"
    """Advantage estimator preset (docs/advantages.md): grpo, grpo_step, agent_episode, drmas, at_grpo, magrpo, rloo, dr_grpo, reinforce_pp, tree."""
    format_penalty: float = 0.0
    """Subtracted from the reward of every step whose reply broke its agent's format (invalid answer or verdict)."""
    eps: float = 1e-6
    """Added to the standard deviation before dividing."""
    credit: Literal["none", "shapley"] = "none"
    """Credit assignment before normalization (docs/credit.md). none: the workflow's rewards. shapley: each agent's reward is global_weight * R + credit_weight * its Shapley value over counterfactual coalitions (SHARP, arXiv 2602.08335)."""
    shapley: ShapleyConfig = field(default_factory=ShapleyConfig)
    """Options of credit: shapley."""
    overlong_buffer: int = 0
    """DAPO's soft overlong penalty (arXiv 2503.14476): a reply within this many tokens of its agent's max_new_tokens loses up to overlong_penalty, linearly; 0 turns it off."""
    overlong_penalty: float = 1.0
    """Largest overlong penalty (a reply at its token limit)."""


@dataclass(kw_only=True)
class LossConfig:
    clip_low: float = 0.2
    """PPO ratio clip below 1 (ratio >= 1 - clip_low)."""
    clip_high: float = 0.2
    """PPO ratio clip above 1 (ratio <= 1 + clip_high); a larger value is DAPO's clip-higher."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 bounding the loss of negative-advantage tokens (arXiv 1912.09729); null disables it."""
    level: Literal["token", "sequence"] = "token"
    """Importance ratio per token (PPO/GRPO) or per sequence (GSPO, arXiv 2507.18071)."""
    agg: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = "token-mean"
    """How per-token losses become one number: mean over all tokens; mean over sequences of token sums; mean over sequences of token means."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the frozen initial model (0: no reference model is kept)."""
    kl_kind: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator: k1 log-ratio, k2 half squared log-ratio, k3 Schulman's unbiased non-negative estimator."""
    entropy_coef: float = 0.0
    """Entropy bonus weight (subtracted from the loss)."""
    micro_batch_tokens: int | Literal["auto"] = 4096
    """Token budget of one forward/backward micro-batch (rows x longest row); gradients accumulate across micro-batches. auto: chosen per model from the memory free on its device when its learner is built (docs/architecture.md has the formula; the choice is logged)."""
    logits_chunk_tokens: int = 4096
    """The LM head and log-softmax run on at most this many response tokens at a time (recomputed in backward), so the [tokens x vocabulary] logits of a micro-batch never exist at once (0: all at once). Values equal the unchunked ones (to 1e-6 in fp32)."""
    old_logprobs: Literal["engine", "recompute"] = "engine"
    """Log-probs the PPO ratio divides by. engine: the sampling log-probs recorded at generation (exact when the engine shares the learner's module). recompute: the learner's own log-probs before its first update (with updates_per_batch=1 this is the current policy detached, so the ratio is exactly 1; with more, one extra no-grad pass). Use recompute when the engine runs in another dtype."""
    updates_per_batch: int = 1
    """Optimizer steps per rollout batch (the batch is split into this many mini-batches); >1 makes later mini-batches off-policy, which the PPO clip bounds."""


@dataclass(kw_only=True)
class RolloutConfig:
    batch_size: int = 8
    """Problems per training step."""
    group_size: int = 8
    """Episodes per problem; advantages compare steps within a problem's episodes."""


@dataclass(kw_only=True)
class TrainConfig:
    steps: int = 20
    """Training steps (one rollout batch and its updates each)."""
    seed: int = 0
    """Seed of data order, sampling and initialisation."""
    save_every: int = 10
    """Checkpoint every this many steps (and at the end); 0 = only at the end."""
    transcripts_per_step: int = 2
    """Episodes per step written to episodes.jsonl."""
    threads: int = 0
    """torch CPU threads (0 = torch's default)."""
    spike_factor: float = 3.0
    """A step's gradient norm (per agent, per model) above this multiple of its running median counts as a spike (metrics `.../grad_spike`, `.../grad_spikes`; totals in summary.json)."""
    spike_window: int = 20
    """Previous steps whose gradient norms form the running median of the spike rule."""
    update_mode: Literal["sync", "async"] = "sync"
    """sync: every learner updates after every rollout. async: each learner (one per model) updates only when its buffer holds train.min_buffer_steps steps, without waiting for the others (MARS2; docs/credit.md states the off-policy bound). Needs loss.old_logprobs=engine."""
    min_buffer_steps: int = 1
    """async: steps a model's buffer must hold before its learner updates."""
    max_update_steps: int = 0
    """async: most buffered steps one update trains on, oldest first (0: the whole buffer); the rest wait for a later update and become off-policy."""
    max_policy_lag: int = 1
    """async: a buffered step is dropped once its model has updated more than this many times since generating it."""
    loggers: list[Literal["tensorboard", "wandb", "mlflow"]] = field(default_factory=lambda: ["tensorboard"])
    """Experiment trackers (several at once; metrics.jsonl is always written). Each gets every step's metrics under the metrics.jsonl names (agent/<name>/... are the per-agent curves), the resolved config, episode tables and the held-out scores. tensorboard: <run_dir>/tensorboard. wandb: Weights & Biases (pip install 'teamrl[wandb]'; WANDB_MODE=offline writes <run_dir>/wandb without an account). mlflow: MLflow (pip install 'teamrl[mlflow]'), to MLFLOW_TRACKING_URI when set, else a local file store <run_dir>/mlruns. []: metrics.jsonl only."""
    log_samples_every: int = 10
    """Every this many steps (counting from step 0) the trackers get a table of the step's sampled episodes (the train.transcripts_per_step of episodes.jsonl), one row per turn: agent, text, reward, advantage. 0 = never."""
    tracker_project: str = "teamrl"
    """W&B project and MLflow experiment the run is logged in; the tracker's run is named after run_dir's last folder."""


@dataclass(kw_only=True)
class EvalConfig:
    problems: int = 200
    """Held-out problems evaluated (0 = the whole test split)."""
    samples: int = 4
    """Episodes per held-out problem (n); accuracy is the mean over all of them (avg@n), and pass@1..n use the unbiased estimator 1 - C(n-c, k)/C(n, k)."""
    temperature: float | None = None
    """Sampling temperature of every agent during evaluation; null keeps each agent's own."""
    before: bool = True
    """Evaluate the untrained team before training."""
    after: bool = True
    """Evaluate the trained team after training."""
    workflow: str | None = None
    """Workflow of the evaluation episodes (its options from workflow.<name>); null: the training workflow. E.g. evaluate a math_tree run (whose answer is the best of several feedback-guided attempts) with math_team or single."""
    every: int = 0
    """Evaluate on the held-out problems every this many training steps too (0 = off): after k updates (k = N, 2N, ...) the scores go to eval_step<k>.json and, as eval/<score> (eval/accuracy, eval/pass@n, ...), to the metrics row of step k, so held-out curves can be drawn; eval.before and eval.after are then logged as eval/<score> at step 0 and at train.steps. These evaluations leave the engines' sampling generators as they found them: training samples the same episodes with or without them."""


@dataclass(kw_only=True)
class Config:
    run_dir: str = "runs/quickstart"
    """Where the run writes config, metrics, transcripts, TensorBoard events and checkpoints."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """The problems and their reward."""
    workflow: WorkflowConfig = field(default_factory=WorkflowConfig)
    """How the team works on one problem."""
    models: dict[str, ModelConfig] = field(default_factory=lambda: {"main": ModelConfig()})
    """Physical models by name."""
    agents: dict[str, AgentConfig] = field(default_factory=lambda: {"solver": AgentConfig(), "verifier": AgentConfig()})
    """Agents by name, each mapped to a model."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Credit assignment and advantage estimation."""
    loss: LossConfig = field(default_factory=LossConfig)
    """Policy loss."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Episodes per step."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Training loop."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation before, during (eval.every) and after training."""
    backend: Literal["local", "ray"] = "local"
    """Where models run. local: everything in this process (the embedded default). ray: each model's engine and learner are Ray actors placed by models.<name>.placement (docs/scale-out.md; pip install ray)."""
    ray: RayConfig = field(default_factory=RayConfig)
    """The Ray cluster of backend: ray."""

    def __post_init__(self) -> None:
        errors = []
        for name, a in self.agents.items():
            if a.model not in self.models:
                errors.append(f"agents.{name}.model: {a.model!r} is not in models ({', '.join(self.models)}); add it under models or pick one of those")
        errors += assignment_errors(self.models, self.agents)
        for name, mc in self.models.items():
            errors += engine_errors(name, mc)
        errors += backend_errors(self)
        errors += workflow_errors(self, self.workflow.name, "workflow.name")
        if self.workflow.name in WORKFLOWS and self.workflow.selected is not None:
            errors += credit_errors(self.algo, self.workflow.name, self.workflow.selected)
        errors += schedule_errors(self)
        if self.eval.workflow is not None:
            errors += workflow_errors(self, self.eval.workflow, "eval.workflow")
        errors += selected_errors(self.task, "task.name")
        try:
            get_estimator(self.algo.estimator)
        except ValueError as exc:  # its message (with a did-you-mean), as at every estimator lookup
            errors.append(f"algo.estimator: {exc}")
        for key in ("batch_size", "group_size"):
            if getattr(self.rollout, key) < 1:
                errors.append(f"rollout.{key} must be >= 1, got {getattr(self.rollout, key)}")
        if self.eval.samples < 1:
            errors.append(f"eval.samples {self.eval.samples} must be >= 1")
        if self.eval.every < 0:
            errors.append(f"eval.every {self.eval.every} must be >= 0 (0 = off; N evaluates every N training steps)")
        elif self.eval.every > self.train.steps:
            errors.append(f"eval.every {self.eval.every} is more than train.steps {self.train.steps}, so no evaluation "
                          f"would run along the way; lower eval.every or set it to 0")
        if self.loss.updates_per_batch < 1:
            errors.append(f"loss.updates_per_batch {self.loss.updates_per_batch} must be >= 1")
        if self.train.spike_factor <= 1:
            errors.append(f"train.spike_factor {self.train.spike_factor} must be > 1 (a spike is a gradient norm above "
                          f"this multiple of the running median); the usual value is 3")
        if self.train.spike_window < 1:
            errors.append(f"train.spike_window {self.train.spike_window} must be >= 1 step; the usual value is 20")
        if len(set(self.train.loggers)) != len(self.train.loggers) or self.train.log_samples_every < 0:
            errors.append(f"train.loggers {self.train.loggers} must name each tracker once and "
                          f"train.log_samples_every {self.train.log_samples_every} must be >= 0")
        if self.loss.logits_chunk_tokens < 0:
            errors.append(f"loss.logits_chunk_tokens {self.loss.logits_chunk_tokens} must be >= 0 (0: all at once)")
        if self.loss.micro_batch_tokens != "auto" and self.loss.micro_batch_tokens < 1:
            errors.append(f"loss.micro_batch_tokens {self.loss.micro_batch_tokens} must be >= 1")
        if errors:
            raise configtools.ConfigError(errors)


def assignment_errors(models: dict[str, ModelConfig], agents: dict[str, AgentConfig]) -> list[str]:
    """Agent settings that the agent→model assignment cannot honour, each with what to do instead."""
    errors = []
    for name, a in agents.items():
        if a.model not in models:
            continue
        rank = models[a.model].lora.rank
        if a.adapter is not None and rank == 0:
            errors.append(f"agents.{name}.adapter: {a.adapter!r} needs LoRA on model {a.model!r}, whose lora.rank is 0; "
                          f"set models.{a.model}.lora.rank (e.g. 8) or remove agents.{name}.adapter")
        if a.adapter is None and rank > 0:
            errors.append(f"agents.{name}.adapter: model {a.model!r} trains LoRA adapters (lora.rank={rank}) on frozen "
                          f"base weights, so agent {name!r} needs one; set agents.{name}.adapter (e.g. {name})")
        for key in ("lr", "weight_decay"):
            if getattr(a, key) is not None and not models[a.model].trainable:
                errors.append(f"agents.{name}.{key}: model {a.model!r} is frozen (trainable: false), so nothing "
                              f"of agent {name!r} is trained; remove agents.{name}.{key}")
        sharers = sorted(n for n, b in agents.items() if n != name and (b.model, b.adapter) == (a.model, a.adapter))
        for key in ("lr", "weight_decay"):
            if getattr(a, key) is None or not sharers:
                continue
            what = f"adapter {a.adapter!r} of model {a.model!r}" if a.adapter else f"every weight of model {a.model!r}"
            errors.append(f"agents.{name}.{key}: {getattr(a, key)} cannot apply, agent {name!r} shares {what} with "
                          f"{', '.join(sharers)}; give {name!r} its own model (agents.{name}.model) or its own LoRA "
                          f"adapter (models.{a.model}.lora.rank: 8, agents.{name}.adapter: {name}), "
                          f"or set models.{a.model}.optim.{key} for all of them")
    return errors


def backend_errors(cfg: Config) -> list[str]:
    """Settings that the backend (local or ray) cannot honour, each with what to do instead."""
    errors = []
    for name, mc in cfg.models.items():
        if cfg.backend == "ray" and mc.device != "auto":
            errors.append(f"models.{name}.device: {mc.device!r}; with backend: ray the device follows "
                          f"models.{name}.placement.num_gpus (a GPU when it is > 0): set device: auto")
        if mc.placement.dp_workers > 1 and cfg.backend != "ray":
            errors.append(f"models.{name}.placement.dp_workers: {mc.placement.dp_workers} workers need backend: ray "
                          f"(backend is {cfg.backend!r}); set backend: ray or dp_workers: 1")
        elif mc.placement != PlacementConfig() and cfg.backend != "ray":
            errors.append(f"models.{name}.placement places Ray actors and needs backend: ray (backend is "
                          f"{cfg.backend!r}); set backend: ray or remove models.{name}.placement")
        if mc.placement.dp_workers > 1 and not mc.trainable:
            errors.append(f"models.{name}.placement.dp_workers: a frozen model (trainable: false) has no learner; "
                          f"set dp_workers: 1")
        errors += _sharding_errors(name, mc)
    if cfg.backend == "local" and cfg.ray != RayConfig():
        errors.append("ray: settings of the Ray cluster need backend: ray; set backend: ray or remove the ray section")
    return errors


def _sharding_errors(name: str, mc: ModelConfig) -> list[str]:
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


def selected_errors(cfg: configtools.Sections, key: str, name: str | None = None) -> list[str]:
    """Problems of the plug-in ``name`` (default: the selected one) at ``key``: not registered, or its options
    need settings that are not given."""
    name = cfg.name if name is None else name
    registered = cfg.section_types()
    if name not in registered:
        return [f"{key}: unknown {cfg.kind} {name!r}{did_you_mean(name, registered)} "
                f"(registered: {', '.join(sorted(registered))})"]
    section = registered[name]
    if section is not None and cfg.sections.get(name) is None:  # its class refused its defaults
        try:
            section()
        except (ValueError, TypeError) as exc:
            return [f"{cfg.kind}.{name}: {exc}"]
    return []


def workflow_errors(cfg: Config, name: str, key: str) -> list[str]:
    """The workflow ``name`` (at ``key``) must be registered, have its options and find every agent it calls."""
    errors = selected_errors(cfg.workflow, key, name)
    if errors:
        return errors
    needed = WORKFLOWS[name].agents_for(cfg.workflow.sections[name])
    which = f"agents: workflow {name!r}" if key == "workflow.name" else f"{key}: {name!r}"
    return [f"{which} calls agent {a!r}; add agents.{a}" for a in sorted(set(needed) - set(cfg.agents))]


def credit_errors(algo: AlgoConfig, workflow: str, wf_cfg: Any) -> list[str]:
    """Credit settings the workflow cannot honour, each with what to do instead."""
    errors = []
    if algo.credit != "shapley" and algo.shapley != ShapleyConfig():
        errors.append("algo.shapley options apply to algo.credit: shapley; set algo.credit: shapley or remove them")
    if algo.credit == "shapley":
        if getattr(wf_cfg, "per_step_rewards", False):
            errors.append(f"algo.credit: shapley sets per-agent rewards, but workflow {workflow!r} is configured with "
                          f"per-step rewards, which would override them; use its joint reward "
                          f"(workflow.math_team.reward: joint, workflow.math_tree.reward: tree) or algo.credit: none")
        if algo.shapley.counterfactual == "workflow" and WORKFLOWS[workflow].counterfactual is None:
            errors.append(f"algo.shapley.counterfactual: workflow {workflow!r} has no counterfactual of its own; "
                          f"set algo.shapley.counterfactual: rerun (re-runs the workflow with masked agents)")
    return errors


def schedule_errors(cfg: Config) -> list[str]:
    """Checks of the overlong penalty and the async update buffers."""
    errors = []
    a, t = cfg.algo, cfg.train
    if a.overlong_buffer < 0 or a.overlong_penalty < 0:
        errors.append(f"algo.overlong_buffer {a.overlong_buffer} and algo.overlong_penalty {a.overlong_penalty} must be >= 0")
    elif a.overlong_buffer == 0 and a.overlong_penalty != 1.0:
        errors.append("algo.overlong_penalty has no effect while algo.overlong_buffer is 0; set a buffer (tokens) too")
    for name, ac in cfg.agents.items():
        if a.overlong_buffer > ac.max_new_tokens:
            errors.append(f"algo.overlong_buffer {a.overlong_buffer} is longer than agents.{name}.max_new_tokens "
                          f"{ac.max_new_tokens}; use a buffer <= the smallest max_new_tokens (DAPO uses about 1/4 of it)")
    if t.min_buffer_steps < 1 or t.max_update_steps < 0 or t.max_policy_lag < 0:
        errors.append(f"train.min_buffer_steps {t.min_buffer_steps} must be >= 1, train.max_update_steps "
                      f"{t.max_update_steps} >= 0 and train.max_policy_lag {t.max_policy_lag} >= 0")
    if t.update_mode == "async":
        if cfg.loss.old_logprobs != "engine":
            errors.append("train.update_mode: async trains on steps generated by older weights; the PPO ratio must divide "
                          "by the log-probs recorded at generation: set loss.old_logprobs: engine (and "
                          "models.<name>.rollout_dtype: same, so those log-probs are the learner's own)")
    elif (t.min_buffer_steps, t.max_update_steps, t.max_policy_lag) != (1, 0, 1):
        errors.append("train.min_buffer_steps, max_update_steps and max_policy_lag apply to train.update_mode: async; "
                      "set update_mode: async or remove them")
    return errors


def task_options(cfg: TaskConfig) -> Any:
    """The selected task's options, as its factory takes them (its config object, or a mapping)."""
    return cfg.selected


def workflow_options(cfg: WorkflowConfig) -> Any:
    """The selected workflow's options (an instance of the config class it registered)."""
    return cfg.selected


def load_config(path: str | os.PathLike | None, overrides: Sequence[str] = ()) -> Config:
    """Load a YAML config file (or defaults when ``path`` is None) with ``key=value`` overrides."""
    return configtools.load(Config, path, overrides)
