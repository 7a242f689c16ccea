"""On-policy distillation per role: a teacher model per agent, its per-token reverse KL added to the advantage.

``algo.distill.teachers`` maps agents to frozen models (``trainable: false``; docs/distillation.md): loaded in this
process, or served by an OpenAI-compatible server (``engine: openai``) that echoes prompt log-probs. After
selection, each distilled agent's trained steps are scored by its teacher (its log-probs of the tokens the agent
sampled, at temperature 1, no gradient) and get the per-token advantage of
:func:`teamrl.algos.distill.reverse_kl_advantages` (tinker-cookbook's on-policy distillation): ``step.advantage``
is scaled by ``rl_weight`` and ``step.token_advantages`` holds ``-coef * d_t``. The teacher sees the student's
own prompt and reply token ids, so both must share a tokenizer (checked when the teacher is loaded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from teamrl.algos.distill import reverse_kl_advantages
from teamrl.scoring.stages import Context, Stage, register_stage
from teamrl.suggest import did_you_mean
from teamrl.team.records import Step

if TYPE_CHECKING:
    from teamrl.team.registry import Capabilities, WorkflowSpec

__all__ = ["JSD_KEYS", "Distill"]

JSD_KEYS = ("beta", "top_k", "weights", "debate_rounds", "debate_mode", "debate_max_tokens", "debate_temperature",
            "debate_top_p", "debate_top_k")
"""The options of ``algo.distill.loss: jsd`` (:mod:`teamrl.scoring.distill_jsd`)."""


@register_stage
@dataclass
class Distill(Stage):
    """``algo.distill.teachers``: per-token reverse-KL advantages towards each distilled agent's teacher."""

    kind: ClassVar[str] = "advantage_terms"
    name: ClassVar[str] = "distill"

    teachers: dict[str, Any]
    """agent -> the teacher: its in-process module, or an engine with ``score_tokens`` (``engine: openai``: the
    server's log-probs of the echoed tokens, :meth:`teamrl.engines.openai.OpenAIEngine.score_tokens`)."""
    coef: float = 1.0
    discount: float = 0.0
    rl_weight: float = 1.0
    logits_chunk: int = 0
    row_tokens: int = 4096
    """Prompt and reply tokens of the rows one teacher forward takes at most (``loss.micro_batch_tokens``)."""
    pack: tuple[bool, bool, bool] = (False, False, False)
    """Rows packed without padding, their common prefixes computed once, bf16 autocast: as the learner scores."""

    def __post_init__(self) -> None:
        if self.pack[0]:
            from teamrl.learner.packing import use_packed_attention

            for teacher in self.teachers.values():
                if isinstance(teacher, torch.nn.Module):
                    use_packed_attention(teacher)  # calls without a packed layout compute what sdpa computes

    @classmethod
    def active(cls, algo: Any) -> bool:
        return bool(algo.distill.teachers) and algo.distill.loss == "reverse_kl"

    @classmethod
    def build(cls, algo: Any, ctx: Context) -> Distill:
        o, modules = algo.distill, ctx.modules or {}
        missing = sorted(m for m in o.models() if m not in modules)
        if missing:
            raise ValueError(f"algo.distill.teachers: teacher model(s) {', '.join(missing)} are not loaded in this "
                             f"process (backend: local loads them)")
        return cls({a: modules[ms[0]] for a, ms in o.teacher_models().items()}, o.coef, o.discount, o.rl_weight,
                   ctx.logits_chunk, ctx.row_tokens, ctx.pack)

    @classmethod
    def errors(cls, algo: Any, caps: Capabilities, spec: WorkflowSpec | None) -> list[str]:
        """The options' ranges, and options set with no teacher."""
        o, errors = algo.distill, []
        if not o.teachers and o != type(o)():
            errors.append("algo.distill options apply when algo.distill.teachers maps an agent to a teacher model; "
                          "add algo.distill.teachers.<agent>: <model> or remove them")
        if not o.coef >= 0 or not 0 <= o.discount < 1 or not o.rl_weight >= 0:
            errors.append(f"algo.distill: coef {o.coef} and rl_weight {o.rl_weight} must be >= 0, discount "
                          f"{o.discount} in [0, 1)")
        if o.loss == "reverse_kl":
            several = sorted(a for a, ms in o.teacher_models().items() if len(ms) != 1)
            if several:
                errors.append(f"algo.distill.teachers.{several[0]}: loss reverse_kl distils towards one teacher per "
                              f"agent; give one model, or set algo.distill.loss: jsd for a team of teachers (MAD-OPD)")
            default = type(o)()
            moved = [k for k in JSD_KEYS if getattr(o, k) != getattr(default, k)]
            if moved:
                errors.append(f"algo.distill.{moved[0]} applies to loss: jsd; set algo.distill.loss: jsd or remove "
                              f"{', '.join('algo.distill.' + k for k in moved)}")
        return errors

    @classmethod
    def config_errors(cls, cfg: Any) -> list[str]:
        """Teachers that are not frozen in-process models of the agent's vocabulary, agents that are not there, and
        what the per-token terms need (``loss.level: token``, replies sampled at temperature 1, the local backend)."""
        teachers, errors = cfg.algo.distill.teacher_models(), list[str]()
        if not teachers:
            return errors
        kl = cfg.algo.distill.loss == "reverse_kl"
        if cfg.backend != "local":
            errors.append(f"algo.distill.teachers needs backend: local (the teachers score the replies in this "
                          f"process), got backend: {cfg.backend}")
        if cfg.loss.level != "token" and kl:
            errors.append("algo.distill.teachers adds a term per token; set loss.level: token")
        for agent, model in ((a, m) for a, ms in teachers.items() for m in ms):
            key = f"algo.distill.teachers.{agent}"
            if agent not in cfg.agents:
                errors.append(f"{key}: {agent!r} is not an agent ({', '.join(cfg.agents)})"
                              f"{did_you_mean(agent, cfg.agents)}")
                continue
            if model not in cfg.models:
                errors.append(f"{key}: {model!r} is not in models ({', '.join(cfg.models)}); add it under models, "
                              f"trainable: false{did_you_mean(model, cfg.models)}")
                continue
            mc, ac = cfg.models[model], cfg.agents[agent]
            if model == ac.model:
                errors.append(f"{key}: {model!r} is the agent's own model; the teacher is another model")
            if mc.trainable:
                errors.append(f"{key}: the teacher model {model!r} is trained; set models.{model}.trainable: false")
            if ac.temperature != 1.0 and kl:
                errors.append(f"{key}: agent {agent!r} samples at temperature {ac.temperature}; the reverse KL "
                              f"compares its sampler's log-probs with the teacher's at temperature 1, set "
                              f"agents.{agent}.temperature: 1.0")
        return errors

    def apply(self, steps: list[Step]) -> dict[str, float]:
        """Set the distilled agents' ``token_advantages`` (and scale their ``advantage``) among ``steps`` in place;
        returns ``distill/<agent>/reverse_kl`` (mean ``d`` over the agent's scored tokens), ``distill/<agent>/tokens``
        and ``distill/<agent>/refused`` (replies whose teacher log-probs were not finite numbers: they keep their RL
        advantage alone, the run goes on)."""
        metrics: dict[str, float] = {}
        for agent, teacher in self.teachers.items():
            rows = [s for s in steps if s.agent == agent and s.response_ids]
            if not rows:
                continue
            for s in rows:
                if len(s.logprobs) != len(s.response_ids):
                    raise ValueError(f"agent {agent!r}: a reply has {len(s.logprobs)} sampler log-probs for "
                                     f"{len(s.response_ids)} tokens; distillation needs the sampler's log-probs")
            theirs = self._teacher_logprobs(teacher, rows)
            kept = [i for i, t in enumerate(theirs) if bool(torch.isfinite(t).all())]
            ours = [torch.tensor(rows[i].logprobs, dtype=torch.float64) for i in kept]
            adv, kl = reverse_kl_advantages(ours, [theirs[i] for i in kept], coef=self.coef, discount=self.discount)
            for i, a in zip(kept, adv):
                rows[i].advantage *= self.rl_weight
                rows[i].token_advantages = a.tolist()
            metrics[f"distill/{agent}/reverse_kl"] = kl
            metrics[f"distill/{agent}/tokens"] = float(sum(len(rows[i].response_ids) for i in kept))
            metrics[f"distill/{agent}/refused"] = float(len(rows) - len(kept))
        return metrics

    def _teacher_logprobs(self, teacher: Any, rows: list[Step]) -> list[torch.Tensor]:
        """The teacher's log-probs of each row's reply tokens at temperature 1: from its server (``score_tokens``),
        or from its module in the learner's micro-batches and layout (no gradient)."""
        if not isinstance(teacher, torch.nn.Module):  # behind an OpenAI-compatible server (engine: openai)
            scored = teacher.score_tokens([(s.prompt_ids, s.response_ids) for s in rows])
            return [torch.tensor(v, dtype=torch.float64) for v in scored]
        from teamrl.learner.microbatches import pack_micro_batches, plan_micro_batches
        from teamrl.learner.scoring import response_logprobs

        pack, share, bf16 = self.pack
        seqs = [s.prompt_ids + s.response_ids for s in rows]
        parts = ([mb for mb, _ in plan_micro_batches(seqs, self.row_tokens, share=share)] if pack
                 else pack_micro_batches([len(q) for q in seqs], self.row_tokens))
        device = next(teacher.parameters()).device.type
        out: list[torch.Tensor] = [torch.empty(0)] * len(rows)
        with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            for part in parts:
                logp, _, _ = response_logprobs(teacher, [rows[i] for i in part], chunk=self.logits_chunk,
                                               temperature=1.0, pack=pack, share=share)
                for j, i in enumerate(part):
                    out[i] = logp[j, : len(rows[i].response_ids)].double().cpu()
        return out
