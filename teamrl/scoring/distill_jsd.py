"""MAD-OPD's distillation from a team of teachers (``algo.distill.loss: jsd``; arXiv 2605.01347, chiefovoavicii/MAD-OPD
at 6c7a66a): the stage that gives each distilled reply its teachers' contexts and weights.

After selection, every trained reply of a distilled agent gets ``Step.teacher_rows``: per teacher (an in-process
frozen model), the prompt it reads before the reply and its weight. The learner adds ``coef`` times the weighted
divergence of :func:`teamrl.algos.distill.generalized_jsd` to its loss
(:mod:`teamrl.learner.distill_term`); the RL advantage is scaled by ``rl_weight``.

* Without a debate (``debate_rounds: 0``; one teacher is MAD-OPD's ``opd``, several its ``mt_opd``): each teacher
  reads the student's own prompt; the weights are ``weights`` normalised (equal when empty).
* With one (``debate_rounds: R``, two teachers; ``mad_opd``): :func:`teamrl.scoring.debate.debate` per reply, the
  weights from the confidences, each teacher reading its debate context as a user turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from teamrl.scoring import debate as debates
from teamrl.scoring.stages import Context, Stage, register_stage
from teamrl.team.records import Step

if TYPE_CHECKING:
    from teamrl.team.registry import Capabilities, WorkflowSpec

__all__ = ["JSD_CHUNK", "DistillJSD", "distill_learners"]

JSD_CHUNK = 256
"""Most reply positions of one chunk of the divergence (MAD-OPD's ``chunk_size`` 256): the student's and each
teacher's [positions x vocabulary] logits and their log-softmaxes exist for one chunk at a time (a smaller
``loss.logits_chunk_tokens`` is kept)."""


@register_stage
@dataclass
class DistillJSD(Stage):
    """``algo.distill.loss: jsd``: the teachers' contexts and weights of each distilled reply."""

    kind: ClassVar[str] = "advantage_terms"
    name: ClassVar[str] = "distill_jsd"

    teachers: dict[str, list[tuple[str, Any]]]
    """agent -> its teachers, (model name, in-process module) each."""
    options: Any
    """``cfg.algo.distill``."""
    tokenizers: dict[str, Any]
    """agent -> its model's tokenizer (the debate's prompts and contexts)."""
    bf16: bool = False
    """The debate generates under bf16 autocast (the learners' ``loss`` autocast)."""

    @classmethod
    def active(cls, algo: Any) -> bool:
        return bool(algo.distill.teachers) and algo.distill.loss == "jsd"

    @classmethod
    def build(cls, algo: Any, ctx: Context) -> DistillJSD:
        o, modules = algo.distill, ctx.modules or {}
        missing = sorted(m for m in o.models() if not isinstance(modules.get(m), torch.nn.Module))
        if missing:
            raise ValueError(f"algo.distill.loss jsd: teacher model(s) {', '.join(missing)} are not loaded in this "
                             f"process; the divergence needs each teacher's whole distribution (backend: local, "
                             f"not engine: openai)")
        toks: dict[str, Any] = {}
        if o.debate_rounds > 0:
            if ctx.rollout is None:
                raise ValueError("algo.distill.debate_rounds: the debate needs the run's tokenizers (a rollout)")
            toks = {a: ctx.rollout.dispatcher.tokenizer(ctx.rollout.bindings[a].model) for a in o.teachers}
        return cls({a: [(m, modules[m]) for m in ms] for a, ms in o.teacher_models().items()}, o, toks, ctx.pack[2])

    @classmethod
    def errors(cls, algo: Any, caps: Capabilities, spec: WorkflowSpec | None) -> list[str]:
        o, errors = algo.distill, list[str]()
        if o.loss != "jsd" or not o.teachers:
            return errors
        if o.discount != 0:
            errors.append(f"algo.distill.discount {o.discount} applies to loss: reverse_kl; the divergence of loss jsd "
                          f"is per token, remove it")
        if not 0 <= o.beta <= 1 or o.top_k < 0:
            errors.append(f"algo.distill: beta {o.beta} must be in [0, 1] and top_k {o.top_k} >= 0")
        for agent, ms in o.teacher_models().items():
            key = f"algo.distill.teachers.{agent}"
            if len(set(ms)) != len(ms) or not ms:
                errors.append(f"{key}: {ms} must name one or more different teacher models")
            if o.weights and len(o.weights) != len(ms):
                errors.append(f"algo.distill.weights: {len(o.weights)} weights for the {len(ms)} teachers of {agent}")
            if o.debate_rounds > 0 and len(ms) != 2:
                errors.append(f"{key}: the debate (algo.distill.debate_rounds {o.debate_rounds}) is between two "
                              f"teachers, as in MAD-OPD; give two models, or set debate_rounds: 0")
        if o.weights and (min(o.weights) < 0 or not sum(o.weights) > 0):
            errors.append(f"algo.distill.weights {o.weights} must be >= 0 with a positive sum")
        default = type(o)()
        unused = [k for k in ("debate_mode", "debate_max_tokens", "debate_temperature", "debate_top_p", "debate_top_k")
                  if getattr(o, k) != getattr(default, k)]
        if unused and o.debate_rounds == 0:
            errors.append(f"algo.distill.{unused[0]} applies to the debate; set algo.distill.debate_rounds >= 1 or "
                          f"remove {', '.join('algo.distill.' + k for k in unused)}")
        if o.weights and o.debate_rounds > 0:
            errors.append("algo.distill.weights: with a debate the weights come from the teachers' confidences "
                          "(MAD-OPD ignores its fixed weights there); remove weights or set debate_rounds: 0")
        if o.debate_rounds < 0 or o.debate_max_tokens < 1 or not o.debate_temperature > 0 \
                or not 0 < o.debate_top_p <= 1 or o.debate_top_k < 0:
            errors.append(f"algo.distill: debate_rounds {o.debate_rounds} must be >= 0, debate_max_tokens "
                          f"{o.debate_max_tokens} >= 1, debate_temperature {o.debate_temperature} > 0, debate_top_p "
                          f"{o.debate_top_p} in (0, 1] and debate_top_k {o.debate_top_k} >= 0")
        return errors

    @classmethod
    def config_errors(cls, cfg: Any) -> list[str]:
        """Teachers behind a server (their whole distribution is not served)."""
        o = cfg.algo.distill
        if o.loss != "jsd":
            return []
        return [f"algo.distill.loss jsd: teacher {m!r} is served (engine: openai); the divergence needs its whole "
                f"next-token distribution, so load it in process (engine: hf)"
                for m in o.models() if m in cfg.models and cfg.models[m].engine == "openai"]

    def apply(self, steps: list[Step]) -> dict[str, float]:
        """Set ``teacher_rows`` of the distilled agents' replies among ``steps`` (and scale their advantages);
        returns per agent ``distill/<agent>/weight/<teacher>`` (the mean weight), and with a debate
        ``distill/<agent>/confidence_found`` (the share of replies both teachers tagged) and
        ``distill/<agent>/debate_tokens`` (written per reply)."""
        o, metrics = self.options, dict[str, float]()
        for agent, teachers in self.teachers.items():
            rows = [s for s in steps if s.agent == agent and s.response_ids]
            if not rows:
                continue
            names = [m for m, _ in teachers]
            if o.debate_rounds > 0:
                tok = self.tokenizers[agent]
                prompts = [tok.decode(s.prompt_ids, skip_special_tokens=True).strip() for s in rows]
                sampling = debates.Sampling(o.debate_max_tokens, o.debate_temperature, o.debate_top_p, o.debate_top_k,
                                            self.bf16)
                found = debates.debate((teachers[0][1], teachers[1][1]), tok, prompts, sampling,
                                       rounds=o.debate_rounds, mode=o.debate_mode)
                for s, d in zip(rows, found):
                    s.teacher_rows = [{"model": m, "prompt_ids": debates.user_turn_ids(tok, c), "weight": w}
                                      for m, c, w in zip(names, d.contexts, d.weights)]
                metrics[f"distill/{agent}/confidence_found"] = sum(min(d.confidences) >= 0 for d in found) / len(rows)
                metrics[f"distill/{agent}/debate_tokens"] = sum(d.tokens for d in found) / len(rows)
            else:
                raw = list(o.weights) or [1.0] * len(names)
                weights = [w / sum(raw) for w in raw]
                for s in rows:
                    s.teacher_rows = [{"model": m, "prompt_ids": list(s.prompt_ids), "weight": w}
                                      for m, w in zip(names, weights)]
            for s in rows:
                s.advantage *= o.rl_weight
            for k, m in enumerate(names):
                metrics[f"distill/{agent}/weight/{m}"] = sum((s.teacher_rows or [])[k]["weight"] for s in rows) / len(rows)
        return metrics


def distill_learners(learners: dict[str, Any], modules: dict[str, Any], cfg: Any) -> None:
    """Give each in-process learner the divergence term (:class:`teamrl.learner.distill_term.DistillLoss`) with the
    teachers' modules and ``cfg.algo.distill``'s options."""
    from teamrl.learner.distill_term import DistillLoss

    o = cfg.algo.distill
    teachers = {m: modules[m] for m in o.models() if isinstance(modules.get(m), torch.nn.Module)}
    if cfg.loss.pack_rows:  # the teachers' rows are laid out as the learner's
        from teamrl.learner.packing import use_packed_attention

        for teacher in teachers.values():
            use_packed_attention(teacher)
    for learner in learners.values():
        if hasattr(learner, "distill"):
            learner.distill = DistillLoss(teachers, coef=o.coef, beta=o.beta, top_k=o.top_k,
                                          chunk=min(cfg.loss.logits_chunk_tokens or JSD_CHUNK, JSD_CHUNK))
