"""The sections of teamrl's configuration (``task``, ``workflow``, ``agents.<a>``, ``algo``, ``loss``,
``rollout``, ``train``, ``eval``), each a typed dataclass whose fields are documented where they are declared.

The whole config, :class:`teamrl.config.schema.Config`, holds them and checks the rules across them
(:mod:`teamrl.config.rules`, which reads these classes and is read by the schema: one way).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from teamrl.config import tools as configtools
from teamrl.engines.base import SamplingParams
from teamrl.tasks.base import task_configs
from teamrl.team.registry import workflow_configs


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
    """Replaces the registered agent's system prompt; "" sends no system message (the chat template's own default, if it has one, applies); null keeps the registered one."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keywords of the model's chat template for this agent's prompts, e.g. {enable_thinking: false} (Qwen3)."""
    max_prompt_tokens: int = 0
    """Longest prompt of this agent's calls in tokens, chat template included (verl's data.max_prompt_length); a longer one is cut as truncation says. 0: no limit but the model's max_context."""
    truncation: Literal["left", "right", "middle", "error"] = "error"
    """How a prompt over max_prompt_tokens is cut (verl's data.truncation): left drops its start, right its end, middle its middle (the first max_prompt_tokens // 2 and the last tokens kept); error refuses the call, and the episode fails as over max_context."""
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
        if self.max_prompt_tokens < 0:
            raise ValueError(f"max_prompt_tokens {self.max_prompt_tokens} must be >= 0 (0: no limit of its own)")

    def sampling(self, temperature: float | None = None, top_p: float | None = None) -> SamplingParams:
        """How this agent's calls are sampled (``temperature`` and ``top_p`` replace its own, e.g. eval.temperature)."""
        return SamplingParams(temperature=self.temperature if temperature is None else temperature,
                              top_p=self.top_p if top_p is None else top_p, top_k=self.top_k,
                              max_new_tokens=self.max_new_tokens)


@dataclass(kw_only=True)
class TaskConfig(configtools.Sections):
    name: str = "arith"
    """Registered task (every task a domain under teamrl/domains registers, and those of an --import file; the list below is the registry's). Each task's options are task.<name>, checked against the config class it registered (task.options is another spelling of the selected task's)."""

    kind: ClassVar[str] = "task"
    alias: ClassVar[str | None] = "options"

    @classmethod
    def section_types(cls) -> dict[str, type | None]:
        return task_configs()


@dataclass(kw_only=True)
class WorkflowConfig(configtools.Sections):
    name: str = "math_team"
    """Registered workflow that runs each episode, e.g. math_team (solver + verifier, Dr. MAS), math_tree (MARS2; docs/credit.md), agent_program (an existing program written against the OpenAI API; docs/agent-programs.md) or single (one agent); the list below is the registry's (the core's, every domain's and an --import file's). Each workflow's options are workflow.<name>, checked against the config class it registered (workflow.options is another spelling of the selected workflow's)."""

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
class RewardAllocConfig:
    name: Literal["none", "margin", "tree"] = "none"
    """MARTI's reward_alloc shaping of a search tree's node rewards (MARS2; docs/fidelity.md), applied to each step's credited reward before the overlong penalty and the advantages; needs a tree workflow (math_tree, code_tree). margin: the MARS2 commit's, the k-th node of a tree gets r + alpha * (r - mean of the tree's earlier nodes). tree: MARTI's head, r + alpha * (r - ((1 - beta) * the parent's shaped reward + beta * the mean of its siblings)), the parent alone for an only child, the siblings alone under the root. none: the raw node reward."""
    alpha: float = 0.5
    """Weight of the margin (MARTI's default 0.5), >= 0."""
    beta: float = 0.5
    """tree: weight of the siblings' mean against the parent's reward in the baseline, in [0, 1] (MARTI's default 0.5); margin ignores it."""


