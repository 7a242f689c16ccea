"""The ``training plan`` lines of ``teamrl train --dry-run``: what training will do, before anything loads.

Per model: the learning rate the optimizer will see at 0, 10, 50, 90 and 100% of ``train.steps``
(:mod:`teamrl.algos.schedule`, the first optimizer step of that training step; 100% is the last one), its
schedule's settings, the optimizer steps a training step is planned to take and AdamW's settings. Per agent: its
model, sampling settings, reply cap and chat-template keywords.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from teamrl.algos.schedule import Schedule, curve, warmup_positions
from teamrl.plan import calls_per_episode, optimizer_step_share

if TYPE_CHECKING:
    from teamrl.config.schema import Config


def schedule(cfg: Config, model: str) -> Schedule:
    """The learning-rate schedule ``model``'s learner will run (as :func:`teamrl.runtime.local.learner_settings`)."""
    o = cfg.models[model].optim
    total = o.schedule_steps or cfg.train.steps
    warm = warmup_positions(o.schedule_style, total, steps=o.warmup_steps, ratio=o.warmup_ratio)
    return Schedule(o.schedule, o.schedule_style, max(1, total), float(warm), o.min_lr_ratio)


def optimizer_steps_per_step(cfg: Config, model: str) -> int:
    """Optimizer steps one update of ``model`` is planned to take: ``loss.updates_per_batch``, or the step's rows
    (``batch_size x calls x group_size`` of its largest agent) in runs of ``loss.mini_batch_rows``.

    >>> from teamrl.config.schema import load_config
    >>> optimizer_steps_per_step(load_config(None, ["rollout.batch_size=4", "rollout.group_size=8",
    ...                                             "loss.mini_batch_rows=16"]), "main")  # 4 x 2 calls x 8 rows / 16
    4
    """
    return max(1, math.ceil(1 / optimizer_step_share(cfg, model) - 1e-9))


def _num(x: float) -> str:
    return f"{x:.3g}"


def format_training(cfg: Config) -> str:
    """The ``training plan`` lines (module docstring)."""
    lines = []
    for name, mc in cfg.models.items():
        if not mc.trainable:
            taught = [a for a, ms in cfg.algo.distill.teacher_models().items() if name in ms]
            role = f", the distillation teacher of {', '.join(taught)}" if taught else ""
            lines.append(f"training plan: model {name}: frozen (trainable: false){role}")
            continue
        o, s = mc.optim, schedule(cfg, name)
        rates = ", ".join(f"{int(f * 100)}% {_num(o.lr * x)}" for f, x in curve(s, steps=cfg.train.steps))
        shape = o.schedule + (f" to {_num(o.min_lr_ratio)} x lr" if o.schedule == "cosine" else "")
        warm = f", warm-up {_num(s.warmup)} step(s)" if s.warmup else ""
        per = "per optimizer step" if s.per_optimizer_step else "per training step"
        n = optimizer_steps_per_step(cfg, name)
        how = (f"runs of {cfg.loss.mini_batch_rows} of ~{cfg.rollout.batch_size * calls_per_episode(cfg) * cfg.rollout.group_size} rows"
               if cfg.loss.mini_batch_rows else f"updates_per_batch {cfg.loss.updates_per_batch}")
        when = " per update" if cfg.train.update_mode == "async" else ""
        length = f"{s.total} of {cfg.train.steps}" if o.schedule_steps else f"{cfg.train.steps}"
        lines.append(f"training plan: model {name}: lr {rates} ({shape}{warm}, {o.schedule_style} style, one "
                     f"position {per}, sized in {length} training steps); ~{n} optimizer step(s) per training "
                     f"step{when} ({how}); AdamW betas {list(o.betas)}, weight decay {_num(o.weight_decay)}, grad clip "
                     f"{_num(o.grad_clip)}, {mc.dtype} weights")
    for name, a in cfg.agents.items():
        kwargs = ", ".join(f"{k}: {v}" for k, v in a.chat_template_kwargs.items()) or "none"
        prompt = f"prompts cut to {a.max_prompt_tokens} ({a.truncation})" if a.max_prompt_tokens else "prompts uncut"
        ev_t = a.temperature if cfg.eval.temperature is None else cfg.eval.temperature
        ev_p = a.top_p if cfg.eval.top_p is None else cfg.eval.top_p
        lines.append(f"training plan: agent {name} (model {a.model}): temperature {_num(a.temperature)}, top_p "
                     f"{_num(a.top_p)}, top_k {a.top_k}, max_new_tokens {a.max_new_tokens}, {prompt}; chat template "
                     f"kwargs {kwargs}; evaluation temperature {_num(ev_t)}, top_p {_num(ev_p)}")
    return "\n".join(lines)
