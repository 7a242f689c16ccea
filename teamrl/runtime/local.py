"""``backend: local``: every physical model, its engine and its learner in this process, built from the config.

Four mappings come out of the same rules:

- shared: every agent names one model; one engine batches all their calls, one learner trains
  its weights on all their steps (per-agent ``loss_weight``).
- separate: each agent names its own model (``path`` may be the same); each model has its own
  engine, learner and optimizer, so per-agent ``lr``/``weight_decay`` apply.
- heterogeneous: models of different families or sizes, each with its own tokenizer and chat
  template; prompts, stop tokens and padding are those of the agent's model.
- LoRA: one frozen base (``lora.rank > 0``) with one adapter per ``agents.<name>.adapter``; one
  engine decodes every adapter's calls in one mixed batch, one learner holds one optimizer group
  per adapter (its own lr and weight decay).

Every choice is made here, once, before training starts.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from teamrl import hardware
from teamrl.algos.schedule import warmup_positions
from teamrl.config.schema import Config, LoraConfig, ModelConfig
from teamrl.engines.base import Engine
from teamrl.engines.registry import build_engine, engine_spec
from teamrl.learner.base import Learner
from teamrl.learner.learner import LearnerSettings, ParamGroup, TorchLearner
from teamrl.learner.settings import checkpointable_layers
from teamrl.models import CausalLM, load_model_and_tokenizer, load_tokenizer
from teamrl.plan import checkpointed_layers
from teamrl.runtime.base import Runtime


def fused_adamw(mc: ModelConfig) -> bool:
    """Whether the model's AdamW step is torch's fused one: on a GPU, and on the CPU where the weights are whole
    (not FSDP shards). The fused step updates each tensor in one kernel with no temporaries; the per-tensor loop it
    replaces holds two temporaries of the largest tensor (1.0 GiB at Qwen2.5-0.5B's embedding) and took 6-10x as
    long on a 2-core CPU (docs/memory.md)."""
    return mc.device.startswith("cuda") or mc.placement.sharding != "fsdp"


def learner_settings(cfg: Config, model_name: str) -> LearnerSettings:
    """The learner settings of one model: its optimizer, and ``loss`` with the model's overrides."""
    mc = cfg.models[model_name]
    o, l = mc.optim, cfg.loss
    return LearnerSettings(
        lr=o.lr, betas=(o.betas[0], o.betas[1]), weight_decay=o.weight_decay, grad_clip=o.grad_clip,
        warmup_steps=warmup_positions(o.schedule_style, o.schedule_steps or cfg.train.steps, steps=o.warmup_steps,
                                      ratio=o.warmup_ratio),
        schedule=o.schedule, total_steps=o.schedule_steps or cfg.train.steps, schedule_style=o.schedule_style,
        min_lr_ratio=o.min_lr_ratio, logprob_temperature=l.logprob_temperature or 0.0,
        clip_low=_pick(mc.clip_low, l.clip_low), clip_high=_pick(mc.clip_high, l.clip_high),
        dual_clip=l.dual_clip, agg=l.agg, level=l.level,
        kl_coef=_pick(mc.kl_coef, l.kl_coef), kl_kind=l.kl_kind, entropy_coef=l.entropy_coef,
        micro_batch_tokens=l.micro_batch_tokens, updates_per_batch=l.updates_per_batch,
        mini_batch_rows=l.mini_batch_rows, drop_remainder=l.drop_remainder,
        old_logprobs=l.old_logprobs, autocast=mc.train_autocast == "bfloat16",
        logits_chunk_tokens=l.logits_chunk_tokens, fused_adamw=fused_adamw(mc), optim_states=o.states,
        pack_rows=l.pack_rows, share_prefixes=l.share_prefixes, agent_grad_norms=l.agent_grad_norms,
        trim_micro_batches=cfg.train.release_memory,
        rollout_correction=correction_mode(cfg, model_name), correction_threshold=l.rollout_correction_threshold,
        correction_lower=l.rollout_correction_lower, correction_veto=l.rollout_correction_veto,
    )


def correction_mode(cfg: Config, model_name: str) -> str:
    """``models.<name>.rollout_correction``, else ``loss.rollout_correction``."""
    own = cfg.models[model_name].rollout_correction
    return cfg.loss.rollout_correction if own is None else own


def _pick(override: float | None, default: float) -> float:
    return default if override is None else override


def _first_set(overrides: list[float | None], default: float) -> float:
    return next((v for v in overrides if v is not None), default)


def _peft() -> Any:
    try:
        import peft
    except ImportError as exc:
        raise ImportError("LoRA adapters (models.<name>.lora.rank > 0) need the peft package: "
                          "pip install 'teamrl[lora]' (or pip install peft), or set lora.rank: 0") from exc
    return peft


def add_adapters(model: CausalLM, lc: LoraConfig, adapters: list[str]) -> CausalLM:
    """Wrap ``model`` in a PEFT model with one LoRA adapter per name; its base weights are frozen."""
    peft = _peft()
    config = peft.LoraConfig(r=lc.rank, lora_alpha=lc.alpha, target_modules=list(lc.targets),
                             lora_dropout=lc.dropout, bias="none", task_type="CAUSAL_LM")
    wrapped = peft.get_peft_model(model, config, adapter_name=adapters[0])
    for name in adapters[1:]:
        wrapped.add_adapter(name, config)
    return wrapped


def adapter_params(model: torch.nn.Module, adapter: str) -> dict[str, torch.nn.Parameter]:
    """The parameters of one LoRA adapter, by name."""
    pattern = re.compile(rf"\.lora_[A-Za-z_]+\.{re.escape(adapter)}(\.|$)")
    params = {n: p for n, p in model.named_parameters() if pattern.search(n)}
    if not params:
        raise ValueError(f"adapter {adapter!r} has no parameters; check models.<name>.lora.targets "
                         f"against the model's module names")
    return params


def param_groups(cfg: Config, name: str, model: torch.nn.Module) -> list[ParamGroup]:
    """One group per adapter on a LoRA model, else one group of all weights; agent lr/weight decay apply."""
    mc = cfg.models[name]
    agents = {a: ac for a, ac in cfg.agents.items() if ac.model == name}
    owners: dict[str | None, list[str]] = {}
    for a, ac in sorted(agents.items()):
        owners.setdefault(ac.adapter, []).append(a)
    groups = []
    for adapter, users in owners.items():  # config validation: an override is set only by a sole user
        lr = _first_set([cfg.agents[a].lr for a in users], mc.optim.lr)
        wd = _first_set([cfg.agents[a].weight_decay for a in users], mc.optim.weight_decay)
        params = (adapter_params(model, adapter) if adapter is not None
                  else {n: p for n, p in model.named_parameters() if p.requires_grad})
        groups.append(ParamGroup(adapter or name, params, lr, wd))
    return groups


def build(cfg: Config) -> Runtime:
    """Load every model some agent uses; return their modules, engines and learners by model name.

    A frozen model (``trainable: false``) gets no learner; a distillation teacher no agent uses gets neither an
    engine nor a learner (``Runtime.teachers``); a model whose engine holds no local
    weights (``openai``) has neither (only its tokenizer is loaded). ``auto`` devices and dtypes are resolved first
    (:func:`teamrl.hardware.resolve_config`; a no-op on a resolved config); each model's engine
    and learner live on its device.
    """
    cfg = hardware.resolve_config(cfg)
    models: dict[str, torch.nn.Module] = {}
    engines: dict[str, Engine] = {}
    learners: dict[str, Learner] = {}
    toks: dict[str, Any] = {}
    for name in sorted({a.model for a in cfg.agents.values()}):
        mc = cfg.models[name]
        if not engine_spec(mc).local_weights:
            toks[name] = load_tokenizer(mc.path)
            engines[name] = build_engine(cfg, name, toks[name])
            continue
        model, tok = load_model(cfg, name)
        models[name], toks[name] = model, tok
        engines[name] = build_engine(cfg, name, tok, model)
        if not mc.trainable:
            model.requires_grad_(False)
            continue
        learners[name] = make_learner(cfg, name, model)
    teachers: dict[str, Any] = {}
    for name in sorted(set(cfg.algo.distill.models()) - set(models)):  # a teacher no agent samples from
        if not engine_spec(cfg.models[name]).local_weights:  # behind a server: its echoed log-probs
            toks[name] = toks.get(name) or load_tokenizer(cfg.models[name].path)
            teachers[name] = engines.get(name) or build_engine(cfg, name, toks[name])
            continue
        model, toks[name] = load_model(cfg, name)
        teachers[name] = model.requires_grad_(False).eval()
    for agent, name in ((a, m) for a, ms in cfg.algo.distill.teacher_models().items() for m in ms):
        student = cfg.agents[agent].model
        if student in toks and toks[student].get_vocab() != toks[name].get_vocab():
            raise ValueError(f"algo.distill.teachers.{agent}: teacher {name!r} ({cfg.models[name].path}) has another "
                             f"tokenizer than the agent's model {student!r}; on-policy distillation scores the agent's "
                             f"token ids, so the teacher must share its tokenizer")
    return Runtime(engines, learners, models, teachers=teachers)


def agent_adapters(cfg: Config, name: str) -> dict[str, str]:
    """The LoRA adapter of each agent on model ``name`` that has one (agent -> adapter)."""
    return {a: ac.adapter for a, ac in cfg.agents.items() if ac.model == name and ac.adapter is not None}


def load_model(cfg: Config, name: str) -> tuple[CausalLM, Any]:
    """Model ``name`` (resolved device and dtype) with its tokenizer, as both backends train and run it:
    gradient checkpointing where asked for on a trained model, one LoRA adapter per agent adapter where
    ``lora.rank > 0``."""
    mc = cfg.models[name]
    model, tok = load_model_and_tokenizer(mc.path, dtype=mc.dtype, device=mc.device)
    if mc.gradient_checkpointing and mc.trainable:
        enable_checkpointing(model, mc.checkpoint_layers)
    if mc.lora.rank > 0:
        model = add_adapters(model, mc.lora, sorted(set(agent_adapters(cfg, name).values())))
    return model, tok


def make_learner(cfg: Config, name: str, model: CausalLM, dp: Any = None) -> TorchLearner:
    """The learner of model ``name`` over ``model`` (the module :func:`load_model` returned); ``dp``: the
    data-parallel group of a Ray learner (None: a single learner)."""
    users = {a: ac for a, ac in cfg.agents.items() if ac.model == name}
    return TorchLearner(name, model, learner_settings(cfg, name), {a: ac.loss_weight for a, ac in users.items()},
                        groups=param_groups(cfg, name, model),
                        agent_adapters=agent_adapters(cfg, name) if cfg.models[name].lora.rank > 0 else None, dp=dp)


def enable_checkpointing(model: CausalLM, fraction: float = 1.0) -> None:
    """Hugging Face gradient checkpointing, non-reentrant (so it needs no input that requires a gradient
    and works under a frozen LoRA base), of every decoder layer or of ``fraction`` of them, spread evenly
    (:func:`checkpointed_layers`).

    Raises:
        ValueError: the model's class has no gradient checkpointing.
    """
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"models.<name>.gradient_checkpointing: {type(model).__name__} does not support gradient "
                         f"checkpointing; set it to false")
    if hasattr(model, "activation_checkpointing_enable"):  # the name since transformers 5
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if fraction < 1:
        layers = checkpointable_layers(model)
        if not layers:
            raise ValueError(f"models.<name>.checkpoint_layers: {type(model).__name__}'s layers cannot be checkpointed "
                             f"one by one; set it to 1")
        keep = checkpointed_layers(len(layers), fraction)
        for i, layer in enumerate(layers):
            layer.gradient_checkpointing = i in keep