@dataclass(kw_only=True)
class DistillConfig:
    teachers: dict[str, str | list[str]] = field(default_factory=dict)
    """On-policy distillation per role (docs/distillation.md): agent -> the model (an entry of models, trainable: false) it is distilled towards, or a list of them (loss: jsd, MAD-OPD's team of teachers); agents not listed are not distilled. Empty: off."""
    loss: Literal["reverse_kl", "jsd"] = "reverse_kl"
    """reverse_kl: the per-token advantage -coef * d_t, d_t = log p_student(y_t) - log p_teacher(y_t) on each sampled token (tinker-cookbook's on-policy distillation; one teacher per agent). jsd: MAD-OPD's loss, coef times the weighted generalized Jensen-Shannon divergence to each teacher's whole next-token distribution at every reply token, added to the RL loss (in-process teachers)."""
    coef: float = 1.0
    """reverse_kl: weight of the per-token advantage (tinker-cookbook's kl_penalty_coef). jsd: weight of the divergence loss. >= 0."""
    discount: float = 0.0
    """reverse_kl: 0, each token's term alone; in (0, 1), the discounted sum of the reply's later tokens' terms (tinker-cookbook's kl_discount_factor)."""
    rl_weight: float = 1.0
    """Multiplies the RL advantage of a distilled agent's steps: 1 adds the RL objective to the distillation, 0 distils alone."""
    beta: float = 0.5
    """jsd: the divergence's beta in [0, 1], beta * KL(T || M) + (1 - beta) * KL(S || M) with M = beta * T + (1 - beta) * S; 0 is KL(T || S), 1 is KL(S || T) (MAD-OPD's scripts: --beta 0.5)."""
    top_k: int = 0
    """jsd: 0 compares the whole vocabulary; k > 0 the teacher's k most likely tokens, both distributions renormalised over them (MAD-OPD's jsd_top_k, off by default)."""
    weights: list[float] = field(default_factory=list)
    """jsd without a debate: each teacher's fixed weight, normalised to sum 1 (MAD-OPD's --teacher_weights, its mt_opd baseline 0.5 0.5); empty: equal."""
    debate_rounds: int = 0
    """jsd with two teachers: 0, no debate (mt_opd, the fixed weights); R >= 1, MAD-OPD: for each trained reply the two teachers debate its prompt for R rounds without seeing the reply (its scripts: 2), each then scores the reply after the prompt and the debate transcript, weighted by the softmax of their last round's confidence tags."""
    debate_mode: Literal["general", "code", "tool"] = "general"
    """The debate's prompts: general (math and reasoning), code (code_mode) or tool (ToolACE), MAD-OPD's texts."""
    debate_max_tokens: int = 4096
    """Tokens each teacher may write per debate round (MAD-OPD's mad_t1_max_tokens / mad_t2_max_tokens)."""
    debate_temperature: float = 0.7
    """Sampling temperature of the debate (its scripts' --mad_debate_temperature)."""
    debate_top_p: float = 0.8
    """Nucleus sampling of the debate (its scripts' --mad_debate_top_p)."""
    debate_top_k: int = 20
    """Top-k sampling of the debate (its scripts' --mad_debate_top_k); 0: off. A repetition penalty of 1.1 is applied, as in its generation calls."""

    def teacher_models(self) -> dict[str, list[str]]:
        """Each distilled agent's teachers, in order."""
        return {a: [t] if isinstance(t, str) else list(t) for a, t in self.teachers.items()}

    def models(self) -> list[str]:
        """Every teacher model, once, in order of first mention."""
        return list(dict.fromkeys(m for ts in self.teacher_models().values() for m in ts))


