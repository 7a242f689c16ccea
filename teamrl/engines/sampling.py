"""Per-row sampling from logits: temperature, top-p, top-k and greedy, returning the sampled tokens'
log-probs (used by both decode loops of the ``hf`` engine)."""

from __future__ import annotations

import math

import torch


def sample(logits: torch.Tensor, temps: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
            generator: torch.Generator | None, filters: bool | None = None,
            u: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return (tokens [b], log-probs [b] under softmax(logits/T)), computed in fp32.

    Sampling is inverse-CDF: row b takes the first token whose cumulative probability exceeds
    ``u[b]`` (uniform in [0, 1); drawn from ``generator`` when ``u`` is None). Without top-p /
    top-k rows (``filters`` False, or None and none found) one pass of exp/cumsum gives both the
    sampling distribution and the normaliser of the sampled token's log-prob: no full
    log-softmax, no copies. (``torch.multinomial`` draws an exponential variate for every
    vocabulary entry: ~4x the time on CPU.)
    """
    if u is None:
        u = torch.rand(len(logits), generator=generator)
    if filters is None:
        filters = bool((top_p < 1).any() or (top_k > 0).any())
    if filters:
        return sample_filtered(logits, temps, top_p, top_k, u)
    greedy = temps == 0
    t = torch.where(greedy, torch.ones_like(temps), temps).float()
    scaled = logits.cpu()  # fp32, or bf16 from a bf16 engine: upcast (exactly) by the subtraction below
    scaled = scaled.float() / t[:, None] if bool((t != 1).any()) else scaled  # [b, V]
    m = scaled.amax(dim=-1, keepdim=True).float()  # [b, 1]
    if bool(greedy.all()):
        tok = scaled.argmax(-1)
        lse = m + torch.sub(scaled, m).exp_().sum(-1, keepdim=True).log_()
    else:
        cum = torch.sub(scaled, m).exp_().cumsum_(dim=-1)  # [b, V] unnormalised CDF, fp32
        total = cum[:, -1:]  # [b, 1]
        tok = torch.searchsorted(cum, u.view(-1, 1).to(cum.dtype) * total, right=True)
        tok = tok.clamp_(max=scaled.shape[-1] - 1).view(-1)
        if bool(greedy.any()):
            tok = torch.where(greedy, scaled.argmax(-1), tok)
        lse = m + total.log()
    return tok, (scaled.gather(1, tok.view(-1, 1)).float() - lse).view(-1)


def sample_filtered(logits: torch.Tensor, temps: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
                     u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_sample` with top-k / top-p truncation (the log-prob is still under the untruncated softmax)."""
    greedy = temps == 0
    t = torch.where(greedy, torch.ones_like(temps), temps).float()
    scaled = logits.cpu().float() / t[:, None]  # [b, V]
    logp = torch.log_softmax(scaled, dim=-1)  # [b, V]
    filtered = scaled.clone()
    if bool((top_k > 0).any()):
        V = filtered.shape[-1]
        k = torch.where(top_k > 0, top_k.clamp(max=V), torch.full_like(top_k, V))
        kth = torch.sort(filtered, dim=-1, descending=True).values.gather(1, (k - 1).view(-1, 1))
        filtered = filtered.masked_fill(filtered < kth, -math.inf)
    if bool((top_p < 1).any()):
        sorted_logits, idx = torch.sort(filtered, dim=-1, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop = (cum - torch.softmax(sorted_logits, dim=-1)) >= top_p[:, None]
        sorted_logits = sorted_logits.masked_fill(drop, -math.inf)
        filtered = torch.full_like(filtered, -math.inf).scatter(1, idx, sorted_logits)
    cum = torch.softmax(filtered, dim=-1).cumsum_(dim=-1)  # [b, V]
    sampled = torch.searchsorted(cum, u.view(-1, 1).to(cum.dtype) * cum[:, -1:], right=True)
    sampled = sampled.clamp_(max=filtered.shape[-1] - 1).view(-1)  # [b]
    tok = torch.where(greedy, scaled.argmax(-1), sampled)
    return tok, logp.gather(1, tok.view(-1, 1)).view(-1)


def sample_on_device(logits: torch.Tensor, temps: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
                     u: torch.Tensor, *, use_top_k: bool, use_top_p: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sample` where ``logits`` live (on a GPU: only the tokens and log-probs need to cross to the host),
    with no host synchronisation, so that a CUDA graph can capture it.

    Every argument is a tensor on ``logits``' device except the two flags, which the caller knows on
    the host (whether any row has top-k > 0 / top-p < 1): they select the same computations as
    :func:`sample` and :func:`sample_filtered` (on the CPU the results are identical, tested).
    Returns (tokens [b] int64, log-probs [b] fp32).
    """
    greedy = temps == 0
    t = torch.where(greedy, torch.ones_like(temps), temps).float()
    if not (use_top_k or use_top_p):
        scaled = logits.float() / t[:, None]  # dividing by 1.0 is exact: the same values as sample()
        m = scaled.amax(dim=-1, keepdim=True)
        cum = torch.sub(scaled, m).exp_().cumsum_(dim=-1)
        total = cum[:, -1:]
        tok = torch.searchsorted(cum, u.view(-1, 1).to(cum.dtype) * total, right=True)
        tok = torch.where(greedy, scaled.argmax(-1), tok.clamp_(max=scaled.shape[-1] - 1).view(-1))
        return tok, (scaled.gather(1, tok.view(-1, 1)) - (m + total.log())).view(-1)
    scaled = logits.float() / t[:, None]
    logp = torch.log_softmax(scaled, dim=-1)
    filtered = scaled.clone()
    V = filtered.shape[-1]
    if use_top_k:
        k = torch.where(top_k > 0, top_k.clamp(max=V), torch.full_like(top_k, V))
        kth = torch.sort(filtered, dim=-1, descending=True).values.gather(1, (k - 1).view(-1, 1))
        filtered = filtered.masked_fill(filtered < kth, -math.inf)
    if use_top_p:
        sorted_logits, idx = torch.sort(filtered, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = (probs.cumsum(-1) - probs) >= top_p[:, None]
        sorted_logits = sorted_logits.masked_fill(drop, -math.inf)
        filtered = torch.full_like(filtered, -math.inf).scatter(1, idx, sorted_logits)
    cum = torch.softmax(filtered, dim=-1).cumsum_(dim=-1)
    sampled = torch.searchsorted(cum, u.view(-1, 1).to(cum.dtype) * cum[:, -1:], right=True)
    tok = torch.where(greedy, scaled.argmax(-1), sampled.clamp_(max=V - 1).view(-1))
    return tok, logp.gather(1, tok.view(-1, 1)).view(-1)
