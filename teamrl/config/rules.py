"""Rules across the sections of teamrl's configuration, checked by :meth:`teamrl.config.schema.Config.__post_init__`:
each returns the settings that cannot be honoured, with what to do instead, so that all errors are
reported together. The rules read the sections (:mod:`teamrl.config.sections`) and a whole config through
:class:`RunConfig`; the schema imports them, never the other way."""

from __future__ import annotations

import math
from typing import Any, Literal, Protocol

from teamrl.config import tools as configtools
from teamrl.config.model import ModelConfig, PlacementConfig, RayConfig, sharding_errors
from teamrl.config.sections import (
    AgentConfig,
    AlgoConfig,
    EvalConfig,
    LossConfig,
    RolloutConfig,
    TaskConfig,
    TrainConfig,
    WorkflowConfig,
)
from teamrl.scoring import stage_errors
from teamrl.suggest import did_you_mean
from teamrl.tasks.base import load_builtin_tasks
from teamrl.tasks.env import ENVS
from teamrl.team.registry import WORKFLOWS, Capabilities


class RunConfig(Protocol):
    """The sections of a whole config that the rules read (:class:`teamrl.config.schema.Config` is one)."""

    @property
    def task(self) -> TaskConfig: ...
    @property
    def workflow(self) -> WorkflowConfig: ...
    @property
    def models(self) -> dict[str, ModelConfig]: ...
    @property
    def agents(self) -> dict[str, AgentConfig]: ...
    @property
    def algo(self) -> AlgoConfig: ...
    @property
    def loss(self) -> LossConfig: ...
    @property
    def rollout(self) -> RolloutConfig: ...
    @property
    def train(self) -> TrainConfig: ...
    @property
    def eval(self) -> EvalConfig: ...
    @property
    def backend(self) -> Literal["local", "ray"]: ...
    @property
    def ray(self) -> RayConfig: ...


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


def backend_errors(cfg: RunConfig) -> list[str]:
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
        errors += sharding_errors(name, mc)
    if cfg.backend == "local" and cfg.ray != RayConfig():
        errors.append("ray: settings of the Ray cluster need backend: ray; set backend: ray or remove the ray section")
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


def workflow_errors(cfg: RunConfig, name: str, key: str) -> list[str]:
    """The workflow ``name`` (at ``key``) must be registered, have its options and find every agent it calls."""
    errors = selected_errors(cfg.workflow, key, name)
    if errors:
        return errors
    needed = WORKFLOWS[name].agents_for(cfg.workflow.sections[name])
    which = f"agents: workflow {name!r}" if key == "workflow.name" else f"{key}: {name!r}"
    return [f"{which} calls agent {a!r}; add agents.{a}" for a in sorted(set(needed) - set(cfg.agents))]


def capabilities(cfg: RunConfig, name: str) -> Capabilities:
    """What workflow ``name`` does with its options in ``cfg`` (nothing, when it is not registered)."""
    if name not in WORKFLOWS:
        return Capabilities(name)
    return WORKFLOWS[name].capabilities(name, cfg.workflow.sections.get(name))


def scoring_errors(cfg: RunConfig) -> list[str]:
    """Every scoring stage's rules (:func:`teamrl.scoring.stage_errors`) for the training workflow."""
    spec = WORKFLOWS.get(cfg.workflow.name)
    return stage_errors(cfg.algo, capabilities(cfg, cfg.workflow.name), spec, cfg)


def tree_sampling_errors(cfg: RunConfig) -> list[str]:
    """A workflow that drives an environment needs one, and a tree-sampling one's evaluation must not pick actions
    by reward."""
    load_builtin_tasks()  # registers the built-in environments
    errors = []
    for key, name in (("workflow.name", cfg.workflow.name), ("eval.workflow", cfg.eval.workflow)):
        if name is not None and capabilities(cfg, name).needs_environment and cfg.task.name not in ENVS:
            errors.append(f"{key}: {name!r} drives an environment, but task {cfg.task.name!r} is not one; "
                          f"set task.name to an environment ({', '.join(sorted(ENVS))})")
    if capabilities(cfg, cfg.workflow.name).tree_sampling and cfg.eval.workflow is None:
        errors.append(f"eval.workflow: workflow {cfg.workflow.name!r} picks each turn's action by the environment's "
                      f"reward, which evaluation must not see; set eval.workflow to the same team without tree "
                      f"sampling (e.g. {cfg.workflow.name.removesuffix('_tree')})")
    return errors


