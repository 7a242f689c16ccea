"""Rollout correction: importance weights between the sampler's and the learner's log-probs, and
measures of how far apart the two are.

The sampler (the engine that generated a reply) and the learner (which trains on it) never compute
exactly the same probabilities: another dtype (a bf16 rollout copy), other kernels (vLLM, a
server), or older weights (async buffers). With rho_t = pi_learner(y_t) / pi_sampler(y_t) on the
sampled tokens:

* :func:`correction_weights` gives the weight each token's policy-gradient term is multiplied by
  and which tokens stay in the loss, for the modes of ``MODES`` (token or sequence level x
  truncate (TIS) or mask (MIS); the sequence ratio is the geometric mean of the reply's rho_t,
  as GSPO's). Masked tokens leave the loss's numerator and its denominator.
* :func:`mismatch_sums` / :func:`mismatch_means` measure the gap (KL k1/k3, chi-squared at token
  and sequence level, log-perplexity difference, ratio mean/max, fractions truncated or masked),
  as sums that add over micro-batches and data-parallel workers.

Leaves out: where the learner's log-probs come from and how the weights enter the loss
(``teamrl.learner.learner``); the PPO clip (``teamrl.algos.losses``).

Shape legend: B sequences (rows), T tokens.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["MAX_KEYS", "MODES", "correction_weights", "merge_sums", "mismatch_means", "mismatch_sums", "parse_mode"]

MODES = ("none", "token-tis", "token-mis", "seq-tis", "seq-mis")
"""``none``; ``<level>-<kind>`` with level token or seq (geometric mean over the reply) and kind tis
(weights truncated above at the threshold) or mis (tokens or replies outside [lower, threshold]
masked out)."""

MAX_KEYS = ("ratio_max", "weight_max")
"""Keys of :func:`mismatch_sums` that combine by maximum (the others add)."""

# log-ratios are clamped to this range before exp (verl's safety bound [exp(-20), exp(20)])
_MAX_LOG = 20.0


def parse_mode(mode: str) -> tuple[str, str] | None:
    """``"token-tis"`` -> ("token", "tis"); ``"none"`` -> None.

    Raises:
        ValueError: ``mode`` is not one of ``MODES``.

    >>> parse_mode("seq-mis"), parse_mode("none")
    (('seq', 'mis'), None)
    """
    if mode not in MODES:
        raise ValueError(f"rollout_correction={mode!r} is not valid: choose one of {list(MODES)}")
    if mode == "none":
        return None
    level, kind = mode.split("-")
    return level, kind


def _log_ratios(learner: Tensor, sampler: Tensor, keep: Tensor, level: str) -> Tensor:
    """log rho [B, T] per token, or the row's mean log rho broadcast over its tokens (0 off the mask)."""
    diff = torch.where(keep, learner.double() - sampler.double(), torch.zeros((), dtype=torch.float64,
                                                                             device=learner.device))  # [B, T]
    if level == "seq":
        counts = keep.sum(dim=1).clamp_min(1)  # [B]
        diff = (diff.sum(dim=1) / counts)[:, None].expand_as(diff)  # [B, T]
    return diff.clamp(-_MAX_LOG, _MAX_LOG)