@dataclass(kw_only=True)
class AlgoConfig:
    objective: Literal["none", "mars2+"] = "none"
    """A named objective that sets every algo and loss key it names which the config does not write itself (a key written keeps its value, its default included; docs/off-policy.md). mars2+: the objective MARS2's code trains with (arXiv 2602.07848; MARTI's MARS2 launch scripts: OpenRLHF's GSPO loss with vLLM IS correction): algo.estimator tree, loss.level sequence (GSPO) with seq-mean-token-mean and clip 0.2/0.2, the sequence ratio against the sampler's log-probs (loss.old_logprobs engine), token-level TIS at 2 with a veto at 1e-4 (loss.rollout_correction token-tis, rollout_correction_veto), a k3 KL penalty of 1e-3 to the initial model, algo.eps 1e-9, and DAPO's overlong penalty (algo.overlong_buffer, when unset: a sixteenth of the smallest max_new_tokens, MARTI's 2048 of 32768)."""
    estimator: str = "drmas"
    """Advantage estimator preset (docs/advantages.md): grpo, grpo_step, agent_episode, drmas, at_grpo (needs a tree-sampling workflow: env_single_tree, env_team_tree), agent_turn (AT-GRPO's agent-and-turn key without tree sampling), magrpo, rloo, dr_grpo, reinforce_pp, tree, rae (SPIRAL's role-conditioned advantage estimation, arXiv 2506.24119: each agent's reward minus a running mean of that agent's (role's) reward in this game, kept across steps, algo.rae_decay; for two-player games, where each seat is an agent), c3 (C3's counterfactual credit, arXiv 2603.06859: on a rollout.prefix_tree, each reply's subtree-mean return minus its siblings' leave-one-out mean, z-scored among them; docs/c3.md)."""
    rae_decay: float = 0.95
    """estimator rae: decay of the running mean per (game, role): baseline <- decay * baseline + (1 - decay) * reward, after the baseline was read (SPIRAL's role_baseline_ema_gamma, 0.95)."""
    format_penalty: float = 0.0
    """Subtracted from the reward of every step whose reply broke its agent's format (invalid answer or verdict)."""
    eps: float = 1e-6
    """Added to the standard deviation before dividing (c3: to the siblings' variance, inside the square root; C3's is 1e-8)."""
    credit: Literal["none", "shapley"] = "none"
    """Credit assignment before normalization (docs/credit.md). none: the workflow's rewards. shapley: each agent's reward is global_weight * R + credit_weight * its Shapley value over counterfactual coalitions (SHARP, arXiv 2602.08335)."""
    shapley: ShapleyConfig = field(default_factory=ShapleyConfig)
    """Options of credit: shapley."""
    distill: DistillConfig = field(default_factory=DistillConfig)
    """On-policy distillation per role: a teacher (or a team of them) per agent, its per-token reverse KL added to the advantage or MAD-OPD's divergence loss added to the RL loss."""
    overlong_buffer: int = 0
    """DAPO's soft overlong penalty (arXiv 2503.14476): a reply within this many tokens of its agent's max_new_tokens loses up to overlong_penalty, linearly; 0 turns it off."""
    overlong_penalty: float = 1.0
    """Largest overlong penalty (a reply at its token limit)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling (arXiv 2503.14476): before the update, drop the steps of every advantage group (the estimator's scope: per problem, per agent, per tree, ...) whose rewards are all equal; they carry no gradient but dilute the loss's denominators. Counts are logged as dynamic/... ."""
    dynamic_sampling_refill: int = 0
    """With dynamic_sampling: while fewer than rollout.batch_size problems have a group left, roll out rollout.batch_size more problems, up to this many extra rounds per step (DAPO's max_num_gen_batches - 1); 0: no refill."""
    reward_alloc: RewardAllocConfig = field(default_factory=RewardAllocConfig)
    """MARTI's tree reward shaping (MARS2)."""
    group_filter: Literal["none", "mean", "std", "dapo", "uid"] = "none"
    """PettingLLMs' group filter (AT-GRPO's code: filter_method; docs/fidelity.md), applied before the update to each model's steps, grouped by the estimator's scope; the kept steps' advantages are computed again over what is kept. mean: drop the int(G * group_filter_ratio) groups of lowest mean reward (a one-row group counts as mean 0; its shipped plan-path, Sokoban and Sudoku configs use mean with 0.5). std: drop those of lowest variance / range^2. dapo: drop every group whose rewards are all equal (as algo.dynamic_sampling without refill; the ratio is unused). uid: in every group, drop the int(n * group_filter_ratio) rows farthest from its mean. none: keep every step."""
    group_pool: int = 1
    """Problems of a batch pooled into one advantage group (and group filter group): a step's problem counts as its index in the batch // group_pool. 1: one group per problem. PettingLLMs keys its groups by (env_idx // sample_num, turn, agent) with env_idx already the problem's index under tree sampling (multi_agents_ppo_trainer.py:1679), which pools sample_num consecutive problems: with its turn order every plan candidate of a problem gets one reward, and only this pooling gives the plan agent a gradient there (docs/fidelity.md). Not with a tree scope (at_grpo, tree): pool with agent_turn."""
    group_filter_ratio: float = 0.0
    """The fraction of groups (mean, std) or of each group's rows (uid) that algo.group_filter drops, in (0, 1] (PettingLLMs' filter_ratio)."""


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
    agent_grad_norms: bool = True
    """Each agent's gradient is accumulated apart from the others' and measured (agent/<a>/grad_norm, exact when agents share a model), which holds one more gradient buffer (4 B per trained parameter: 0.5 GiB for SmolLM2-135M) while the agents after the first run their micro-batches. false: all agents' micro-batches accumulate into one buffer and agent/<a>/grad_norm is not logged (loss/<m>/grad_norm, the total, still is); the update is the same (docs/memory.md)."""
    logits_chunk_tokens: int = 1024
    """The LM head and log-softmax run on at most this many response tokens at a time (recomputed in backward), so the [tokens x vocabulary] logits of a micro-batch never exist at once (0: all at once). Values equal the unchunked ones (to 1e-6 in fp32). 1024 keeps a chunk's fp32 logits, their exp and gradient at 12 B x vocab x 1024 (0.56 GiB at SmolLM2's 49k vocabulary, 1.7 GiB at Qwen's 152k) (each chunk's LM head runs again in backward; docs/memory.md)."""
    logprob_temperature: float | None = None
    """Temperature the learner scores the sampled tokens at (softmax of logits / it); null: each reply's sampling temperature. PettingLLMs samples at the agents' temperature but computes old and new log-probs at its rollout temperature (1.0): logprob_temperature 1.0 trains that gradient. Needs loss.old_logprobs: recompute (the sampler's log-probs are at the sampling temperature)."""
    old_logprobs: Literal["engine", "recompute"] = "engine"
    """Log-probs the PPO ratio divides by. engine: the sampling log-probs recorded at generation (exact when the engine shares the learner's module). recompute: the learner's own log-probs before its first update (with updates_per_batch=1 this is the current policy detached, so the ratio is exactly 1; with more, one extra no-grad pass over the rows that carry a gradient). Use recompute when the engine runs in another dtype."""
    pack_rows: bool = True
    """The learner lays each micro-batch's rows end to end without padding (attention per row, positions per row); micro-batches are filled to micro_batch_tokens computed tokens in row order. false: right-padded rows (rows x longest <= micro_batch_tokens). Needs sdpa attention without sliding windows (docs/architecture.md)."""
    share_prefixes: bool = True
    """With pack_rows: rows of a micro-batch that start with the same tokens (a group's prompt, an agent's earlier prompt that a later call extends) compute that prefix once in the forward and the backward, as a prefix tree; log-probs and gradients equal the row-by-row ones up to float summation order. Detected from the token ids alone."""
    rollout_correction: Literal["none", "token-tis", "token-mis", "seq-tis", "seq-mis"] = "none"
    """Importance weights between the learner's recomputed log-probs of the sampled tokens and the sampler's own (docs/off-policy.md). token-tis / seq-tis: each token's policy-gradient term times min(rho, threshold), rho per token or the geometric mean over the reply (truncated IS). token-mis / seq-mis: rho kept where it lies in [lower, threshold]; tokens (replies) outside are masked out of the loss's numerator and denominator (masked IS). With loss.old_logprobs: recompute the PPO ratio divides by the learner's log-probs and the weight carries the sampler's (under train.update_mode: async, AReaL's decoupled objective). With loss.old_logprobs: engine (loss.level: sequence only) the sequence ratio divides by the sampler's log-probs and the weight multiplies as well, OpenRLHF's GSPO with vLLM IS correction (MARS2's code); this counts the mismatch in both. Per model: models.<name>.rollout_correction. The mismatch metrics (mismatch/...) are logged whether or not it is on."""
    rollout_correction_threshold: float = 2.0
    """Upper bound C > 1 of the importance weight (verl's default 2.0); TIS truncates at it, MIS masks above it."""
    rollout_correction_lower: float | None = None
    """Lower bound of the MIS range, in (0, 1]; null takes 1 / rollout_correction_threshold (as verl)."""
    rollout_correction_veto: float | None = None
    """With a rollout_correction: a reply any of whose tokens has rho = pi_learner / pi_sampler below this value gets weight 0 on every token (its tokens stay in the denominators), OpenRLHF's vllm_is_veto_threshold (1e-4 there); in (0, 1), null: no veto."""
    updates_per_batch: int = 1
    """Optimizer steps per rollout batch (the batch is split into this many mini-batches, row i in mini-batch i mod this number); >1 makes later mini-batches off-policy, which the PPO clip bounds. Dr. MAS's search scripts take 5 (ppo_mini_update_num), its math scripts 1."""
    mini_batch_rows: int = 0
    """> 0: one optimizer step per run of this many consecutive rows of each model's batch instead of updates_per_batch (verl's ppo_mini_batch_size: PettingLLMs' AT-GRPO configs 16 rows; MARTI's MARS2 scripts train_batch_size 8); the last, shorter run is trained too unless loss.drop_remainder. 0: updates_per_batch decides."""
    drop_remainder: bool = False
    """With mini_batch_rows: the rows that fill no whole mini-batch are not trained (MARTI trains whole batches only)."""


