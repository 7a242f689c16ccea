"""Per-row sampling from logits: temperature, top-p, top-k and greedy, returning the sampled tokens'
log-probs (used by every decode loop of the ``hf`` engine: on the host by :func:`sample`, on the
model's device, inside CUDA graphs, by :func:`sample_rows` directly)."""

from __future__ import annotations

import math

import torch


def sample(logits: torch.Tensor, temps: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
           generator: torch.Generator | None, filters: bool | None = None,
           u: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row on the host; return (tokens [b], log-probs [b] under softmax(logits/T)), in fp32.

    ``u``: one uniform variate per row (drawn from ``generator`` when None). ``filters``: whether
    any row may have top-p / top-k (None: look). The host decides from the values which of
    :func:`sample_rows`' computations are needed.
    """
    if u is None:
        u = torch.rand(len(logits), generator=generator)
    if filters is None:
        filters = bool((top_p < 1).any() or (top_k > 0).any())
    greedy = temps == 0
    return sample_rows(logits.cpu(), temps, top_p, top_k, u,
                       use_top_k=filters and bool((top_k > 0).any()), use_top_p=filters and bool((top_p < 1).any()),
                       divide=bool((temps[~greedy] != 1).any()), all_greedy=bool(greedy.all()),
                       any_greedy=bool(greedy.any()))


def sample_rows(logits: torch.Tensor, temps: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
                u: torch.Tensor, *, use_top_k: bool, use_top_p: bool, divide: bool = True,
                all_greedy: bool = False, any_greedy: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row where ``logits`` live, with no host synchronisation (a CUDA graph can capture it).

    Sampling is inverse-CDF: row b takes the first token whose cumulative probability exceeds
    ``u[b]`` (uniform in [0, 1)); temperature 0 is greedy. The log-prob is under the untruncated
    softmax(logits / T). Without top-k / top-p one pass of exp/cumsum gives both the sampling
    distribution and the normaliser of the sampled token's log-prob: no full log-softmax, no
    copies (``torch.multinomial`` draws an exponential variate for every vocabulary entry: ~4x the
    time on CPU).

    The flags, known on the host, pick computations, never results: ``use_top_k`` / ``use_top_p``
    (some row has top-k > 0 / top-p < 1; either applies the filter to every row), ``divide``
    (some sampled row has T != 1; dividing by 1.0 is exact, so False only saves a pass),
    ``all_greedy`` (every row has T = 0: argmax, and the normaliser from one sum), ``any_greedy`` (some row has
    T = 0; False saves the argmax over the vocabulary of every row, 1 ms a step at 32 rows on CPU).
    """
    greedy = temps == 0
    t = torch.where(greedy, torch.ones_like(temps), temps).float()
    if use_top_k or use_top_p:
        return _sample_filtered(logits.float() / t[:, None], greedy, top_p, top_k, u, use_top_k, use_top_p)
    scaled = logits.float() / t[:, None] if divide else logits  # bf16 logits are upcast exactly below
    m = scaled.amax(dim=-1, keepdim=True).float()  # [b, 1]
    if all_greedy:
        tok = scaled.argmax(-1)
        lse = m + torch.sub(scaled, m).exp_().sum(-1, keepdim=True).log_()
    else:
        cum = torch.sub(scaled, m).exp_().cumsum_(dim=-1)  # [b, V] unnormalised CDF, fp32
        total = cum[:, -1:]  # [b, 1]
        tok = torch.searchsorted(cum, u.view(-1, 1).to(cum.dtype) * total, right=True)
        tok = tok.clamp_(max=scaled.shape[-1] - 1).view(-1)
        if any_greedy:
            tok = torch.where(greedy, scaled.argmax(-1), tok)
        lse = m + total.log()
    return tok, (scaled.gather(1, tok.view(-1, 1)).float() - lse).view(-1)


def _sample_filtered(scaled: torch.Tensor, greedy: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
                     u: torch.Tensor, use_top_k: bool, use_top_p: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sample_rows` with top-k / top-p truncation of the fp32 ``scaled`` logits."""
    logp = torch.log_softmax(scaled, dim=-1)  # [b, V]
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
    cum = torch.softmax(filtered, dim=-1).cumsum_(dim=-1)  # [b, V]
    sampled = torch.searchsorted(cum, u.view(-1, 1).to(cum.dtype) * cum[:, -1:], right=True)
    tok = torch.where(greedy, scaled.argmax(-1), sampled.clamp_(max=V - 1).view(-1))
    return tok, logp.gather(1, tok.view(-1, 1)).view(-1)