def correction_weights(learner: Tensor, sampler: Tensor, mask: Tensor, mode: str, *, threshold: float = 2.0,
                       lower: float | None = None, veto: float | None = None) -> tuple[Tensor, Tensor]:
    """Importance weights of the sampled tokens and the tokens that stay in the loss.

    rho = exp(learner - sampler) per token (``token-*``) or exp(mean over the reply of
    (learner - sampler)) for every token of the reply (``seq-*``), log clamped to [-20, 20].
    ``*-tis``: weight = min(rho, threshold), every token stays. ``*-mis``: weight = rho where
    lower <= rho <= threshold, else the token (``seq``: the whole reply) is dropped (weight 0).
    ``none``: weight 1 and every token stays. Weights are 0 off the mask. ``veto`` (with a mode): a reply
    with any token whose own rho is below it gets weight 0 on every token, which stay in the loss's
    denominators (OpenRLHF's ``vllm_is_veto_threshold``).

    Args:
        learner: [B, T] the learner's log-probs of the sampled tokens (the proximal policy).
        sampler: [B, T] the sampler's log-probs of the same tokens (the behaviour policy).
        mask: [B, T] bool or 0/1, True on reply tokens.
        mode: one of ``MODES``.
        threshold: upper bound C > 1 (verl's default 2.0).
        lower: lower bound of the ``mis`` range, in (0, 1]; None takes 1 / threshold (as verl).
        veto: in (0, 1), or None for no veto.

    Returns:
        (weights [B, T] float32 without gradient, keep [B, T] bool).

    Raises:
        ValueError: unknown mode, bad bounds or shapes.

    >>> lp = torch.log(torch.tensor([[0.5, 0.9]])); sp = torch.log(torch.tensor([[0.2, 0.3]]))
    >>> w, keep = correction_weights(lp, sp, torch.ones(1, 2), "token-mis")  # rho = 2.5, 3.0 > 2
    >>> w, keep
    (tensor([[0., 0.]]), tensor([[False, False]]))
    >>> sp2 = torch.log(torch.tensor([[0.2, 0.9], [0.25, 0.5]])); lp2 = torch.log(torch.tensor([[0.5, 5e-5], [0.5, 0.5]]))
    >>> correction_weights(lp2, sp2, torch.ones(2, 2), "token-tis", veto=1e-4)[0]  # row 0 has a rho of 5.6e-5
    tensor([[0., 0.],
            [2., 1.]])
    """
    if learner.shape != sampler.shape or learner.shape != mask.shape or learner.dim() != 2:
        raise ValueError(f"learner {list(learner.shape)}, sampler {list(sampler.shape)} and mask "
                         f"{list(mask.shape)} must be the same [B, T] shape")
    lower = _check_bounds(threshold, lower)
    keep = mask.bool()
    parsed = parse_mode(mode)
    if parsed is None:
        return keep.float(), keep
    level, kind = parsed
    rho = torch.exp(_log_ratios(learner.detach(), sampler.detach(), keep, level))  # [B, T] float64
    if kind == "tis":
        weights = rho.clamp(max=threshold)
    else:
        keep = keep & (rho >= lower) & (rho <= threshold)
        weights = rho
    weights = torch.where(keep, weights, torch.zeros((), dtype=weights.dtype, device=weights.device))
    if veto is not None:
        if not 0.0 < veto < 1.0:
            raise ValueError(f"veto {veto} must be in (0, 1)")
        token_log = learner.detach().double() - sampler.detach().double()  # [B, T], not clamped
        vetoed = ((token_log < math.log(veto)) & mask.bool()).any(dim=1, keepdim=True)  # [B, 1]
        weights = weights.masked_fill(vetoed, 0.0)
    return weights.float(), keep


def _check_bounds(threshold: float, lower: float | None) -> float:
    """The lower bound to use; raises ValueError unless 0 < lower <= 1 < threshold < inf."""
    if not 1.0 < float(threshold) < math.inf:
        raise ValueError(f"rollout correction threshold {threshold} must be > 1 (verl's default is 2.0)")
    low = 1.0 / threshold if lower is None else float(lower)
    if not 0.0 < low <= 1.0:
        raise ValueError(f"rollout correction lower bound {lower} must be in (0, 1]; null takes 1/threshold")
    return low


