"""The ``hf`` engine's generic decode loop: ``model.forward`` with a ``DynamicCache``, batch at a time (LoRA models,
architectures the fast loop does not cover, ``fast=False``); and :class:`Row`, one request inside the engine as
every loop keeps it. See :mod:`teamrl.engines.hf` for how the engine chooses its loop."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import torch
from transformers import DynamicCache

from teamrl.engines.base import GenRequest
from teamrl.engines.sampling import sample

__all__ = ["Row", "decode_rows", "hits_stop", "left_pad"]


@dataclass
class Row:
    """One request inside the ``hf`` engine (every loop's): its uniforms for sampling and what it has produced so far."""

    id: int
    req: GenRequest
    u: list[float]  # one uniform variate per possible new token
    tokens: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    finish: str = "length"


def decode_rows(model, rows: list[Row], *, pad_id: int, device, adapters: bool,
                done: Callable[[Row], bool]) -> None:
    """Decode ``rows`` to completion together: left-padded prompts, one forward per token, a row dropped once
    ``done(row)`` (which also sets its finish reason); the tokens and log-probs are appended to each row."""
    reqs = [r.req for r in rows]
    ids, attn = left_pad(reqs, pad_id)  # [B, L], [B, L]
    ids, attn = ids.to(device), attn.to(device)
    temps = torch.tensor([r.sampling.temperature for r in reqs])  # [B]
    top_p = torch.tensor([r.sampling.top_p for r in reqs])  # [B]
    top_k = torch.tensor([r.sampling.top_k for r in reqs])  # [B]
    alive = torch.arange(len(rows))  # original row index of each row still in the batch
    cache = DynamicCache()
    pos = (attn.cumsum(-1) - 1).clamp(min=0)  # [B, L]
    names = [r.adapter or "__base__" for r in reqs]  # PEFT's name for "no adapter"
    last = {"logits_to_keep": 1} if keeps_logits(model) else {}  # not [B, L, vocab] float32 logits of every prompt token
    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=cache, use_cache=True,
                **last, **_adapter_kwargs(adapters, names, alive))
    logits = out.logits[:, -1, :].float()  # [B, V]
    while True:
        u = torch.tensor([rows[b].u[len(rows[b].tokens)] for b in alive.tolist()])
        tok, lp = sample(logits, temps[alive], top_p[alive], top_k[alive], None, u=u)
        keep = []
        for j, b in enumerate(alive.tolist()):
            rows[b].tokens.append(int(tok[j]))
            rows[b].logps.append(float(lp[j]))
            if not done(rows[b]):
                keep.append(j)
        if not keep:
            return
        keep_t = torch.tensor(keep)
        if len(keep) < len(alive):
            cache.reorder_cache(cast(torch.LongTensor, keep_t))
            attn = attn[keep_t]
            tok = tok[keep_t]
            alive = alive[keep_t]
        attn = torch.cat([attn, torch.ones((len(alive), 1), dtype=attn.dtype, device=attn.device)], dim=1)
        pos = attn.sum(-1, keepdim=True) - 1  # [b, 1]
        out = model(
            input_ids=tok.view(-1, 1).to(device), attention_mask=attn, position_ids=pos,
            past_key_values=cache, use_cache=True, **_adapter_kwargs(adapters, names, alive),
        )
        logits = out.logits[:, -1, :].float()


def keeps_logits(model) -> bool:
    """Whether ``model``'s forward (a PEFT model's: its base model's) takes ``logits_to_keep``, so that a prefill
    computes the LM head on the last prompt token only (the Hugging Face causal LMs that take it)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def _adapter_kwargs(adapters: bool, names: list[str], alive: torch.Tensor) -> dict[str, list[str]]:
    """``adapter_names`` for the rows still decoding (nothing on a model without adapters)."""
    return {"adapter_names": [names[b] for b in alive.tolist()]} if adapters else {}


def left_pad(reqs: list[GenRequest], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad the prompts so every row's last token sits at the last column; returns (ids, mask)."""
    L = max(len(r.prompt_ids) for r in reqs)
    ids = torch.full((len(reqs), L), pad_id, dtype=torch.long)
    attn = torch.zeros((len(reqs), L), dtype=torch.long)
    for b, r in enumerate(reqs):
        ids[b, L - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
        attn[b, L - len(r.prompt_ids) :] = 1
    return ids, attn


def hits_stop(tokenizer, tokens: list[int], stop: tuple[str, ...]) -> bool:
    """Whether the reply's last tokens contain one of the stop strings."""
    tail = tokenizer.decode(tokens[-8:], skip_special_tokens=True)
    return any(s in tail for s in stop)