def prefix_tree_errors(cfg: RunConfig) -> list[str]:
    """``rollout.prefix_tree``: fanouts of at least 1 whose product is the group size, on a workflow whose calls follow
    from its replies (no tree of its own, no environment, no per-step rewards, no Shapley reruns)."""
    fanout = cfg.rollout.prefix_tree
    if not fanout:
        return []
    if any(not isinstance(f, int) or isinstance(f, bool) or f < 1 for f in fanout):
        return [f"rollout.prefix_tree {fanout}: each fanout must be an integer >= 1 (C3: [2, 4])"]
    errors = []
    if math.prod(fanout) != cfg.rollout.group_size:
        errors.append(f"rollout.prefix_tree {fanout}: the product {math.prod(fanout)} must equal rollout.group_size "
                      f"{cfg.rollout.group_size} (the episodes per problem: the tree's leaves)")
    caps = capabilities(cfg, cfg.workflow.name)
    why = ("samples a tree of its own" if caps.tree_sampling or caps.search_tree else
           "drives an environment, which replaying replies would not restore" if caps.needs_environment else
           "records per-step rewards, which a replayed call would not carry" if caps.per_step_rewards else
           "runs a program teamrl does not replay" if cfg.workflow.name in ("agent_program", "verifiers") else "")
    if why:
        errors.append(f"rollout.prefix_tree: workflow {cfg.workflow.name!r} {why}; a prefix tree replays a workflow's "
                      f"first calls, so its calls must follow from its replies alone (math_team, single, ...)")
    if cfg.algo.credit != "none":
        errors.append(f"rollout.prefix_tree does not combine with algo.credit {cfg.algo.credit} (its reruns and "
                      f"coalitions are of independent episodes); set algo.credit: none")
    return errors


def hub_errors(cfg: RunConfig) -> list[str]:
    """A verifiers environment is scored by its own rollout: its task and the verifiers workflow go together."""
    errors = []
    runs = [("workflow.name", cfg.workflow.name)] + ([("eval.workflow", cfg.eval.workflow)] if cfg.eval.workflow else [])
    for key, name in runs:
        if cfg.task.name == "verifiers" and name != "verifiers":
            errors.append(f"{key}: task verifiers is scored by the environment's own rollout and rubric; set {key}: "
                          f"verifiers (not {name!r})")
        if name == "verifiers" and cfg.task.name != "verifiers":
            errors.append(f"{key}: workflow verifiers runs a verifiers environment; set task.name: verifiers "
                          f"(not {cfg.task.name!r})")
    return errors


OBJECTIVES: dict[str, dict[tuple[str, str], Any]] = {
    "mars2+": {("algo", "estimator"): "tree", ("algo", "eps"): 1e-9, ("loss", "level"): "sequence",
               ("loss", "agg"): "seq-mean-token-mean", ("loss", "clip_low"): 0.2, ("loss", "clip_high"): 0.2,
               ("loss", "old_logprobs"): "engine", ("loss", "rollout_correction"): "token-tis",
               ("loss", "rollout_correction_threshold"): 2.0, ("loss", "rollout_correction_veto"): 1e-4,
               ("loss", "kl_coef"): 1e-3, ("loss", "kl_kind"): "k3"},
}
"""``algo.objective`` presets: (section, key) -> value, for every key the config does not set itself."""


def _written(section: str, key: str, part: Any) -> bool:
    """Whether the user set ``section.key``: written in the file or an override (a key set to its default value
    counts), or, for a config built in Python without :func:`teamrl.config.tools.from_dict`, differing from its
    default."""
    written = configtools.written()
    if written is None:
        return bool(getattr(part, key) != getattr(type(part)(), key))
    found = written.get(section)
    return isinstance(found, dict) and key in found