def mismatch_sums(learner: Tensor, sampler: Tensor, mask: Tensor, *, mode: str = "none", threshold: float = 2.0,
                  lower: float | None = None) -> dict[str, float]:
    """Sums over tokens and replies that :func:`mismatch_means` turns into the mismatch metrics.

    With d_t = learner_t - sampler_t (log rho_t) on each kept token: ``tokens``, ``seqs``,
    ``kl_k1`` = sum(-d_t), ``kl_k3`` = sum(exp(d_t) - 1 - d_t) (both estimate KL(sampler || learner)
    from the sampler's own tokens), ``chi2_token`` = sum(rho_t^2), ``chi2_seq`` = sum over replies
    of (prod_t rho_t)^2, ``log_ppl_diff`` = sum over replies of (mean_t(-learner) - mean_t(-sampler)),
    ``ratio`` / ``ratio_max`` = sum / max of rho_t; ``weight`` / ``weight_max`` = sum / max of the
    weights of ``mode``'s level (per token, or per reply for ``seq``; token level when none) before
    truncation; ``truncated`` / ``masked`` = how many of them lie above ``threshold`` / outside
    [lower, threshold] (per token or per reply), whether or not a correction is on. Log-ratios are
    clamped to [-20, 20] before exp; sums are in float64.

    Args:
        learner: [B, T] learner log-probs of the sampled tokens.
        sampler: [B, T] sampler log-probs of the same tokens.
        mask: [B, T] bool or 0/1.
        mode, threshold, lower: as in :func:`correction_weights` (which level the weights are
            counted at, and the bounds).

    Returns:
        A dict of floats (all keys present, zeros for an empty mask).

    >>> s = mismatch_sums(torch.log(torch.tensor([[0.5, 0.5]])), torch.log(torch.tensor([[0.25, 0.5]])),
    ...                   torch.ones(1, 2), threshold=1.5)  # rho = 2, 1
    >>> [round(s[k], 4) for k in ("kl_k1", "kl_k3", "chi2_token", "chi2_seq", "truncated", "masked")]
    [-0.6931, 0.3069, 5.0, 4.0, 1.0, 1.0]
    """
    lower = _check_bounds(threshold, lower)
    keep = mask.bool()
    parsed = parse_mode(mode)
    level = parsed[0] if parsed else "token"
    d = _log_ratios(learner.detach(), sampler.detach(), keep, "token")  # [B, T] float64, 0 off the mask
    rho = torch.exp(d)
    rows = keep.any(dim=1)  # [B] replies with at least one token
    counts = keep.sum(dim=1).clamp_min(1)  # [B]
    seq_log = d.sum(dim=1).clamp(-_MAX_LOG, _MAX_LOG)  # [B] log of the product of the ratios
    zero = torch.zeros((), dtype=torch.float64, device=learner.device)
    ppl = torch.where(keep, sampler.double() - learner.double(), zero).sum(dim=1) / counts  # [B], padding may be -inf
    if level == "seq":
        lvl = torch.exp((d.sum(dim=1) / counts).clamp(-_MAX_LOG, _MAX_LOG))[rows]  # [B'] geometric means
    else:
        lvl = rho[keep]  # [N]
    out = {"tokens": float(keep.sum()), "seqs": float(rows.sum()),
           "kl_k1": float((-d)[keep].sum()), "kl_k3": float((torch.expm1(d) - d)[keep].sum()),
           "chi2_token": float((rho**2)[keep].sum()), "chi2_seq": float(torch.exp(2 * seq_log)[rows].sum()),
           "log_ppl_diff": float(ppl[rows].sum()), "ratio": float(rho[keep].sum()),
           "ratio_max": float(rho[keep].max()) if bool(keep.any()) else 0.0,
           "weight": float(lvl.sum()), "weight_max": float(lvl.max()) if lvl.numel() else 0.0,
           "weight_count": float(lvl.numel()), "truncated": float((lvl > threshold).sum()),
           "masked": float(((lvl > threshold) | (lvl < lower)).sum())}
    return out


def merge_sums(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """Two :func:`mismatch_sums` results combined (sums add, ``MAX_KEYS`` take the maximum).

    >>> merge_sums({"tokens": 2.0, "ratio_max": 1.5}, {"tokens": 3.0, "ratio_max": 1.2})
    {'tokens': 5.0, 'ratio_max': 1.5}
    """
    out = dict(a)
    for k, v in b.items():
        out[k] = max(out.get(k, v), v) if k in MAX_KEYS else out.get(k, 0.0) + v
    return out


def mismatch_means(sums: dict[str, float]) -> dict[str, float]:
    """The mismatch metrics from (merged) :func:`mismatch_sums`.

    ``kl_k1``, ``kl_k3``: mean per token; ``chi2_token`` = mean(rho_t^2) - 1; ``chi2_seq`` =
    mean over replies of (prod rho_t)^2 - 1; ``log_ppl_diff``: mean over replies (learner minus
    sampler); ``ratio_mean``/``ratio_max`` of rho_t; ``weight_mean``/``weight_max`` at the
    correction's level; ``truncated_frac``/``masked_frac``: share of tokens (replies at ``seq``
    level) above the threshold / outside the range; ``tokens``.

    >>> mismatch_means({"tokens": 2.0, "seqs": 1.0, "kl_k1": 1.0, "kl_k3": 0.5, "chi2_token": 5.0, "chi2_seq": 4.0,
    ...                 "log_ppl_diff": 0.5, "ratio": 3.0, "ratio_max": 2.0, "weight": 3.0, "weight_max": 2.0,
    ...                 "weight_count": 2.0, "truncated": 0.0, "masked": 1.0})["chi2_token"]
    1.5
    """
    n, s, w = max(sums["tokens"], 1.0), max(sums["seqs"], 1.0), max(sums["weight_count"], 1.0)
    return {"kl_k1": sums["kl_k1"] / n, "kl_k3": sums["kl_k3"] / n, "chi2_token": sums["chi2_token"] / n - 1.0,
            "chi2_seq": sums["chi2_seq"] / s - 1.0, "log_ppl_diff": sums["log_ppl_diff"] / s,
            "ratio_mean": sums["ratio"] / n, "ratio_max": sums["ratio_max"], "weight_mean": sums["weight"] / w,
            "weight_max": sums["weight_max"], "truncated_frac": sums["truncated"] / w,
            "masked_frac": sums["masked"] / w, "tokens": sums["tokens"]}
