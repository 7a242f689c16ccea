"""On-policy distillation's per-token advantage: the negative reverse KL to a teacher on the tokens the student sampled.

For replies sampled by the student, with ``d_t = log pi_student(y_t) - log pi_teacher(y_t)`` on every response token
(the student's log-probs are the sampler's), tinker-cookbook's on-policy distillation (``incorporate_kl_penalty``,
``tinker_cookbook/distillation/train_on_policy.py:54-107`` at 9dfcc3a) adds to each token's advantage

    a_t = -coef * d_t

and, with ``discount`` > 0, replaces it by the discounted sum over the reply's later tokens
(``sum_{k >= t} discount**(k - t) * a_k``, ``kl_discount_factor``). ``d_t`` is the single-sample estimate of the
reverse KL ``KL(student || teacher)`` at token t; its mean over the batch's tokens is logged (``teacher_kl`` there).
Pure tensor functions; the teacher's log-probs come from :mod:`teamrl.scoring.distill`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["discounted_future_sum", "generalized_jsd", "reverse_kl_advantages"]


def discounted_future_sum(x: Tensor, gamma: float) -> Tensor:
    """``out_t = sum_{k >= t} gamma**(k - t) * x_k`` of a 1-D tensor.

    >>> discounted_future_sum(torch.tensor([1.0, 2.0, 4.0]), 0.5)
    tensor([3., 4., 4.])
    """
    out = torch.empty_like(x)
    running = torch.zeros((), dtype=x.dtype)
    for t in range(x.shape[0] - 1, -1, -1):
        running = x[t] + gamma * running
        out[t] = running
    return out


def reverse_kl_advantages(student: Sequence[Tensor], teacher: Sequence[Tensor], *, coef: float,
                          discount: float = 0.0) -> tuple[list[Tensor], float]:
    """Per-token distillation advantages of replies, and the mean ``d`` over all their tokens (the reverse-KL
    estimate; 0 when there is no token).

    Args:
        student: each reply's sampled tokens' log-probs under the student (the sampler's), [T_i] each.
        teacher: the same tokens' log-probs under the teacher, [T_i] each.
        coef: weight of the term (tinker-cookbook's ``kl_penalty_coef``), >= 0.
        discount: 0 (each token its own term), or a factor in (0, 1) summing the later tokens' terms
            (``kl_discount_factor``).

    >>> adv, kl = reverse_kl_advantages([torch.tensor([-1.0, -2.0])], [torch.tensor([-1.5, -1.0])], coef=1.0)
    >>> adv[0].tolist(), kl  # d = (0.5, -1.0): the token the teacher likes less than the student is pushed down
    ([-0.5, 1.0], -0.25)
    >>> reverse_kl_advantages([torch.tensor([-1.0, -2.0])], [torch.tensor([-1.5, -1.0])], coef=2.0, discount=0.5)[0]
    [tensor([0., 2.], dtype=torch.float64)]
    """
    if len(student) != len(teacher) or any(s.shape != t.shape for s, t in zip(student, teacher)):
        raise ValueError("student and teacher log-probs must have one row per reply, of equal lengths")
    if not coef >= 0 or not 0 <= discount < 1:
        raise ValueError(f"coef {coef} must be >= 0 and discount {discount} in [0, 1)")
    diffs = [s.double() - t.double() for s, t in zip(student, teacher)]
    tokens = sum(d.numel() for d in diffs)
    mean = float(sum(d.sum() for d in diffs) / tokens) if tokens else 0.0
    out = [-coef * d for d in diffs]
    if discount > 0:
        out = [discounted_future_sum(a, discount) for a in out]
    return out, mean


def generalized_jsd(student_logits: Tensor, teacher_logits: Tensor, *, beta: float, top_k: int = 0) -> Tensor:
    """Per-position generalized Jensen-Shannon divergence of softmax(student) and softmax(teacher), [N] from [N, V]
    logits each (MAD-OPD's ``_chunked_jsd`` before its sum, ``mad_opd/trainers/mad_opd_core.py:42-87`` at 6c7a66a).

    ``JSD_beta = beta * KL(T || M) + (1 - beta) * KL(S || M)`` with the mixture ``M = beta * T + (1 - beta) * S``;
    beta 0 is ``KL(T || S)`` and 1 is ``KL(S || T)`` (the original's ``F.kl_div(input, target)`` is
    ``KL(target || input)``). ``top_k`` > 0 keeps the teacher's k largest logits at each position and the student's at
    the same tokens, both renormalised over them (``generalized_jsd_loss_single``'s ``top_k``, :199-206); 0: the whole
    vocabulary. The logits are not divided by a temperature: the original takes one and does not use it. fp32.

    >>> s, t = torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, 10.0]])
    >>> round(float(generalized_jsd(s, t, beta=0.5)), 4)  # S = (1/2, 1/2), T ~ (0, 1), M ~ (1/4, 3/4): (0.2872 + 0.1438) / 2
    0.2155
    >>> float(generalized_jsd(s, s, beta=0.5))
    0.0
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student logits {list(student_logits.shape)} and teacher logits "
                         f"{list(teacher_logits.shape)} must have one shape")
    if not 0 <= beta <= 1:
        raise ValueError(f"beta {beta} must be in [0, 1]")
    s, t = student_logits.float(), teacher_logits.float()
    if 0 < top_k < s.shape[-1]:
        with torch.no_grad():
            idx = torch.topk(t, k=top_k, dim=-1).indices
        s, t = s.gather(-1, idx), t.gather(-1, idx)
    s_log, t_log = torch.log_softmax(s, dim=-1), torch.log_softmax(t, dim=-1)
    if beta == 0:  # KL(T || S)
        return (t_log.exp() * (t_log - s_log)).sum(-1)
    if beta == 1:  # KL(S || T)
        return (s_log.exp() * (s_log - t_log)).sum(-1)
    b = torch.tensor(beta, dtype=torch.float32)
    mix = torch.logsumexp(torch.stack([s_log + torch.log1p(-b), t_log + torch.log(b)]), dim=0)
    kl_t = (t_log.exp() * (t_log - mix)).sum(-1)  # KL(T || M)
    kl_s = (s_log.exp() * (s_log - mix)).sum(-1)  # KL(S || M)
    return b * kl_t + (1 - b) * kl_s
