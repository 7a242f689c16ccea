"""``hf`` engine: in-process batched generation with a Hugging Face causal LM.

By default the engine holds a reference to the very module the learner trains, so weight sync
is free. With ``dtype=torch.bfloat16`` over an fp32 learner it keeps a bf16 copy instead
(about 1.75x faster decoding on a CPU with AVX-512 bf16) and :meth:`HFEngine.sync` copies the
learner's weights into it after every update.

The engine is a small serving loop with a step-level API: :meth:`HFEngine.add` queues requests,
:meth:`HFEngine.step` advances the running batch by one token and returns the requests that
finished, and :meth:`HFEngine.generate` is ``add`` + ``step`` until done. The
:class:`~teamrl.team.team.Dispatcher` calls ``step`` itself, so a finished call resolves at once,
its episode runs on, and the episode's next call joins the running batch at the next step
(continuous batching).

Two decode loops, with the same results (tested):

* the fast loop (:class:`_FastDecoder`, Llama / Mistral / Qwen2 / Qwen3 decoders without LoRA),
  continuous: keys and values live in preallocated ``[layers, rows, kv_heads, columns, head_dim]``
  buffers, one row per running request, each row filled from column 0 with its own length, so
  requests of any prompt length join between two steps. New requests are prefilled by the same
  per-layer code as the decode step (identical prompts once; optionally a prompt prefix shared by
  several requests once, ``share_prefix``); a finished row is replaced by the last row of the
  batch (only that row's cache is copied), so the batch stays dense. Each step runs the model's
  own modules with fused q/k/v and gate/up matmuls and one attention call per layer with a
  boolean mask of each row's filled columns; sampling is inverse-CDF over one exp/cumsum pass,
  which also gives the sampled token's log-prob;
* the generic loop over ``model.forward`` with a ``DynamicCache`` (LoRA models, other
  architectures, ``fast=False``), batch-at-a-time: ``step`` takes up to ``max_batch_size``
  queued requests and decodes them to completion (left-padded prompts, one forward per token,
  finished rows dropped every step). Joining mid-flight would need a per-row cache layout that
  ``DynamicCache`` does not have.

Both take per-request temperature / top-p / top-k / max tokens / stop strings / ``ignore_eos``.
Each request draws its ``max_new_tokens`` uniform variates from the engine's generator when it is
added, and its i-th token is sampled with the i-th: a request's tokens depend only on the
generator state when it was added, not on which other requests share its batch or when it was
admitted. docs/results/speed.md has the measured speeds and a decode-step profile.

On a model with LoRA adapters (``adapters=True``, a PEFT model) one batch mixes the calls of
every adapter: each forward passes ``adapter_names`` (one per row), so the base weights run once
for the whole batch and each row adds its own adapter's low-rank update. Splitting the batch by
adapter instead would run one decode loop per adapter, i.e. as many base forwards per token as
there are adapters, each on a smaller batch.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from teamrl.engines.base import GenOutput, GenRequest


@dataclass
class _Row:
    """One request inside the engine: its uniforms for sampling and what it has produced so far."""

    id: int
    req: GenRequest
    u: list[float]  # one uniform variate per possible new token
    tokens: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    finish: str = "length"


class HFEngine:
    """Batched sampling with log-probs for one in-process ``transformers`` model.

    Args:
        model: a causal LM (shared with the learner; the engine never copies it).
        tokenizer: its tokenizer.
        max_batch_size: most sequences decoded together; further requests wait in a queue.
        seed: seed of the engine's own sampling generator.
        dtype: generate with a copy of ``model`` in this dtype (None: use ``model`` itself).
        adapters: ``model`` is a PEFT model with LoRA adapters; each request's ``adapter`` is used for its row.
        fast: use the static-cache decode loop where the architecture allows it (see :class:`_FastDecoder`);
            False always runs the generic loop over ``model.forward``.
        fuse: the fast loop multiplies by concatenated q/k/v and gate/up weights (copies, remade after updates).
        share_prefix: the fast loop prefills a token prefix common to several prompts admitted together
            once when it is at least this long (0: off; see docs/results/speed.md for when it pays).
    """

    def __init__(self, model, tokenizer, *, max_batch_size: int = 64, seed: int = 0,
                 dtype: torch.dtype | None = None, adapters: bool = False, fast: bool = True,
                 fuse: bool = True, share_prefix: int = 0) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size {max_batch_size} must be >= 1")
        if share_prefix < 0:
            raise ValueError(f"share_prefix {share_prefix} must be >= 0 (0 = off)")
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
        self.fuse = fuse
        self.share_prefix = share_prefix
        self._fused_cache: dict = {}
        self._fast = _FastDecoder.supports(self.model) if fast and not adapters else False
        self._queue: deque[_Row] = deque()  # added, not yet admitted
        self._rows: list[_Row] = []  # the running batch of the fast loop; row j lives in cache row j
        self._dec: _FastDecoder | None = None
        self._logits: torch.Tensor | None = None  # [n, V] next-token logits of the running rows
        self._params: tuple | None = None  # per-row sampling tensors of the running batch (rebuilt on change)
        self._next_id = 0

    @torch.no_grad()
    def sync(self) -> None:
        """Copy the learner's current weights into the engine's copy (a no-op when shared)."""
        if self.model is self.source:
            return
        for dst, src in zip(self.model.state_dict().values(), self.source.state_dict().values()):
            dst.copy_(src)

    # ---- step-level API ---------------------------------------------------------------------

    def add(self, requests: list[GenRequest]) -> list[int]:
        """Queue requests; they join the running batch at the next :meth:`step`. Returns their ids."""
        ids = []
        for r in requests:
            u = torch.rand(r.sampling.max_new_tokens, generator=self.generator).tolist()
            self._queue.append(_Row(self._next_id, r, u))
            ids.append(self._next_id)
            self._next_id += 1
        return ids

    @property
    def busy(self) -> bool:
        """Requests are queued or decoding."""
        return bool(self._queue or self._rows)

    def step(self) -> list[tuple[int, GenOutput]]:
        """Admit queued requests, sample one token for every running one; returns (id, output) of those that finished.

        In the generic loop a step decodes one batch of queued requests to completion.
        """
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                return self._step_fast() if self._fast else self._step_generic()
        finally:
            self.model.train(was_training)

    def reset(self) -> None:
        """Drop every queued and running request (after an error) and free the cache."""
        self._queue.clear()
        self._rows, self._dec, self._logits, self._params = [], None, None, None

    def generate(self, requests: list[GenRequest], on_progress: Callable[[int], None] | None = None) -> list[GenOutput]:
        """Generate for all requests (``add`` + ``step`` until done); outputs in request order."""
        if self.busy:
            raise RuntimeError("generate() called while requests added with add() are still running; "
                               "step() until busy is False first")
        where = {rid: i for i, rid in enumerate(self.add(requests))}
        outputs: list[GenOutput | None] = [None] * len(requests)
        while self.busy:
            done = self.step()
            for rid, out in done:
                outputs[where[rid]] = out
            if done and on_progress is not None:
                on_progress(len(done))
        return outputs  # type: ignore[return-value]

    # ---- the fast loop ----------------------------------------------------------------------

    def _step_fast(self) -> list[tuple[int, GenOutput]]:
        self._admit()
        if not self._rows:
            return []
        temps, top_p, top_k, filters = self._sampling_params()
        u = torch.tensor([r.u[len(r.tokens)] for r in self._rows])  # [n]
        tok, lp = _sample(self._logits, temps, top_p, top_k, None, filters=filters, u=u)  # [n], [n]
        finished: list[int] = []
        for j, (row, t, l) in enumerate(zip(self._rows, tok.tolist(), lp.tolist())):
            row.tokens.append(t)
            row.logps.append(l)
            if self._done(row):
                finished.append(j)
        outputs = [(self._rows[j].id, self._output(self._rows[j])) for j in finished]
        if finished:
            tok = self._drop(finished, tok)
        if not self._rows:  # nothing left: free the cache until the next request
            self._dec, self._logits = None, None
            return outputs
        self._logits = self._dec.step(tok.to(self.device))  # type: ignore[union-attr]
        return outputs

    def _admit(self) -> None:
        """Prefill queued requests into new cache rows at the end of the running batch."""
        room = self.max_batch_size - len(self._rows)
        if not self._queue or room <= 0:
            return
        new = [self._queue.popleft() for _ in range(min(room, len(self._queue)))]
        if self._dec is None:
            fused = _fused_weights(self.model, self._fused_cache) if self.fuse else None
            self._dec = _FastDecoder(self.model, fused)
        prompts = [r.req.prompt_ids for r in new]
        logits = self._dec.prefill(prompts, len(self._rows), [r.req.sampling.max_new_tokens for r in new],
                                   share_prefix=self.share_prefix)  # [k, V]
        self._logits = logits if self._logits is None or not self._rows else torch.cat([self._logits, logits])
        self._rows += new
        self._params = None

    def _drop(self, finished: list[int], tok: torch.Tensor) -> torch.Tensor:
        """Remove finished rows: the last running rows move into their places (their cache rows are copied)."""
        n = len(self._rows)
        gone = set(finished)
        keep_n = n - len(gone)
        src = [j for j in range(keep_n, n) if j not in gone]  # running rows past the new end
        dst = [j for j in finished if j < keep_n]  # holes inside the new batch
        if src:
            self._dec.move(src, dst)  # type: ignore[union-attr]
            s, d = torch.tensor(src), torch.tensor(dst)
            tok[d] = tok[s]
            for a, b in zip(src, dst):
                self._rows[b] = self._rows[a]
        self._rows = self._rows[:keep_n]
        self._params = None
        return tok[:keep_n]

    def _sampling_params(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
        if self._params is None:
            s = [r.req.sampling for r in self._rows]
            top_p = torch.tensor([x.top_p for x in s])
            top_k = torch.tensor([x.top_k for x in s])
            self._params = (torch.tensor([x.temperature for x in s]), top_p, top_k,
                            bool((top_p < 1).any() or (top_k > 0).any()))
        return self._params

    def _done(self, row: _Row) -> bool:
        """Whether ``row`` ends with its last token (sets its finish reason)."""
        s = row.req.sampling
        if not s.ignore_eos:
            # The end-of-turn token is kept: the learner trains on it, so the model learns to stop.
            if row.tokens[-1] in self.stop_ids or (s.stop and _hits_stop(self.tokenizer, row.tokens, s.stop)):
                row.finish = "stop"
                return True
        return len(row.tokens) >= s.max_new_tokens

    def _output(self, row: _Row) -> GenOutput:
        return GenOutput(row.tokens, row.logps, self.tokenizer.decode(row.tokens, skip_special_tokens=True), row.finish)

    # ---- the generic loop -------------------------------------------------------------------

    def _step_generic(self) -> list[tuple[int, GenOutput]]:
        rows = [self._queue.popleft() for _ in range(min(self.max_batch_size, len(self._queue)))]
        if not rows:
            return []
        self._rows = rows  # so that busy stays True while decoding (and reset() can clear it)
        try:
            self._decode(rows)
        finally:
            self._rows = []
        return [(r.id, self._output(r)) for r in rows]

    def _decode(self, rows: list[_Row]) -> None:
        reqs = [r.req for r in rows]
        ids, attn = _left_pad(reqs, self.pad_id)  # [B, L], [B, L]
        ids, attn = ids.to(self.device), attn.to(self.device)
        temps = torch.tensor([r.sampling.temperature for r in reqs])  # [B]
        top_p = torch.tensor([r.sampling.top_p for r in reqs])  # [B]
        top_k = torch.tensor([r.sampling.top_k for r in reqs])  # [B]
        alive = torch.arange(len(rows))  # original row index of each row still in the batch
        cache = DynamicCache()
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # [B, L]
        names = [r.adapter or "__base__" for r in reqs]  # PEFT's name for "no adapter"
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=cache, use_cache=True,
                         **self._adapter_kwargs(names, alive))
        logits = out.logits[:, -1, :].float()  # [B, V]
        while True:
            u = torch.tensor([rows[b].u[len(rows[b].tokens)] for b in alive.tolist()])
            tok, lp = _sample(logits, temps[alive], top_p[alive], top_k[alive], None, u=u)
            keep = []
            for j, b in enumerate(alive.tolist()):
                rows[b].tokens.append(int(tok[j]))
                rows[b].logps.append(float(lp[j]))
                if not self._done(rows[b]):
                    keep.append(j)
            if not keep:
                return
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
            generator: torch.Generator | None, filters: bool | None = None,
            u: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return (tokens [b], log-probs [b] under softmax(logits/T)).

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
        return _sample_filtered(logits, temps, top_p, top_k, u)
    greedy = temps == 0
    t = torch.where(greedy, torch.ones_like(temps), temps).to(logits.dtype)
    scaled = logits.cpu()
    scaled = scaled / t[:, None] if bool((t != 1).any()) else scaled  # [b, V]
    m = scaled.amax(dim=-1, keepdim=True)  # [b, 1]
    if bool(greedy.all()):
        tok = scaled.argmax(-1)
        lse = m + (scaled - m).exp_().sum(-1, keepdim=True).log_()
    else:
        cum = (scaled - m).exp_().cumsum_(dim=-1)  # [b, V] unnormalised CDF
        total = cum[:, -1:]  # [b, 1]
        tok = torch.searchsorted(cum, u.view(-1, 1).to(cum.dtype) * total, right=True)
        tok = tok.clamp_(max=scaled.shape[-1] - 1).view(-1)
        if bool(greedy.any()):
            tok = torch.where(greedy, scaled.argmax(-1), tok)
        lse = m + total.log()
    return tok, (scaled.gather(1, tok.view(-1, 1)) - lse).view(-1)


def _sample_filtered(logits: torch.Tensor, temps: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
                     u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_sample` with top-k / top-p truncation (the log-prob is still under the untruncated softmax)."""
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
    cum = torch.softmax(filtered, dim=-1).cumsum_(dim=-1)  # [b, V]
    sampled = torch.searchsorted(cum, u.view(-1, 1).to(cum.dtype) * cum[:, -1:], right=True)
    sampled = sampled.clamp_(max=filtered.shape[-1] - 1).view(-1)  # [b]
    tok = torch.where(greedy, scaled.argmax(-1), sampled)
    return tok, logp.gather(1, tok.view(-1, 1)).view(-1)


