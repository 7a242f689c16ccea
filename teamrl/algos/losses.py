"""Policy-gradient loss pieces: clipped surrogates, KL estimators, entropy,
token log-probabilities and loss aggregation.

Shape legend: B sequences (rows), T tokens, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.utils.checkpoint
from torch import Tensor

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
        advantages: [B] one advantage per sequence, broadcast over tokens.
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
    adv = advantages.detach().to(ratio.dtype)[:, None]  # [B, 1]
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
    if not isinstance(advantages, Tensor) or advantages.shape != logprobs.shape[:1]:
        got = list(advantages.shape) if isinstance(advantages, Tensor) else type(advantages).__name__
        raise ValueError(
            f"advantages must have shape [B]={list(logprobs.shape[:1])}, got {got}; "
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


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) over the last dim, H = logsumexp(l) - sum(p * l).

    Entries equal to -inf (banned tokens) contribute 0.

    Args:
        logits: [..., V] unnormalized log-probabilities.

    Returns:
        [...] entropy in nats.

    Raises:
        ValueError: ``logits`` is not a tensor with at least one dim.

    >>> entropy_from_logits(torch.zeros(2, 4))  # uniform over 4: log 4
    tensor([1.3863, 1.3863])
    """
    if not isinstance(logits, Tensor) or logits.dim() == 0:
        raise ValueError("logits must be a tensor of shape [..., V] with at least one dim")
    finite = torch.where(torch.isneginf(logits), 0.0, logits)  # [..., V]
    probs = torch.softmax(logits, dim=-1)  # [..., V]
    return torch.logsumexp(logits, dim=-1) - (probs * finite).sum(dim=-1)


def _temperature_view(temperature: float | Tensor, logits: Tensor) -> float | Tensor:
    """Validate ``temperature`` and shape it to broadcast over ``logits`` [B, ..., V]."""
    if isinstance(temperature, Tensor):
        if temperature.dim() == 0:
            temperature = temperature.reshape(1)
        if temperature.dim() != 1 or temperature.numel() not in (1, logits.shape[0]):
            raise ValueError(
                f"temperature tensor must be a scalar or [B]={logits.shape[0]}, "
                f"got shape {list(temperature.shape)}"
            )
        if not bool((temperature > 0).all() & torch.isfinite(temperature).all()):
            raise ValueError(f"temperature must be finite and > 0, got {temperature.tolist()}")
        view = [temperature.numel()] + [1] * (logits.dim() - 1)
        return temperature.to(logits.dtype).reshape(view)
    if not 0.0 < float(temperature) < float("inf"):
        raise ValueError(f"temperature must be finite and > 0, got {temperature}; 1.0 is none")
    return float(temperature)


def token_logprobs(logits: Tensor, tokens: Tensor, *, temperature: float | Tensor = 1.0) -> Tensor:
    """Log-probability of each token under softmax(logits / temperature).

    Computed as the gathered logit minus logsumexp, without materialising a
    full log-softmax tensor.

    Args:
        logits: [B, T, V] model logits.
        tokens: [B, T] integer token ids in [0, V).
        temperature: float, or [B] tensor (one temperature per row), > 0.

    Returns:
        [B, T] log-probs, differentiable w.r.t. ``logits``.

    Raises:
        ValueError: shape mismatch, non-integer or out-of-range tokens, or a
            non-positive temperature.

    >>> token_logprobs(torch.zeros(1, 2, 4), torch.tensor([[0, 3]]))  # log(1/4)
    tensor([[-1.3863, -1.3863]])
    """
    if not isinstance(logits, Tensor) or not isinstance(tokens, Tensor):
        raise ValueError("logits and tokens must be torch.Tensors")
    if logits.dim() != tokens.dim() + 1 or logits.shape[:-1] != tokens.shape:
        raise ValueError(
            f"logits {list(logits.shape)} must be tokens {list(tokens.shape)} plus a vocab dim"
        )
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ValueError(f"tokens must hold integers, got {tokens.dtype}; convert with .long()")
    vocab = logits.shape[-1]
    if tokens.numel() and bool(((tokens < 0) | (tokens >= vocab)).any()):
        raise ValueError(
            f"token ids must be in [0, {vocab}), got min {int(tokens.min())} max {int(tokens.max())}"
        )
    temp = _temperature_view(temperature, logits)
    scaled = logits if isinstance(temp, float) and temp == 1.0 else logits / temp  # [B, T, V]
    picked = scaled.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)  # [B, T]
    return picked - torch.logsumexp(scaled, dim=-1)


