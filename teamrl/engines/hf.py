"""``hf`` engine: in-process batched generation with a Hugging Face causal LM.

By default the engine holds a reference to the very module the learner trains, so weight sync
is free. With ``dtype=torch.bfloat16`` over an fp32 learner it keeps a bf16 copy instead
(about 1.75x faster decoding on a CPU with AVX-512 bf16) and :meth:`HFEngine.sync` copies the
learner's weights into it after every update.

Two decode loops, with the same results (tested):

* the fast loop (:class:`_FastDecoder`, Llama / Mistral / Qwen2 / Qwen3 decoders without LoRA):
  identical prompts are prefilled once; keys and values live in preallocated buffers written in
  place; each step runs the model's own modules with fused q/k/v and gate/up matmuls and one
  attention call per layer; sampling is inverse-CDF over one exp/cumsum pass, which also gives
  the sampled token's log-prob; stop checks are vectorised, text is decoded once at the end
  (stop strings decode only the rows that use them); finished rows are dropped from the batch
  and its cache at most every ``compact_every`` steps (or when a quarter of the rows are done);
* the generic loop over ``model.forward`` with a ``DynamicCache`` (LoRA models, other
  architectures, ``fast=False``): left-padded prompts, one forward per new token, finished rows
  dropped every step.

Both take per-row temperature / top-p / top-k / max tokens / stop strings / ``ignore_eos``.
docs/results/speed.md has the measured speeds and a decode-step profile.

On a model with LoRA adapters (``adapters=True``, a PEFT model) one batch mixes the calls of
every adapter: each forward passes ``adapter_names`` (one per row), so the base weights run once
for the whole batch and each row adds its own adapter's low-rank update. Splitting the batch by
adapter instead would run one decode loop per adapter, i.e. as many base forwards per token as
there are adapters, each on a smaller batch.

Not here (yet): continuous batching (refilling finished rows from the queue while decoding),
and shared-prefix reuse across different prompts (only identical prompts share a prefill).
"""

from __future__ import annotations

import copy
import math
from typing import Callable

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from teamrl.engines.base import GenOutput, GenRequest, SamplingParams


