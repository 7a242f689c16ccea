"""Log-probs of response tokens: the one forward the learner, its KL reference and the tests use.

:class:`ResponseScorer` runs a causal LM's decoder and only the response rows of its LM head
(in chunks, :func:`teamrl.algos.losses.chunked_logprobs`); :func:`response_logprobs` lays rows out
for it, padded (one row per step) or packed (:mod:`teamrl.learner.packing`: rows end to end, shared
prefixes computed once). The scorer is one module so that FSDP2 can make it the root unit of a
sharded learner.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from teamrl.algos import losses
from teamrl.learner.packing import PackedLayout, dummy_mask, pack_rows
from teamrl.models import CausalLM
from teamrl.team.records import Step


def decoder_layers(model: CausalLM) -> list[torch.nn.Module]:
    """The decoder layers of a Hugging Face causal LM (FSDP's units)."""
    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: its decoder has no .layers to shard; use placement.sharding: replicate")
    return list(layers)


class ResponseScorer(torch.nn.Module):
    """``model``'s decoder and LM head as one module whose forward gives response log-probs and entropies.

    :func:`response_logprobs` runs the decoder and only the needed rows of the LM head, not the
    model's own forward; wrapping both in one module gives FSDP one root whose forward covers
    them (so the embeddings, tied LM head and final norm are gathered for the whole computation).
    """

    def __init__(self, model: CausalLM) -> None:
        super().__init__()
        self.model = model
        self.device = next(model.parameters()).device
        """Where the computation runs (under FSDP CPU offload the shards live elsewhere)."""

    def forward(self, ids: torch.Tensor, attn: torch.Tensor, row_idx: torch.Tensor, pos_idx: torch.Tensor,
                tgt: torch.Tensor, temps: torch.Tensor, chunk: int = 0, entropy_grad: bool = False,
                position_ids: torch.Tensor | None = None, packed_layout: PackedLayout | None = None,
                term: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor] | None = None) -> tuple[torch.Tensor, ...]:
        extra = {} if packed_layout is None else {"position_ids": position_ids, "packed_layout": packed_layout}
        hidden = self.model.get_decoder()(input_ids=ids, attention_mask=attn, use_cache=False, **extra).last_hidden_state
        sel = hidden[row_idx, pos_idx]  # [M, H]
        head = self.model.get_output_embeddings()
        logp, ent = losses.chunked_logprobs(head, sel, tgt, temps, chunk=chunk, entropy_grad=entropy_grad)
        if term is not None:  # a loss over the whole next-token distributions (MAD-OPD's divergence)
            return logp.clone(), ent.clone(), term(head, sel)
        return logp.clone(), ent.clone()  # not views: FSDP hooks the outputs for backward ([M] values each)


def response_logprobs(model: CausalLM | ResponseScorer, rows: list[Step], *, chunk: int = 0,
                      entropy_grad: bool = False, pack: bool = False, share: bool = False,
                      temperature: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probs of each row's response tokens, computing logits only where they are needed.

    The decoder gives hidden states; the LM head and log-softmax run on the response positions
    only, ``chunk`` tokens at a time (:func:`teamrl.algos.losses.chunked_logprobs`; 0: all at once).
    ``pack`` lays the rows end to end without padding, ``share`` also computes their common prefixes
    once (:func:`teamrl.learner.packing.pack_rows`; the model must use the packed attention,
    :func:`teamrl.learner.packing.use_packed_attention`); the results are the padded layout's. Each row is scored at
    its sampling temperature, or at ``temperature`` when that is > 0 (``loss.logprob_temperature``).

    Returns:
        logp [b, R] (0 at padding), entropy [M] of the M real response tokens (with a gradient
        only when ``entropy_grad``), mask [b, R].
    """
    logp, ent, mask, _ = response_logprobs_with(model, rows, None, chunk=chunk, entropy_grad=entropy_grad, pack=pack,
                                                share=share, temperature=temperature)
    return logp, ent, mask


def response_logprobs_with(model: CausalLM | ResponseScorer, rows: list[Step],
                           term: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor] | None, *, chunk: int = 0,
                           entropy_grad: bool = False, pack: bool = False, share: bool = False,
                           temperature: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """:func:`response_logprobs`, and ``term(lm_head, hidden)`` of the M response positions' hidden states [M, H]
    (None without a term): a loss term over the whole next-token distributions, computed in the same forward."""
    scorer = model if isinstance(model, ResponseScorer) else ResponseScorer(model)
    device = scorer.device
    ids, attn, extra, idx, mask = layout(rows, pack=pack, share=share, device=device)
    tgt: list[int] = []
    temps: list[float] = []
    for r in rows:
        tgt += r.response_ids
        temps += [temperature if temperature > 0 else r.temperature if r.temperature > 0 else 1.0] * len(r.response_ids)
    out = scorer(ids.to(device), attn.to(device), *idx, torch.tensor(tgt, device=device),
                 torch.tensor(temps, device=device), chunk=chunk, entropy_grad=entropy_grad, term=term, **extra)
    flat, ent = out[0], out[1]
    logp = torch.zeros((len(rows), mask.shape[1]), device=device, dtype=flat.dtype).masked_scatter(
        mask.bool().to(device), flat)
    return logp, ent, mask.to(device), out[2] if term is not None else None


def layout(rows: list[Step], *, pack: bool, share: bool, device: torch.device):
    """The forward's input of ``rows`` (prompt then reply ids): ids, attention mask, the packed layout's keywords
    (empty when padded), the (row, position) indices of the hidden states that predict each reply token, in row
    then token order, and the [b, R] mask of reply tokens."""
    seqs = [r.prompt_ids + r.response_ids for r in rows]
    R = max(len(r.response_ids) for r in rows)
    packed = pack_rows(seqs, share=share) if pack else None
    extra: dict[str, Any] = {}
    if packed is None:
        L = max(len(s) for s in seqs)
        ids = torch.zeros((len(rows), L), dtype=torch.long)
        attn = torch.zeros((len(rows), L), dtype=torch.long)
        for b, s in enumerate(seqs):  # right padding
            ids[b, : len(s)] = torch.tensor(s)
            attn[b, : len(s)] = 1
    else:
        ids = torch.tensor([packed.ids])  # [1, N]
        attn = dummy_mask(device)
        extra = {"position_ids": torch.tensor([packed.positions], device=device), "packed_layout": packed}
    row_idx: list[int] = []
    pos_idx: list[int] = []
    mask = torch.zeros((len(rows), R))
    for b, r in enumerate(rows):
        P, n = len(r.prompt_ids), len(r.response_ids)
        at = range(P - 1, P + n - 1)  # hidden state at t predicts token t+1
        row_idx += [b if packed is None else 0] * n
        pos_idx += at if packed is None else [packed.index[b][t] for t in at]
        mask[b, :n] = 1
    idx = (torch.tensor(row_idx, device=device), torch.tensor(pos_idx, device=device))
    return ids, attn, extra, idx, mask


@contextlib.contextmanager
def adapters_off(scorer: ResponseScorer):
    """``scorer`` of a PEFT model with every adapter disabled: the frozen base weights."""
    with scorer.model.disable_adapter():
        yield scorer