def _head_logprobs(head: Callable[[Tensor], Tensor], hidden: Tensor, tokens: Tensor, temperature: Tensor,
                   entropy_grad: bool) -> tuple[Tensor, Tensor]:
    """Log-probs [N] and entropies [N] of ``tokens`` [N] from hidden states [N, H] (logits in fp32)."""
    logits = head(hidden).float()  # [N, V]
    logp = token_logprobs(logits[:, None, :], tokens[:, None], temperature=temperature)[:, 0]  # [N]
    if entropy_grad:
        return logp, entropy_from_logits(logits)
    with torch.no_grad():
        return logp, entropy_from_logits(logits.detach())


def chunked_logprobs(
    head: Callable[[Tensor], Tensor],
    hidden: Tensor,
    tokens: Tensor,
    temperature: Tensor,
    *,
    chunk: int = 0,
    entropy_grad: bool = False,
) -> tuple[Tensor, Tensor]:
    """Token log-probs and entropies from hidden states, never holding more than ``chunk`` rows of logits.

    Each chunk runs ``head`` (the LM head), the fp32 log-softmax of the sampled token and the
    entropy. With autograd on, each chunk is recomputed in backward (non-reentrant activation
    checkpointing) instead of keeping its ``[chunk, V]`` logits, so the full ``[N, V]`` logits
    never exist, in forward or backward. With ``N <= chunk`` (or ``chunk == 0``) the whole batch
    is one chunk and nothing is recomputed. Values equal the unchunked computation up to the
    row-blocking of the head's matmul (tested to 1e-6 in fp32, gradients too).

    Args:
        head: [n, H] -> [n, V] logits (e.g. ``model.get_output_embeddings()``).
        hidden: [N, H] hidden states of the positions that predict ``tokens``.
        tokens: [N] token ids.
        temperature: [N] sampling temperature of each token (> 0); the entropy is of the untempered logits.
        chunk: rows per chunk (0: one chunk).
        entropy_grad: the entropy carries a gradient (an entropy bonus); else it is detached.

    Returns:
        (log-probs [N] with grad, entropies [N]).

    Raises:
        ValueError: a negative ``chunk``, or mismatched lengths.

    >>> head = torch.nn.Linear(2, 4, bias=False); _ = torch.nn.init.zeros_(head.weight)
    >>> logp, ent = chunked_logprobs(head, torch.ones(3, 2), torch.tensor([0, 1, 3]), torch.ones(3), chunk=2)
    >>> logp, ent
    (tensor([-1.3863, -1.3863, -1.3863], grad_fn=<CatBackward0>), tensor([1.3863, 1.3863, 1.3863]))
    """
    if chunk < 0:
        raise ValueError(f"chunk {chunk} must be >= 0 (0: one chunk)")
    if not (hidden.shape[0] == tokens.shape[0] == temperature.shape[0]):
        raise ValueError(f"hidden {list(hidden.shape)}, tokens {list(tokens.shape)} and temperature "
                         f"{list(temperature.shape)} must have the same number of rows")
    n = hidden.shape[0]
    if chunk == 0 or n <= chunk:
        return _head_logprobs(head, hidden, tokens, temperature, entropy_grad)
    recompute = torch.is_grad_enabled()
    logps, ents = [], []
    for i in range(0, n, chunk):
        part = (hidden[i : i + chunk], tokens[i : i + chunk], temperature[i : i + chunk])
        if recompute:
            lp, en = torch.utils.checkpoint.checkpoint(_head_logprobs, head, *part, entropy_grad, use_reentrant=False)
        else:
            lp, en = _head_logprobs(head, *part, entropy_grad)
        logps.append(lp)
        ents.append(en)
    return torch.cat(logps), torch.cat(ents)