class HFEngine:
    """Batched sampling with log-probs for one in-process ``transformers`` model.

    Args:
        model: a causal LM (shared with the learner; the engine never copies it).
        tokenizer: its tokenizer.
        max_batch_size: most sequences decoded together; more requests are split into chunks.
        seed: seed of the engine's own sampling generator.
        dtype: generate with a copy of ``model`` in this dtype (None: use ``model`` itself).
        adapters: ``model`` is a PEFT model with LoRA adapters; each request's ``adapter`` is used for its row.
        fast: use the static-cache decode loop where the architecture allows it (see :class:`_FastDecoder`);
            False always runs the generic loop over ``model.forward``.
        fuse: the fast loop multiplies by concatenated q/k/v and gate/up weights (copies, remade after updates).
        compact_every: the fast loop drops finished rows from its batch and cache at most every this many steps.
    """

    def __init__(self, model, tokenizer, *, max_batch_size: int = 64, seed: int = 0,
                 dtype: torch.dtype | None = None, adapters: bool = False, fast: bool = True,
                 compact_every: int = 8, fuse: bool = True) -> None:
        self.source = model
        own_dtype = next(model.parameters()).dtype
        self.model = model if dtype in (None, own_dtype) else copy.deepcopy(model).to(dtype).eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.adapters = adapters
        self.max_batch_size = max_batch_size
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        eos = {tokenizer.eos_token_id}
        for name in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end|>", "</s>"):
            tid = tokenizer.convert_tokens_to_ids(name)
            if isinstance(tid, int) and tid != tokenizer.unk_token_id:
                eos.add(tid)
        self.stop_ids = {i for i in eos if i is not None}
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.device = next(model.parameters()).device
        self.compact_every = max(1, compact_every)
        self.fuse = fuse
        self._fused_cache: dict = {}
        self._fast = _FastDecoder.supports(self.model) if fast and not adapters else False

    @torch.no_grad()
    def sync(self) -> None:
        """Copy the learner's current weights into the engine's copy (a no-op when shared)."""
        if self.model is self.source:
            return
        for dst, src in zip(self.model.state_dict().values(), self.source.state_dict().values()):
            dst.copy_(src)

    def generate(self, requests: list[GenRequest], on_progress: Callable[[int], None] | None = None) -> list[GenOutput]:
        """Generate for all requests, similar prompt lengths batched together; outputs in request order."""
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].prompt_ids))
        outputs: list[GenOutput | None] = [None] * len(requests)
        for start in range(0, len(order), self.max_batch_size):
            chunk = order[start : start + self.max_batch_size]
            for i, out in zip(chunk, self._generate_batch([requests[i] for i in chunk])):
                outputs[i] = out
            if on_progress is not None:
                on_progress(len(chunk))
        return outputs  # type: ignore[return-value]

    @torch.no_grad()
    def _generate_batch(self, reqs: list[GenRequest]) -> list[GenOutput]:
        was_training = self.model.training
        self.model.eval()
        try:
            return self._decode_fast(reqs) if self._fast else self._decode(reqs)
        finally:
            self.model.train(was_training)

    def _decode(self, reqs: list[GenRequest]) -> list[GenOutput]:
        B = len(reqs)
        ids, attn = _left_pad(reqs, self.pad_id)  # [B, L], [B, L]
        ids, attn = ids.to(self.device), attn.to(self.device)
        temps = torch.tensor([r.sampling.temperature for r in reqs])  # [B]
        top_p = torch.tensor([r.sampling.top_p for r in reqs])  # [B]
        top_k = torch.tensor([r.sampling.top_k for r in reqs])  # [B]
        max_new = torch.tensor([r.sampling.max_new_tokens for r in reqs])  # [B]
        tokens: list[list[int]] = [[] for _ in reqs]
        logps: list[list[float]] = [[] for _ in reqs]
        finish = ["length"] * B
        alive = torch.arange(B)  # original row index of each row still in the batch
        cache = DynamicCache()
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # [B, L]
        names = [r.adapter or "__base__" for r in reqs]  # PEFT's name for "no adapter"
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=cache, use_cache=True,
                         **self._adapter_kwargs(names, alive))
        logits = out.logits[:, -1, :].float()  # [B, V]
        step = 0
        while True:
            tok, lp = _sample(logits, temps[alive], top_p[alive], top_k[alive], self.generator)
            keep = []
            for j, b in enumerate(alive.tolist()):
                t = int(tok[j])
                # The end-of-turn token is kept: the learner trains on it, so the model learns to stop.
                tokens[b].append(t)
                logps[b].append(float(lp[j]))
                done = t in self.stop_ids and not reqs[b].sampling.ignore_eos
                if done:
                    finish[b] = "stop"
                if not done and reqs[b].sampling.stop and not reqs[b].sampling.ignore_eos and _hits_stop(self.tokenizer, tokens[b], reqs[b].sampling.stop):
                    finish[b], done = "stop", True
                if not done and len(tokens[b]) >= int(max_new[b]):
                    done = True
                if not done:
                    keep.append(j)
            step += 1
            if not keep:
                break
            keep_t = torch.tensor(keep)
            if len(keep) < len(alive):
                cache.reorder_cache(keep_t)
                attn = attn[keep_t]
                tok = tok[keep_t]
                alive = alive[keep_t]
            attn = torch.cat([attn, torch.ones((len(alive), 1), dtype=attn.dtype, device=attn.device)], dim=1)
            pos = attn.sum(-1, keepdim=True) - 1  # [b, 1]
            out = self.model(
                input_ids=tok.view(-1, 1).to(self.device), attention_mask=attn, position_ids=pos,
                past_key_values=cache, use_cache=True, **self._adapter_kwargs(names, alive),
            )
            logits = out.logits[:, -1, :].float()
        return [
            GenOutput(tokens[b], logps[b], self.tokenizer.decode(tokens[b], skip_special_tokens=True), finish[b])
            for b in range(B)
        ]

    def _decode_fast(self, reqs: list[GenRequest]) -> list[GenOutput]:
        """Decode loop over a preallocated KV cache (see :class:`_FastDecoder`); same results as :meth:`_decode`."""
        B = len(reqs)
        ids, attn = _left_pad(reqs, self.pad_id)  # [B, L], [B, L]
        L = ids.shape[1]
        temps = torch.tensor([r.sampling.temperature for r in reqs])  # [B]
        top_p = torch.tensor([r.sampling.top_p for r in reqs])  # [B]
        top_k = torch.tensor([r.sampling.top_k for r in reqs])  # [B]
        max_new = torch.tensor([r.sampling.max_new_tokens for r in reqs])  # [B]
        use_eos = torch.tensor([not r.sampling.ignore_eos for r in reqs])  # [B]
        stop_rows = {b for b, r in enumerate(reqs) if r.sampling.stop and not r.sampling.ignore_eos}
        stop_ids = torch.tensor(sorted(self.stop_ids), dtype=torch.long)
        steps = int(max_new.max())
        out_tok = torch.full((B, steps), self.pad_id, dtype=torch.long)
        out_lp = torch.zeros((B, steps), dtype=torch.float32)
        n_out = torch.zeros(B, dtype=torch.long)  # tokens kept per original row
        stopped = torch.zeros(B, dtype=torch.bool)  # finished by an end-of-turn token or stop string

        fused = _fused_weights(self.model, self._fused_cache) if self.fuse else None
        dec = _FastDecoder(self.model, B, L + steps, fused)
        logits = dec.prefill(ids.to(self.device), attn.to(self.device))  # [B, V]
        alive = torch.arange(B)  # original row index of each row in the batch
        running = torch.ones(B, dtype=torch.bool)  # rows of the batch still decoding
        filters = bool((top_p < 1).any() or (top_k > 0).any())
        for step in range(steps):
            tok, lp = _sample(logits, temps[alive], top_p[alive], top_k[alive], self.generator, filters=filters)
            out_tok[alive, step] = torch.where(running, tok, out_tok[alive, step])
            out_lp[alive, step] = torch.where(running, lp, out_lp[alive, step])
            n_out[alive] += running.long()
            hit = torch.isin(tok, stop_ids) & use_eos[alive] & running
            for j in (j for j, b in enumerate(alive.tolist()) if b in stop_rows and bool(running[j])):
                b = int(alive[j])
                if _hits_stop(self.tokenizer, out_tok[b, : int(n_out[b])].tolist(), reqs[b].sampling.stop):
                    hit[j] = True
            stopped[alive] |= hit
            running &= ~hit & (n_out[alive] < max_new[alive])
            n_run = int(running.sum())
            if n_run == 0:
                break
            dead = len(alive) - n_run
            if dead and (dead * 4 >= len(alive) or (step + 1) % self.compact_every == 0):
                keep = running.nonzero().view(-1)
                dec.keep_rows(keep)
                alive, tok, running = alive[keep], tok[keep], running[keep]
            logits = dec.step(tok.to(self.device))
        outputs = []
        for b in range(B):
            n = int(n_out[b])
            toks = out_tok[b, :n].tolist()
            text = self.tokenizer.decode(toks, skip_special_tokens=True)
            outputs.append(GenOutput(toks, out_lp[b, :n].tolist(), text, "stop" if bool(stopped[b]) else "length"))
        return outputs

    def _adapter_kwargs(self, names: list[str], alive: torch.Tensor) -> dict[str, list[str]]:
        """``adapter_names`` for the rows still decoding (nothing on a model without adapters)."""
        return {"adapter_names": [names[b] for b in alive.tolist()]} if self.adapters else {}


