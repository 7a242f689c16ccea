"""Policy-gradient loss pieces: clipped surrogates, KL estimators and loss aggregation (the token
log-probabilities and entropies they take are computed in :mod:`teamrl.algos.logprobs`, re-exported here).

Shape legend: B sequences (rows), T tokens, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor

from teamrl.algos.logprobs import chunked_logprobs, entropy_from_logits, token_logprobs

__all__ = [
    "AGG_MODES",
    "KL_KINDS",
    "aggregate",
    "chunked_logprobs",
    "clipped_surrogate",
    "entropy_from_logits",
    "kl_estimate",
    "token_logprobs",
]

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
KL_KINDS = ("k1", "k2", "k3")
LEVELS = ("token", "sequence")

# Log-ratios are clamped to this range before exp so a stale or broken
# log-probability can never overflow.
_MAX_LOG_RATIO = 20.0


def _check_mask(mask: object, shape: torch.Size) -> Tensor:
    """Return ``mask`` as bool after checking its shape and 0/1 values."""
    if not isinstance(mask, Tensor):
        raise ValueError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.shape != shape:
        raise ValueError(
            f"mask has shape {list(mask.shape)} but values have {list(shape)}; "
            "give one 0/1 flag per token"
        )
    if mask.dtype == torch.bool:
        return mask
    if bool(((mask != 0) & (mask != 1)).any()):
        raise ValueError("mask must hold only 0 and 1 (or be bool); binarize it with mask > 0")
    return mask != 0


def _check_same_shape(names: tuple[str, ...], *tensors: Tensor, dim: int | None = None) -> None:
    """Raise ValueError unless all tensors share one shape (of ``dim`` dims if given)."""
    for name, t in zip(names, tensors):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    first = tensors[0].shape
    if dim is not None and len(first) != dim:
        raise ValueError(f"{names[0]} must have {dim} dims, got shape {list(first)}")
    for name, t in zip(names[1:], tensors[1:]):
        if t.shape != first:
            raise ValueError(
                f"{name} has shape {list(t.shape)} but {names[0]} has {list(first)}; "
                "they must match"
            )


def _check_denominator(name: str, value: float | None) -> None:
    """Raise ValueError unless ``value`` is None or a finite positive number."""
    if value is not None and not 0.0 < float(value) < float("inf"):
        raise ValueError(
            f"{name} must be a positive count, got {value}; pass the whole batch's count "
            "or leave it None"
        )


def aggregate(
    values: Tensor,
    mask: Tensor,
    mode: str,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> Tensor:
    """Reduce per-token values to a scalar loss.

    ``token-mean``: sum(values * mask) / num_tokens (default mask.sum(), at
    least 1). ``seq-mean-token-sum``: sum over rows of the row's masked token
    sum / num_seqs (default B). ``seq-mean-token-mean``: sum over rows of
    (row sum / row token count; 0 for an empty row) / num_seqs (default B).
    Passing the full batch's ``num_tokens`` / ``num_seqs`` when reducing a
    micro-batch makes the micro-batch losses sum to the full-batch loss.

    Args:
        values: [B, T] per-token values (e.g. from ``clipped_surrogate``).
        mask: [B, T] bool or 0/1; masked-out values are ignored (even if NaN).
        mode: one of ``AGG_MODES``.
        num_tokens: global token count for ``token-mean``, > 0.
        num_seqs: global sequence count for the ``seq-mean-*`` modes, > 0.

    Returns:
        Scalar tensor.

    Raises:
        ValueError: unknown mode, shape mismatch, non-binary mask, or a
            non-positive denominator.

    >>> v = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    >>> m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    >>> [round(aggregate(v, m, mode).item(), 4) for mode in AGG_MODES]
    [2.3333, 3.5, 2.75]
    """
    if mode not in AGG_MODES:
        raise ValueError(f"mode={mode!r} is not valid: choose one of {list(AGG_MODES)}")
    _check_same_shape(("values",), values, dim=2)
    keep = _check_mask(mask, values.shape)
    _check_denominator("num_tokens", num_tokens)
    _check_denominator("num_seqs", num_seqs)
    masked = torch.where(keep, values, torch.zeros((), dtype=values.dtype, device=values.device))
    if mode == "token-mean":
        denom = num_tokens if num_tokens is not None else keep.sum().clamp_min(1)
        return masked.sum() / denom
    row_sums = masked.sum(dim=1)  # [B]
    if mode == "seq-mean-token-mean":
        row_sums = row_sums / keep.sum(dim=1).clamp_min(1)  # [B]
    denom = num_seqs if num_seqs is not None else values.shape[0]
    return row_sums.sum() / denom


def _ratios(
    logprobs: Tensor, old_logprobs: Tensor, keep: Tensor, level: str
) -> tuple[Tensor, Tensor | None]:
    """Per-token ratio [B, T] used by the surrogate, and the sequence ratio [B] for GSPO."""
    log_ratio = (logprobs - old_logprobs.detach()).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    if level == "token":
        return torch.exp(log_ratio), None  # [B, T]
    counts = keep.sum(dim=1).clamp_min(1)  # [B]
    seq_log_ratio = (log_ratio * keep).sum(dim=1) / counts  # [B]
    seq_ratio = torch.exp(seq_log_ratio)  # [B]
    token_ratio = seq_ratio.detach()[:, None] * torch.exp(logprobs - logprobs.detach())
    return token_ratio, seq_ratio.detach()  # [B, T], [B]


def clipped_surrogate(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    level: str = "token",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token PPO clipped surrogate loss (https://arxiv.org/abs/1707.06347).

    loss = -min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A). With
    ``dual_clip`` c (https://arxiv.org/abs/1912.09729), tokens with A < 0
    get loss = min(loss, -c * A). ``level="token"``: r = exp(logp - old) per
    token. ``level="sequence"`` (GSPO, https://arxiv.org/abs/2507.18071):
    s = exp(mean of the row's masked (logp - old)); each token uses
    r = sg(s) * exp(logp - sg(logp)), whose value is s and whose gradient is
    s * grad(logp); clipping therefore acts on s. Log-ratios are clamped to
    [-20, 20] before exp.

    Args:
        logprobs: [B, T] current-policy token log-probs (with grad).
        old_logprobs: [B, T] behaviour-policy token log-probs (no grad).
        advantages: [B] one advantage per sequence, broadcast over tokens, or [B, T] one per token
            (``level="token"`` only; on-policy distillation's per-token terms).
        mask: [B, T] bool or 0/1, True on response tokens.
        clip_low: lower clip epsilon, in [0, 1).
        clip_high: upper clip epsilon, >= 0.
        dual_clip: bound c > 1 for negative advantages, or None.
        level: ``"token"`` or ``"sequence"``.

    Returns:
        (loss [B, T], zero where mask is 0, not aggregated; stats) where stats
        holds detached ``ratio`` [B, T], ``clipped`` [B, T] bool (the clipped
        PPO branch was selected), ``dual_clipped`` [B, T] bool (the dual-clip
        bound was selected) and, for ``level="sequence"``, ``seq_ratio`` [B].

    Raises:
        ValueError: shape mismatch, bad mask, bad clip values or unknown level.

    >>> lp = torch.log(torch.tensor([[1.5, 1.0]])); old = torch.zeros(1, 2)
    >>> loss, stats = clipped_surrogate(lp, old, torch.tensor([1.0]), torch.ones(1, 2))
    >>> loss, stats["clipped"]
    (tensor([[-1.2000, -1.0000]]), tensor([[ True, False]]))
    """
    _check_surrogate_args(logprobs, old_logprobs, advantages, clip_low, clip_high, dual_clip, level)
    keep = _check_mask(mask, logprobs.shape)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    logprobs = torch.where(keep, logprobs, zero)  # [B, T], padding may hold -inf
    old_logprobs = torch.where(keep, old_logprobs, zero)  # [B, T]
    ratio, seq_ratio = _ratios(logprobs, old_logprobs, keep, level)  # [B, T]
    adv = advantages.detach().to(ratio.dtype)
    adv = adv[:, None] if adv.dim() == 1 else adv  # [B, 1] or [B, T]
    surr = ratio * adv  # [B, T]
    surr_clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv  # [B, T]
    loss = -torch.minimum(surr, surr_clipped)  # [B, T]
    clipped = (surr_clipped < surr) & keep
    dual_clipped = torch.zeros_like(keep)
    if dual_clip is not None:
        bound = -dual_clip * adv  # [B, 1]
        dual_clipped = (adv < 0) & (loss > bound) & keep
        loss = torch.where(adv < 0, torch.minimum(loss, bound), loss)
    stats = {"ratio": ratio.detach(), "clipped": clipped, "dual_clipped": dual_clipped}
    if seq_ratio is not None:
        stats["seq_ratio"] = seq_ratio
    return torch.where(keep, loss, zero), stats


