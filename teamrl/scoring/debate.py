"""MAD-OPD's blind debate of two in-process teachers (``algo.distill.debate_rounds``; :mod:`teamrl.algos.mad_opd`).

For each trained reply its prompt is decoded (special tokens skipped, as the original decodes its prompt ids); the two
teachers answer it in round 1 and revise in rounds 2..R, sampling with the debate's settings and a repetition
penalty of 1.1 on the raw prompt text (the original's ``/v1/completions`` calls, no chat template). The last round's
confidence tags give the weights; each teacher's context (prompt, identity, transcript) is wrapped by the chat
template as a user turn with the generation prompt, and the student's reply ids follow it in the learner.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from teamrl.algos import mad_opd

__all__ = ["Debate", "Sampling", "debate", "generate_texts", "user_turn_ids"]

BATCH = 64
"""Prompts one ``generate`` call takes."""

log = logging.getLogger(__name__)


@dataclass
class Debate:
    """One reply's debate: the transcript H, each teacher's last confidence (-1: none), their weights and the
    context each reads before the reply."""

    history: str
    confidences: tuple[float, float]
    weights: tuple[float, float]
    contexts: tuple[str, str]
    tokens: int
    """Tokens the two teachers wrote in it, every round."""


@dataclass
class Sampling:
    """How the teachers sample in the debate (``algo.distill.debate_*``); a repetition penalty of 1.1 besides."""

    max_tokens: int = 4096
    temperature: float = 0.7
    top_p: float = 0.8
    top_k: int = 20
    """0: off."""
    bf16: bool = False
    """Generate under bf16 autocast (where the learners compute in bf16)."""


def generate_texts(model: Any, tok: Any, prompts: list[str], sampling: Sampling) -> tuple[list[str], list[int]]:
    """Sampled continuations of raw prompt texts by a causal LM (stripped, special tokens skipped) and the tokens
    each wrote up to its stop token, ``BATCH`` prompts per call, left-padded."""
    sp = sampling
    out: list[str] = []
    written: list[int] = []
    device = next(model.parameters()).device
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    eos = model.generation_config.eos_token_id
    stops = {tok.eos_token_id, *(eos if isinstance(eos, list) else [eos])} - {None}  # what ends a row in generate
    for lo in range(0, len(prompts), BATCH):
        enc = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts[lo:lo + BATCH]]
        width = max(len(e) for e in enc)
        ids = torch.tensor([[pad] * (width - len(e)) + e for e in enc], device=device)
        attn = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc], device=device)
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=sp.bf16):
            gen = model.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=sp.temperature,
                                 top_p=sp.top_p, top_k=sp.top_k if sp.top_k > 0 else None, repetition_penalty=1.1,
                                 max_new_tokens=sp.max_tokens, pad_token_id=pad)
        for row in gen[:, width:].tolist():
            end = next((t + 1 for t, i in enumerate(row) if i in stops), len(row))  # the padding after it is not written
            row = row[:end]
            written.append(len(row))
            out.append(tok.decode(row, skip_special_tokens=True).strip())
    return out, written


def debate(teachers: tuple[Any, Any], tok: Any, prompts: list[str], sampling: Sampling, *, rounds: int,
           mode: str = "general") -> list[Debate]:
    """The debates of ``prompts`` (one per reply) between teachers A and B, ``rounds`` >= 1 rounds each
    (``batch_blind_mad_debate_and_force_decode``)."""
    parts: list[list[str]] = [[] for _ in prompts]
    written = [0] * len(prompts)
    asks = [[mad_opd.first_round_prompt(p, mode)] * 2 for p in prompts]
    last: list[list[str]] = []
    for r in range(1, rounds + 1):
        if r > 1:
            asks = [[mad_opd.revision_prompt(p, "\n".join(ps), e, mode) for e in mad_opd.EXPERTS]
                    for p, ps in zip(prompts, parts)]
        said = []
        for k, teacher in enumerate(teachers):
            t0 = time.perf_counter()
            texts, counts = generate_texts(teacher, tok, [a[k] for a in asks], sampling)
            written = [w + c for w, c in zip(written, counts)]
            said.append(texts)
            log.info("debate: round %d/%d, expert %s answered %d prompts, %d tokens in %.1f s", r, rounds,
                     mad_opd.EXPERTS[k], len(asks), sum(counts), time.perf_counter() - t0)
        for i in range(len(prompts)):
            parts[i] += [mad_opd.debate_part(e, r, said[k][i]) for k, e in enumerate(mad_opd.EXPERTS)]
        last = said
    out = []
    for i, p in enumerate(prompts):
        history = mad_opd.debate_history(parts[i])
        conf = (mad_opd.last_confidence(last[0][i]), mad_opd.last_confidence(last[1][i]))
        out.append(Debate(history, conf, mad_opd.confidence_weights(*conf),
                          tuple(mad_opd.teacher_context(p, history, e, mode) for e in mad_opd.EXPERTS),  # type: ignore[arg-type]
                          written[i]))
    return out


def user_turn_ids(tok: Any, text: str) -> list[int]:
    """``text`` as a user turn under the chat template with the generation prompt, as token ids (the original's
    ``_apply_chat_template`` then ``add_special_tokens=False``; thinking off where the template has it)."""
    prefix = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True,
                                     enable_thinking=False)
    return list(tok(prefix, add_special_tokens=False)["input_ids"])
