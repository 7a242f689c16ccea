"""MAD-OPD's divergence loss in the learner's forward (``algo.distill.loss: jsd``; :mod:`teamrl.scoring.distill`).

A distilled reply carries ``Step.teacher_rows``: per teacher, its model's name, the prompt it reads before the reply
(the student's own, or the debate's context) and its weight. In the micro-batch's forward, each teacher runs its own
rows (no gradient) and the LM heads of student and teachers are applied ``chunk`` positions at a time
(:func:`teamrl.algos.distill.generalized_jsd`, recomputed in backward), so no [tokens x vocabulary] logits are kept.
Per reply and teacher the divergence is averaged over the reply's tokens and clamped at 0 (``_chunked_jsd``'s
``(total / num_valid).clamp(min=0)``); the teachers' weighted sum (``compute_mad_distillation_loss``) is averaged over
the update's distilled replies (each sample's loss, then their mean over the optimizer step) and added, times
``coef``, to the RL loss.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.utils.checkpoint

from teamrl.algos.distill import generalized_jsd
from teamrl.team.records import Step

__all__ = ["DistillLoss"]


@dataclass
class DistillLoss:
    """What the learner needs for the divergence term: the teachers' modules and the loss's options."""

    teachers: dict[str, Any]
    """Teacher model name -> its frozen in-process module."""
    coef: float = 1.0
    beta: float = 0.5
    top_k: int = 0
    chunk: int = 0
    """Positions per LM-head chunk (``loss.logits_chunk_tokens``; 0: all at once)."""
    rows: float = 0.0
    """Distilled replies of the optimizer step (the mean's denominator), set by the learner for each step."""

    def term(self, rows: list[Step], *, pack: bool, share: bool):
        """The per-position divergences' callable for the student's forward over ``rows`` ([M, K] for K teachers),
        with the teachers' hidden states computed now; None when no row is distilled."""
        if not any(r.teacher_rows for r in rows):
            return None
        names = [t["model"] for t in next(r.teacher_rows for r in rows if r.teacher_rows)]
        states = []
        for k, name in enumerate(names):
            teacher = self.teachers[name]
            theirs = [replace(r, prompt_ids=list(r.teacher_rows[k]["prompt_ids"])) if r.teacher_rows else r for r in rows]
            states.append((teacher.get_output_embeddings(), teacher_hidden(teacher, theirs, pack=pack, share=share)))
        return _Term(states, self.beta, self.top_k, self.chunk)

    def loss(self, rows: list[Step], mask: torch.Tensor, per_pos: torch.Tensor, acc: Any) -> torch.Tensor:
        """The micro-batch's share of the step's loss; the sum over its reply tokens of the weighted divergence goes
        to ``acc`` (``distill_jsd``, a token-weighted mean). ``per_pos`` [M, K], in row then token order."""
        K = per_pos.shape[1]
        dense = torch.zeros((*mask.shape, K), dtype=per_pos.dtype, device=per_pos.device)
        dense[mask.bool()] = per_pos  # [b, R, K]
        counts = mask.sum(1).clamp(min=1)[:, None]  # [b, 1]
        per_row = (dense.sum(1) / counts).clamp(min=0.0)  # [b, K]: each reply's mean, clamped as the original
        w = torch.tensor([[t["weight"] for t in r.teacher_rows] if r.teacher_rows else [0.0] * K for r in rows],
                         dtype=per_row.dtype, device=per_row.device)  # [b, K], each row's weights summing to 1
        loss = self.coef * (per_row * w).sum() / max(self.rows, 1.0)
        acc._add(rows[0].agent, "distill_jsd", float(((dense.detach() * w[:, None, :]).sum(-1) * mask).sum()))
        return loss


class _Term:
    """``(student head, student hidden [M, H]) -> [M, K]`` divergences to K teachers, chunked and recomputed."""

    def __init__(self, states: list[tuple[Any, torch.Tensor]], beta: float, top_k: int, chunk: int) -> None:
        self.states, self.beta, self.top_k, self.chunk = states, beta, top_k, chunk

    def _part(self, head, hidden: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        s = head(hidden).float()
        cols = []
        for t_head, t_hidden in self.states:
            with torch.no_grad():
                t = t_head(t_hidden[lo:hi]).float()
            cols.append(generalized_jsd(s, t, beta=self.beta, top_k=self.top_k))
        return torch.stack(cols, dim=-1)

    def __call__(self, head, hidden: torch.Tensor) -> torch.Tensor:
        n = hidden.shape[0]
        for _, t_hidden in self.states:
            if t_hidden.shape[0] != n:
                raise ValueError(f"a teacher scored {t_hidden.shape[0]} reply positions, the student {n}")
        step = self.chunk if 0 < self.chunk < n else n
        parts = []
        for lo in range(0, n, step):
            hi = min(lo + step, n)
            if torch.is_grad_enabled() and step < n:
                parts.append(torch.utils.checkpoint.checkpoint(self._part, head, hidden[lo:hi], lo, hi,
                                                               use_reentrant=False))
            else:
                parts.append(self._part(head, hidden[lo:hi], lo, hi))
        return torch.cat(parts)


def teacher_hidden(teacher: Any, rows: list[Step], *, pack: bool, share: bool) -> torch.Tensor:
    """A frozen model's last hidden states [M, H] at the positions that predict each row's reply tokens (row then
    token order: the student's), no gradient."""
    from teamrl.learner.scoring import layout

    device = next(teacher.parameters()).device
    ids, attn, extra, (row_idx, pos_idx), _ = layout(rows, pack=pack, share=share, device=device)
    with torch.no_grad():
        hidden = teacher.get_decoder()(input_ids=ids.to(device), attention_mask=attn.to(device), use_cache=False,
                                       **extra).last_hidden_state
        return hidden[row_idx, pos_idx]