def _check_surrogate_args(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
    level: str,
) -> None:
    """Validate the inputs of ``clipped_surrogate``."""
    _check_same_shape(("logprobs", "old_logprobs"), logprobs, old_logprobs, dim=2)
    per_token = isinstance(advantages, Tensor) and advantages.shape == logprobs.shape and level == "token"
    if not per_token and (not isinstance(advantages, Tensor) or advantages.shape != logprobs.shape[:1]):
        got = list(advantages.shape) if isinstance(advantages, Tensor) else type(advantages).__name__
        raise ValueError(
            f"advantages must have shape [B]={list(logprobs.shape[:1])} (or [B, T] at level token), got {got}; "
            "give one advantage per sequence"
        )
    if level not in LEVELS:
        raise ValueError(f"level={level!r} is not valid: choose one of {list(LEVELS)}")
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low}; a typical value is 0.2")
    if not 0.0 <= clip_high < float("inf"):
        raise ValueError(f"clip_high must be finite and >= 0, got {clip_high}; e.g. 0.2 or 0.28")
    if dual_clip is not None and not 1.0 < dual_clip < float("inf"):
        raise ValueError(f"dual_clip must be > 1 (e.g. 3.0) or None, got {dual_clip}")


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, *, kind: str = "k3") -> Tensor:
    """Per-token estimate of KL(policy || reference) from sampled-token log-probs.

    Estimators from http://joschu.net/blog/kl-approx.html, with d = ref - logp:
    ``k1`` = -d; ``k2`` = d**2 / 2; ``k3`` = exp(d) - d - 1 (>= 0, d clamped
    to [-20, 20] before exp).

    Args:
        logprobs: [B, T] policy log-probs of the sampled tokens.
        ref_logprobs: [B, T] reference-model log-probs of the same tokens.
        kind: one of ``KL_KINDS``.

    Returns:
        [B, T] per-token estimate (mask and aggregate it with ``aggregate``).

    Raises:
        ValueError: unknown kind or shape mismatch.

    >>> lp = torch.log(torch.tensor([0.5])); ref = torch.log(torch.tensor([0.25]))
    >>> [round(kl_estimate(lp, ref, kind=k).item(), 4) for k in KL_KINDS]
    [0.6931, 0.2402, 0.1931]
    """
    if kind not in KL_KINDS:
        raise ValueError(f"kind={kind!r} is not valid: choose one of {list(KL_KINDS)}")
    _check_same_shape(("logprobs", "ref_logprobs"), logprobs, ref_logprobs)
    diff = ref_logprobs - logprobs
    if kind == "k1":
        return -diff
    if kind == "k2":
        return 0.5 * diff**2
    diff = diff.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return (torch.expm1(diff) - diff).clamp_min(0.0)