def apply_objective(cfg: RunConfig) -> None:
    """Set the keys of ``cfg.algo.objective`` that the user did not set (in place; a key the user wrote keeps its
    value, even when it is the default's); MARS2+'s overlong buffer, when not set, is a sixteenth of the smallest
    ``max_new_tokens`` (at least 1; MARTI's MARS2 scripts: 2048 of 32768)."""
    name = cfg.algo.objective
    if name == "none":
        return
    for (section, key), value in OBJECTIVES[name].items():
        part = getattr(cfg, section)
        if not _written(section, key, part):
            setattr(part, key, value)
    if name == "mars2+" and not _written("algo", "overlong_buffer", cfg.algo) and cfg.agents:
        cfg.algo.overlong_buffer = max(1, min(a.max_new_tokens for a in cfg.agents.values()) // 16)


def schedule_errors(cfg: RunConfig) -> list[str]:
    """Checks of the overlong penalty, the rollout correction and the async update buffers."""
    errors = []
    a, t = cfg.algo, cfg.train
    for name, ac in cfg.agents.items():
        if a.overlong_buffer > ac.max_new_tokens:
            errors.append(f"algo.overlong_buffer {a.overlong_buffer} is longer than agents.{name}.max_new_tokens "
                          f"{ac.max_new_tokens}; use a buffer <= the smallest max_new_tokens (DAPO uses about 1/4 of it)")
    if t.min_buffer_steps < 1 or t.max_update_steps < 0 or t.max_policy_lag < 0:
        errors.append(f"train.min_buffer_steps {t.min_buffer_steps} must be >= 1, train.max_update_steps "
                      f"{t.max_update_steps} >= 0 and train.max_policy_lag {t.max_policy_lag} >= 0")
    if cfg.loss.share_prefixes and not cfg.loss.pack_rows:
        errors.append("loss.share_prefixes computes shared prefixes inside packed rows; set loss.pack_rows: true, or "
                      "loss.share_prefixes: false")
    corrected = {name: (mc.rollout_correction or cfg.loss.rollout_correction) != "none"
                 for name, mc in cfg.models.items() if mc.trainable}
    if any(corrected.values()) and cfg.loss.old_logprobs != "recompute" and cfg.loss.level != "sequence":
        errors.append("loss.rollout_correction weighs the learner's recomputed log-probs against the sampler's; with "
                      "loss.old_logprobs: engine the PPO ratio already divides by the sampler's: set "
                      "loss.old_logprobs: recompute, or rollout_correction: none (loss.level: sequence takes both, "
                      "as MARS2's GSPO loss does)")
    l = cfg.loss
    if not (1.0 < l.rollout_correction_threshold < math.inf):
        errors.append(f"loss.rollout_correction_threshold {l.rollout_correction_threshold} must be a finite number > 1 "
                      f"(verl's default 2.0)")
    if l.rollout_correction_lower is not None and not 0.0 < l.rollout_correction_lower <= 1.0:
        errors.append(f"loss.rollout_correction_lower {l.rollout_correction_lower} must be in (0, 1], or null for "
                      f"1 / rollout_correction_threshold")
    if l.rollout_correction_veto is not None and not 0.0 < l.rollout_correction_veto < 1.0:
        errors.append(f"loss.rollout_correction_veto {l.rollout_correction_veto} must be in (0, 1) (1e-4 in "
                      f"OpenRLHF), or null for no veto")
    elif l.rollout_correction_veto is not None and not any(corrected.values()):
        errors.append("loss.rollout_correction_veto applies with a rollout correction, and no trained model has one: "
                      "set loss.rollout_correction (e.g. token-tis), or loss.rollout_correction_veto: null")
    if t.update_mode == "async":
        if cfg.loss.old_logprobs != "engine" and not all(corrected.values()):
            errors.append("train.update_mode: async trains on steps generated by older weights; the PPO ratio must divide "
                          "by the log-probs recorded at generation (loss.old_logprobs: engine, with "
                          "models.<name>.rollout_dtype: same), or every trained model needs a loss.rollout_correction "
                          "(the decoupled objective: the learner's recomputation is the PPO anchor, the correction "
                          "weighs it against the sampler's)")
        if t.whole_batches and t.max_update_steps:
            errors.append(f"train.whole_batches trains whole multiples of train.min_buffer_steps and discards the rest; "
                          f"train.max_update_steps {t.max_update_steps} would keep a rest for later: set it to 0")
    elif (t.min_buffer_steps, t.max_update_steps, t.max_policy_lag, t.whole_batches) != (1, 0, 1, False):
        errors.append("train.min_buffer_steps, max_update_steps, max_policy_lag and whole_batches apply to "
                      "train.update_mode: async; set update_mode: async or remove them")
    return errors


def count_errors(cfg: RunConfig) -> list[str]:
    """Counts, sizes and coefficients outside their range (negative steps or threads, a clip below 0, ...)."""
    t, ev, loss = cfg.train, cfg.eval, cfg.loss
    errors = [f"train.{key} {getattr(t, key)} must be >= 0{hint}" for key, hint in (
        ("steps", " (0: evaluate only)"), ("threads", " (0: torch's default)"), ("save_every", " (0: only at the end)"),
        ("transcripts_per_step", "")) if getattr(t, key) < 0]
    if t.steps == 0 and not (ev.before or ev.after):
        errors.append("train.steps 0 trains nothing, and eval.before and eval.after are off, so the run would do "
                      "nothing; set train.steps >= 1, or turn on eval.before to evaluate only")
    if t.keep_checkpoints < 1:
        errors.append(f"train.keep_checkpoints {t.keep_checkpoints} would keep no checkpoint to resume from; "
                      f"set it to 1 or more (1: the newest only)")
    if ev.problems < 0:
        errors.append(f"eval.problems {ev.problems} must be >= 0 (0: the whole test split)")
    if ev.temperature is not None and not ev.temperature >= 0:
        errors.append(f"eval.temperature {ev.temperature} must be >= 0 (0: greedy), or null for each agent's own")
    if ev.top_p is not None and not 0 < ev.top_p <= 1:
        errors.append(f"eval.top_p {ev.top_p} must be in (0, 1] (1: off), or null for each agent's own")
    if not 0 <= loss.clip_low < 1:
        errors.append(f"loss.clip_low {loss.clip_low} must be in [0, 1) (the ratio is clipped below at 1 - clip_low)")
    if not loss.clip_high >= 0:
        errors.append(f"loss.clip_high {loss.clip_high} must be >= 0")
    if not loss.kl_coef >= 0:
        errors.append(f"loss.kl_coef {loss.kl_coef} must be >= 0 (0: no KL penalty)")
    if loss.dual_clip is not None and not loss.dual_clip > 1:
        errors.append(f"loss.dual_clip {loss.dual_clip} must be > 1 (the paper uses 3), or null to turn it off")
    return errors


def fidelity_errors(cfg: RunConfig) -> list[str]:
    """Checks of the loss options that compute what an original's code computes (docs/fidelity.md): the scoring
    temperature and the update schedule (the scoring stages check their own: :func:`scoring_errors`)."""
    errors = []
    l = cfg.loss
    if l.logprob_temperature is not None and not l.logprob_temperature > 0:
        errors.append(f"loss.logprob_temperature {l.logprob_temperature} must be > 0 (or null: each reply's own)")
    elif l.logprob_temperature is not None and l.old_logprobs != "recompute":
        errors.append(f"loss.logprob_temperature {l.logprob_temperature} scores replies at another temperature than "
                      f"the sampler's log-probs; set loss.old_logprobs: recompute")
    if l.updates_per_batch < 1:
        errors.append(f"loss.updates_per_batch {l.updates_per_batch} must be >= 1")
    elif l.mini_batch_rows < 0:
        errors.append(f"loss.mini_batch_rows {l.mini_batch_rows} must be >= 0 (0: loss.updates_per_batch decides)")
    elif l.mini_batch_rows and l.updates_per_batch != 1:
        errors.append(f"loss.mini_batch_rows {l.mini_batch_rows} and loss.updates_per_batch {l.updates_per_batch} both "
                      f"set the mini-batches; keep one of them")
    if l.drop_remainder and l.mini_batch_rows == 0:
        errors.append("loss.drop_remainder drops the rows that fill no whole mini-batch of loss.mini_batch_rows rows; "
                      "set loss.mini_batch_rows or remove it")
    return errors