def _left_pad(reqs: list[GenRequest], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad the prompts so every row's last token sits at the last column; returns (ids, mask)."""
    L = max(len(r.prompt_ids) for r in reqs)
    ids = torch.full((len(reqs), L), pad_id, dtype=torch.long)
    attn = torch.zeros((len(reqs), L), dtype=torch.long)
    for b, r in enumerate(reqs):
        ids[b, L - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
        attn[b, L - len(r.prompt_ids) :] = 1
    return ids, attn


def _hits_stop(tokenizer, tokens: list[int], stop: tuple[str, ...]) -> bool:
    tail = tokenizer.decode(tokens[-8:], skip_special_tokens=True)
    return any(s in tail for s in stop)


def _sample(logits: torch.Tensor, temps: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
            generator: torch.Generator, filters: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return (tokens [b], log-probs [b] under softmax(logits/T)).

    Without top-p / top-k rows (``filters`` False, or None and none found) one pass of
    exp/cumsum gives both the sampling distribution (inverse-CDF sampling) and the normaliser of
    the sampled token's log-prob: no full log-softmax, no copies.
    """
    if filters is None:
        filters = bool((top_p < 1).any() or (top_k > 0).any())
    if filters:
        return _sample_filtered(logits, temps, top_p, top_k, generator)
    greedy = temps == 0
    t = torch.where(greedy, torch.ones_like(temps), temps).to(logits.dtype)
    scaled = logits.cpu()
    scaled = scaled / t[:, None] if bool((t != 1).any()) else scaled  # [b, V]
    m = scaled.amax(dim=-1, keepdim=True)  # [b, 1]
    if bool(greedy.all()):
        tok = scaled.argmax(-1)
        lse = m + (scaled - m).exp_().sum(-1, keepdim=True).log_()
    else:
        # Inverse-CDF sampling: one cumulative sum and a binary search per row. (torch.multinomial
        # draws an exponential variate for every vocabulary entry: ~4x the time on CPU.)
        cum = (scaled - m).exp_().cumsum_(dim=-1)  # [b, V] unnormalised CDF
        total = cum[:, -1:]  # [b, 1]
        u = torch.rand((len(scaled), 1), generator=generator, dtype=cum.dtype) * total
        tok = torch.searchsorted(cum, u, right=True).clamp_(max=scaled.shape[-1] - 1).view(-1)
        if bool(greedy.any()):
            tok = torch.where(greedy, scaled.argmax(-1), tok)
        lse = m + total.log()
    return tok, (scaled.gather(1, tok.view(-1, 1)) - lse).view(-1)


def _sample_filtered(logits: torch.Tensor, temps: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
            generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return (tokens [b], log-probs [b] under softmax(logits/T))."""
    greedy = temps == 0
    t = torch.where(greedy, torch.ones_like(temps), temps).to(logits.dtype)
    scaled = logits.cpu() / t[:, None]  # [b, V]
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
    probs = torch.softmax(filtered, dim=-1)
    sampled = torch.multinomial(probs, 1, generator=generator).view(-1)  # [b]
    tok = torch.where(greedy, scaled.argmax(-1), sampled)
    return tok, logp.gather(1, tok.view(-1, 1)).view(-1)


class _FastDecoder:
    """A decode loop for Llama-style decoders over a preallocated KV cache.

    The prompt is prefilled with the model's own forward (left-padded, only the last position's
    logits computed, each distinct prompt once); its keys and values are copied into buffers of shape
    ``[layers, batch, kv_heads, capacity, head_dim]`` and every new token's are written in place at
    the next column, instead of concatenating a growing cache each step. Each decode step runs the
    model's own modules (norms, projections, MLP, rotary embedding) with one attention call per
    layer over the filled columns, query heads packed per key/value head (grouped-query attention
    without repeating keys), and a boolean mask for the left padding; no per-step mask building.
    Rows that finished are dropped from the batch by :meth:`keep_rows` (the caller batches drops).
    """

    ARCHS = ("llama", "mistral", "qwen2", "qwen3")

    @staticmethod
    def supports(model) -> bool:
        cfg = getattr(model, "config", None)
        inner = getattr(model, "model", None)
        if cfg is None or inner is None or getattr(cfg, "model_type", None) not in _FastDecoder.ARCHS:
            return False
        if getattr(cfg, "use_sliding_window", False) or getattr(cfg, "sliding_window", None) is not None:
            return False
        need = ("embed_tokens", "layers", "norm", "rotary_emb")
        if not all(hasattr(inner, n) for n in need) or not hasattr(model, "lm_head"):
            return False
        layer = inner.layers[0]
        return all(hasattr(layer.self_attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")) and \
            hasattr(layer, "input_layernorm") and hasattr(layer, "post_attention_layernorm")

    def __init__(self, model, batch: int, capacity: int, fused: list | None = None) -> None:
        self.model = model
        self.inner = model.model
        cfg = model.config
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scale = self.inner.layers[0].self_attn.scaling
        p = next(model.parameters())
        shape = (len(self.inner.layers), batch, self.n_kv, capacity, self.head_dim)
        self.k = torch.empty(shape, dtype=p.dtype, device=p.device)
        self.v = torch.empty(shape, dtype=p.dtype, device=p.device)
        self.valid = torch.zeros((batch, capacity), dtype=torch.bool, device=p.device)
        self.pos = torch.zeros(batch, dtype=torch.long, device=p.device)  # position id of the next token
        self.col = 0  # next column to write
        self.fused = fused

    def prefill(self, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Run the left-padded prompts; returns the last position's logits [B, V] in fp32."""
        B, L = ids.shape
        # Identical prompts (a GRPO group's first calls) are run once and their cache rows copied.
        first: dict[tuple[int, ...], int] = {}
        uniq: list[int] = []  # batch row of each distinct prompt
        inv: list[int] = []  # distinct-prompt index of each batch row
        for b, row in enumerate(ids.tolist()):
            if tuple(row) not in first:
                first[tuple(row)] = len(uniq)
                uniq.append(b)
            inv.append(first[tuple(row)])
        inverse = torch.tensor(inv) if len(uniq) < B else None
        attn_u = attn if inverse is None else attn[uniq]
        ids = ids if inverse is None else ids[uniq]
        cache = DynamicCache()
        pos = (attn_u.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=attn_u, position_ids=pos, past_key_values=cache,
                         use_cache=True, logits_to_keep=1)
        for i, layer in enumerate(cache.layers):
            self.k[i, :, :, :L] = layer.keys if inverse is None else layer.keys[inverse]
            self.v[i, :, :, :L] = layer.values if inverse is None else layer.values[inverse]
        self.valid[:, :L] = attn.bool()
        self.pos = attn.sum(-1)
        self.col = L
        logits = out.logits[:, -1, :].float()
        return logits if inverse is None else logits[inverse]

    def keep_rows(self, keep: torch.Tensor) -> None:
        c = self.col
        self.k = self.k[:, keep, :, :].contiguous() if c == self.k.shape[3] else _take_rows(self.k, keep, c)
        self.v = self.v[:, keep, :, :].contiguous() if c == self.v.shape[3] else _take_rows(self.v, keep, c)
        self.valid = self.valid[keep]
        self.pos = self.pos[keep]

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        """Feed one token per row; returns the next logits [B, V] in fp32."""
        B = tok.shape[0]
        c = self.col
        if c >= self.k.shape[3]:
            raise RuntimeError("fast decoder capacity exceeded")
        self.valid[:, c] = True
        mask = self.valid[:, None, None, : c + 1]  # [B, 1, 1, c+1]
        h = self.inner.embed_tokens(tok.view(B, 1))  # [B, 1, H]
        cos, sin = self.inner.rotary_emb(h, self.pos.view(B, 1))  # [B, 1, D]
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, 1, D]
        g = self.n_heads // self.n_kv
        D = self.head_dim
        nq, nk = self.n_heads * D, self.n_kv * D
        for i, layer in enumerate(self.inner.layers):
            a = layer.self_attn
            x = layer.input_layernorm(h)
            if self.fused is not None:
                w_qkv, b_qkv, w_gu = self.fused[i]
                qkv = F.linear(x, w_qkv, b_qkv)
                q = qkv[..., :nq].view(B, 1, self.n_heads, D)
                k = qkv[..., nq : nq + nk].view(B, 1, self.n_kv, D)
                v = qkv[..., nq + nk :].reshape(B, self.n_kv, 1, D)
            else:
                q = a.q_proj(x).view(B, 1, self.n_heads, D)
                k = a.k_proj(x).view(B, 1, self.n_kv, D)
                v = a.v_proj(x).view(B, self.n_kv, 1, D)
            if hasattr(a, "q_norm"):
                q, k = a.q_norm(q), a.k_norm(k)
            q = q.view(B, self.n_kv, g, D)  # query heads packed per kv head (head h uses kv head h // g)
            k = k.view(B, self.n_kv, 1, D)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            self.k[i, :, :, c : c + 1] = k
            self.v[i, :, :, c : c + 1] = v
            o = F.scaled_dot_product_attention(q, self.k[i, :, :, : c + 1], self.v[i, :, :, : c + 1],
                                               attn_mask=mask, scale=self.scale)  # [B, n_kv, g, D]
            h = h + a.o_proj(o.reshape(B, 1, self.n_heads * D))
            x = layer.post_attention_layernorm(h)
            if self.fused is not None and w_gu is not None:
                gate, up = F.linear(x, w_gu).chunk(2, dim=-1)
                h = h + layer.mlp.down_proj(layer.mlp.act_fn(gate) * up)
            else:
                h = h + layer.mlp(x)
        self.col = c + 1
        self.pos = self.pos + 1
        h = self.inner.norm(h)
        return self.model.lm_head(h[:, -1]).float()


def _fused_weights(model, cache: dict) -> list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]]:
    """Per layer: concatenated q/k/v weight (and bias), concatenated gate/up weight (None if the MLP differs).

    One matmul instead of three (five with the MLP) per layer: at decode batch sizes each linear is
    small and its call overhead counts. The copies are remade when any source weight changed in
    place (an optimizer step, :meth:`HFEngine.sync`), detected by the tensors' version counters
    and storage addresses; ``cache`` (the engine's) holds the last copies.
    """
    layers = model.model.layers
    srcs = []
    for layer in layers:
        a, m = layer.self_attn, layer.mlp
        srcs += [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]
        srcs += [t for t in (a.q_proj.bias, a.k_proj.bias, a.v_proj.bias) if t is not None]
        if all(hasattr(m, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            srcs += [m.gate_proj.weight, m.up_proj.weight]
    key = tuple(t._version for t in srcs) + tuple(t.data_ptr() for t in srcs)
    if cache.get("key") == key:
        return cache["weights"]
    out = []
    with torch.no_grad():
        for layer in layers:
            a, m = layer.self_attn, layer.mlp
            w = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
            b = None
            if a.q_proj.bias is not None:
                b = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
            gu = None
            if all(hasattr(m, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")) and \
                    m.gate_proj.bias is None and m.up_proj.bias is None:
                gu = torch.cat([m.gate_proj.weight, m.up_proj.weight])
            out.append((w, b, gu))
    cache.update(key=key, weights=out)
    return out


def _take_rows(buf: torch.Tensor, keep: torch.Tensor, cols: int) -> torch.Tensor:
    """``buf[:, keep]`` copying only the first ``cols`` filled columns into a buffer of the same capacity."""
    out = torch.empty((buf.shape[0], len(keep), *buf.shape[2:]), dtype=buf.dtype, device=buf.device)
    out[:, :, :, :cols] = buf[:, keep, :, :cols]
    return out


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