@dataclass(kw_only=True)
class RolloutConfig:
    batch_size: int = 8
    """Problems per training step."""
    group_size: int = 8
    """Episodes per problem; advantages compare steps within a problem's episodes."""
    prefix_tree: list[int] = field(default_factory=list)
    """The episodes of a problem as a prefix tree of calls (C3's rollout, docs/c3.md): fanout per call, in call order, e.g. [2, 4]: 2 first calls, then under each 4 second calls with the first replayed (not generated again), the rest of each episode sampled; the product must be group_size. An episode that ends before a level has no children there (fewer episodes). algo.estimator c3 needs it; other estimators train on the tree's episodes as on independent ones (and log C3's diagnostics). Empty: independent episodes."""


@dataclass(kw_only=True)
class TrainConfig:
    steps: int = 20
    """Training steps (one rollout batch and its updates each)."""
    seed: int = 0
    """Seed of data order, sampling and initialisation."""
    save_every: int = 10
    """Checkpoint every this many steps (and at the end); 0 = only at the end."""
    keep_checkpoints: int = 1
    """Checkpoints the run folder keeps: the newest this many (so the final one always). Only the newest holds the optimizer and scheduler state that --resume needs with its weights (for SmolLM2-135M: 0.54 GB of weights, 1.08 GB of AdamW moments); the older kept ones hold weights and trainer state only, for teamrl eval --checkpoint and teamrl export --step. 1: the newest only. Must be >= 1: fewer would keep nothing to resume from."""
    release_memory: bool = True
    """At the start of each phase of a step (rollout, update) this process gives the memory the previous phase freed back to the system (Python's garbage collected, glibc's free heap pages trimmed with malloc_trim, or tcmalloc's free pages released; tens of milliseconds), so its resident memory falls between phases and perf/peak_rss_gb/<phase> is that phase's own peak (docs/memory.md). On the CPU the heap is also trimmed after each micro-batch of an update, and the hf engine frees its rollout copy (rollout_dtype other than the learner's) and its decode copies while the learner updates; they are made again from the learner's weights at the weight sync (0.63 GiB for SmolLM2-135M in bf16; the CUDA device loop keeps its weights, which its graphs point at). false: the allocator keeps freed pages for reuse, the engine its copies, and the rollout's resident memory stays at the update's peak."""
    transcripts_per_step: int = 2
    """Episodes per step written to episodes.jsonl."""
    threads: int = 0
    """torch CPU threads (0 = torch's default)."""
    spike_factor: float = 3.0
    """A step's gradient norm (per agent, per model) above this multiple of its running median counts as a spike (metrics `.../grad_spike`, `.../grad_spikes`; totals in summary.json)."""
    spike_window: int = 20
    """Previous steps whose gradient norms form the running median of the spike rule."""
    update_mode: Literal["sync", "async"] = "sync"
    """sync: every learner updates after every rollout. async: each learner (one per model) updates only when its buffer holds train.min_buffer_steps steps, without waiting for the others (MARS2; docs/credit.md states the off-policy bound). Needs loss.old_logprobs=engine, or recompute with a loss.rollout_correction on every trained model (the decoupled objective)."""
    min_buffer_steps: int = 1
    """async: steps a model's buffer must hold before its learner updates."""
    max_update_steps: int = 0
    """async: most buffered steps one update trains on, oldest first (0: the whole buffer); the rest wait for a later update and become off-policy."""
    whole_batches: bool = False
    """async: an update trains on the largest multiple of train.min_buffer_steps steps its buffer holds (oldest first) and discards the rest, as MARTI's MARS2 trainer does with each agent's buffer (max(rollout_batch_size, train_batch_size) samples); needs max_update_steps 0."""
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
    top_p: float | None = None
    """Nucleus sampling threshold of every agent during evaluation (verl's val_kwargs.top_p); null keeps each agent's own."""
    before: bool = True
    """Evaluate the untrained team before training."""
    after: bool = True
    """Evaluate the trained team after training."""
    workflow: str | None = None
    """Workflow of the evaluation episodes (its options from workflow.<name>); null: the training workflow. E.g. evaluate a math_tree run (whose answer is the best of several feedback-guided attempts) with math_team or single."""
    every: int = 0
    """Evaluate on the held-out problems every this many training steps too (0 = off): after k updates (k = N, 2N, ...) the scores go to eval_step<k>.json and, as eval/<score> (eval/accuracy, eval/pass@n, ...), to the metrics row of step k, so held-out curves can be drawn; eval.before and eval.after are then logged as eval/<score> at step 0 and at train.steps. These evaluations leave the engines' sampling generators as they found them: training samples the same episodes with or without them."""