class _FastDecoder:
    """A continuous-batching decode loop for Llama-style decoders over a preallocated KV cache.

    Keys and values live in buffers of shape ``[layers, rows, kv_heads, columns, head_dim]``.
    Row ``b`` holds one request, its tokens in columns ``0 .. lens[b]-1`` (column = position id),
    so rows of different lengths sit side by side and a new request is written into a free row
    without touching the others. Every forward (a prefill of many tokens per row, or a decode
    step of one) runs the model's own modules layer by layer: it writes each row's new keys and
    values at that row's next columns, then attends over the filled columns with a boolean mask
    (column ``c`` is visible to the token at position ``p`` iff ``c <= p``; stale or padded
    columns past a row's length are never visible). The running rows are ``0 .. n-1``; the
    engine keeps them dense with :meth:`move`. Buffers grow (rows and columns) as requests need.
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

    def __init__(self, model, fused: list | None = None) -> None:
        self.model = model
        self.inner = model.model
        cfg = model.config
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scale = self.inner.layers[0].self_attn.scaling
        p = next(model.parameters())
        self.dtype, self.device = p.dtype, p.device
        self.k = self.v = torch.empty((len(self.inner.layers), 0, self.n_kv, 0, self.head_dim), dtype=p.dtype,
                                      device=p.device)
        self.lens = torch.zeros(0, dtype=torch.long, device=p.device)  # filled columns of each row
        self.fused = fused

    def reserve(self, rows: int, cols: int) -> None:
        """Grow the buffers to at least ``rows`` x ``cols`` (in steps, copying the filled part)."""
        R, C = self.k.shape[1], self.k.shape[3]
        if rows <= R and cols <= C:
            return
        R2, C2 = max(rows, R), max(cols, C)
        if C2 > C:
            C2 = max(C2, C + C // 4)
            C2 = -(-C2 // 64) * 64
        if R2 > R:
            R2 = max(R2, min(2 * R, rows + 16))
        shape = (self.k.shape[0], R2, self.n_kv, C2, self.head_dim)
        # Zeros, not empty: masked columns still enter the attention product (weight 0), and
        # 0 * NaN from uninitialised memory would be NaN.
        k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        v = torch.zeros(shape, dtype=self.dtype, device=self.device)
        filled = int(self.lens.max()) if len(self.lens) else 0
        k[:, :R, :, :filled] = self.k[:, :, :, :filled]
        v[:, :R, :, :filled] = self.v[:, :, :, :filled]
        self.k, self.v = k, v
        lens = torch.zeros(R2, dtype=torch.long, device=self.device)
        lens[:R] = self.lens
        self.lens = lens

    def prefill(self, prompts: list[list[int]], first: int, max_new: list[int], *, share_prefix: int = 0) -> torch.Tensor:
        """Write ``prompts`` into rows ``first, first+1, ...``; returns their next-token logits [k, V] in fp32.

        Identical prompts (a GRPO group's first calls) are run once and their cache rows copied.
        With ``share_prefix > 0``, distinct prompts whose common prefix has at least that many
        tokens are grouped: the prefix is run once per group, copied into every member's row, and
        only the rest of each prompt is run (one batched forward for all of them).
        """
        k = len(prompts)
        uniq: dict[tuple[int, ...], int] = {}
        inv = [uniq.setdefault(tuple(p), len(uniq)) for p in prompts]  # distinct-prompt index of each prompt
        distinct = [list(p) for p in uniq]
        rows = first + torch.tensor([inv.index(i) for i in range(len(distinct))])  # row of each distinct prompt
        starts = [0] * len(distinct)
        groups = _prefix_groups(distinct, share_prefix) if share_prefix > 0 else []
        cols = max(len(p) + m for p, m in zip(prompts, max_new))
        self.reserve(first + k, cols + max(map(len, prompts)))  # + room for padded tokens of the prefill
        self.lens[first : first + k] = 0
        if groups:  # run each group's prefix in its first member's row, copy it to the others
            heads = [g[0] for g, _ in groups]
            self._run([distinct[h][:P] for h, (_, P) in zip(heads, groups)], rows[heads], [0] * len(heads))
            for g, P in groups:
                self._copy(rows[g[:1] * (len(g) - 1)], rows[g[1:]], P)
                for i in g:
                    starts[i] = P
        h = self._run([p[s:] for p, s in zip(distinct, starts)], rows, starts)  # [d, H]
        dup = [b for b in range(k) if rows[inv[b]] != first + b]
        if dup:
            self._copy(rows[[inv[b] for b in dup]], first + torch.tensor(dup), max(map(len, prompts)))
            self.lens[first + torch.tensor(dup)] = self.lens[rows[[inv[b] for b in dup]]]
        return self.model.lm_head(h).float()[inv]

    def _run(self, seqs: list[list[int]], rows: torch.Tensor, starts: list[int]) -> torch.Tensor:
        """Run token sequences (right-padded) after ``starts`` cached columns of ``rows``; returns each last hidden state."""
        T = max(map(len, seqs))
        ids = torch.zeros((len(seqs), T), dtype=torch.long)
        for b, s in enumerate(seqs):
            ids[b, : len(s)] = torch.tensor(s)
        start = torch.tensor(starts, device=self.device)
        h = self._forward(ids.to(self.device), rows.to(self.device), start)  # [b, T, H]
        n = torch.tensor([len(s) for s in seqs], device=self.device)
        self.lens[rows] = start + n
        return h[torch.arange(len(seqs), device=self.device), n - 1]

    def _copy(self, src: torch.Tensor, dst: torch.Tensor, cols: int) -> None:
        self.k[:, dst, :, :cols] = self.k[:, src, :, :cols]
        self.v[:, dst, :, :cols] = self.v[:, src, :, :cols]

    def move(self, src: list[int], dst: list[int]) -> None:
        """Copy rows ``src`` (cache and length) into rows ``dst``."""
        s, d = torch.tensor(src, device=self.device), torch.tensor(dst, device=self.device)
        self._copy(s, d, int(self.lens[s].max()))
        self.lens[d] = self.lens[s]

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        """Feed one token to each of rows ``0 .. n-1`` (n = len(tok)); returns their next logits [n, V] in fp32."""
        n = tok.shape[0]
        if int(self.lens[:n].max()) >= self.k.shape[3]:
            raise RuntimeError("fast decoder capacity exceeded")
        h = self._forward(tok.view(n, 1), slice(0, n), self.lens[:n])
        self.lens[:n] += 1
        return self.model.lm_head(h[:, -1]).float()

    def _forward(self, ids: torch.Tensor, rows: slice | torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Tokens ``ids`` [B, T] at positions ``start + 0..T-1`` of ``rows``; returns final hidden states [B, T, H]."""
        B, T = ids.shape
        pos = start[:, None] + torch.arange(T, device=ids.device)  # [B, T]
        cmax = int(pos.max()) + 1
        mask = (torch.arange(cmax, device=ids.device) <= pos[:, :, None])[:, None]  # [B, 1, T, cmax]
        where = (torch.arange(rows.start, rows.stop, device=ids.device) if isinstance(rows, slice) else rows)[:, None]
        h = self.inner.embed_tokens(ids)  # [B, T, H]
        cos, sin = self.inner.rotary_emb(h, pos)  # [B, T, D]
        cos, sin = cos[:, :, None], sin[:, :, None]  # [B, T, 1, D]
        g = self.n_heads // self.n_kv
        D = self.head_dim
        nq, nk = self.n_heads * D, self.n_kv * D
        for i, layer in enumerate(self.inner.layers):
            a = layer.self_attn
            x = layer.input_layernorm(h)
            if self.fused is not None:
                w_qkv, b_qkv, w_gu = self.fused[i]
                qkv = F.linear(x, w_qkv, b_qkv)
                q, k, v = qkv[..., :nq], qkv[..., nq : nq + nk], qkv[..., nq + nk :]
            else:
                q, k, v = a.q_proj(x), a.k_proj(x), a.v_proj(x)
            q = q.reshape(B, T, self.n_heads, D)
            k = k.reshape(B, T, self.n_kv, D)
            if hasattr(a, "q_norm"):
                q, k = a.q_norm(q), a.k_norm(k)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            self.k[i][where, :, pos] = k  # row b's tokens at its own columns
            self.v[i][where, :, pos] = v.reshape(B, T, self.n_kv, D)
            keys, values = self.k[i, rows, :, :cmax], self.v[i, rows, :, :cmax]  # [B, n_kv, cmax, D]
            if T == 1:  # query heads packed per kv head (head h uses kv head h // g): no repeated keys
                o = F.scaled_dot_product_attention(q.view(B, self.n_kv, g, D), keys, values, attn_mask=mask,
                                                   scale=self.scale)  # [B, n_kv, g, D]
                o = o.reshape(B, 1, nq)
            else:
                o = F.scaled_dot_product_attention(q.transpose(1, 2), keys.repeat_interleave(g, 1),
                                                   values.repeat_interleave(g, 1), attn_mask=mask,
                                                   scale=self.scale)  # [B, heads, T, D]
                o = o.transpose(1, 2).reshape(B, T, nq)
            h = h + a.o_proj(o)
            x = layer.post_attention_layernorm(h)
            if self.fused is not None and w_gu is not None:
                gate, up = F.linear(x, w_gu).chunk(2, dim=-1)
                h = h + layer.mlp.down_proj(layer.mlp.act_fn(gate) * up)
            else:
                h = h + layer.mlp(x)
        return self.inner.norm(h)


def _prefix_groups(prompts: list[list[int]], min_len: int) -> list[tuple[list[int], int]]:
    """Groups of at least two prompts sharing a prefix of >= ``min_len`` tokens: (indices, prefix length).

    Prompts are sorted so that those with long common prefixes are adjacent; a group's prefix is
    the shortest adjacent common prefix in it, and stops one token short of its shortest prompt
    (every prompt keeps a token to run, whose hidden state gives the next-token logits).

    >>> _prefix_groups([[1, 2, 3, 4], [9, 9], [1, 2, 3, 5]], 2)
    [([0, 2], 3)]
    """
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    groups: list[tuple[list[int], int]] = []
    cur, P = [order[0]], len(prompts[order[0]]) - 1
    for i in order[1:] + [-1]:
        n = _common(prompts[cur[-1]], prompts[i]) if i >= 0 else 0
        n = min(P, n, len(prompts[i]) - 1)
        if i >= 0 and n >= min_len:
            cur.append(i)
            P = n
            continue
        if len(cur) >= 2:
            groups.append((sorted(cur), P))
        if i >= 0:
            cur, P = [i], len(prompts[i]) - 1
    return groups


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


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


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
