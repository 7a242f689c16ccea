"""The ``hf`` engine's fast decode loop: continuous batching over a preallocated KV cache for
Llama-style decoders (see :mod:`teamrl.engines.hf` for how the engine drives it)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from teamrl.allocator import release_before
from teamrl.engines.cpu import attention as cpu_attention
from teamrl.engines.cpu.fused_step import fused_step
from teamrl.engines.decode_weights import DecodeWeights, packed_linear
from teamrl.engines.layer_ops import call_module, exact_rms_norm, rms_norm, rope, torch_decode_attention
from teamrl.engines.prefixes import PrefixStore, prefix_groups


class FastDecoder:
    """A continuous-batching decode loop for Llama-style decoders over a preallocated KV cache.

    Keys and values live in buffers of shape ``[layers, rows, kv_heads, columns, head_dim]``.
    Row ``b`` holds one request, its tokens in columns ``0 .. lens[b]-1`` (column = position id),
    so rows of different lengths sit side by side and a new request is written into a free row
    without touching the others. Every forward (a prefill of many tokens per row, or a decode
    step of one) runs the model's own modules layer by layer: it writes each row's new keys and
    values at that row's next columns, then attends over the filled columns (column ``c`` is
    visible to the token at position ``p`` iff ``c <= p``; stale or padded columns past a row's
    length are never visible): a causal mask for fresh prefills, on CPU the C kernel of
    :mod:`~teamrl.engines.cpu.attention` for decode steps (given each row's length), a boolean
    mask otherwise. The running rows are ``0 .. n-1``; the engine keeps them dense with
    :meth:`move`. Buffers grow (rows and columns) as requests need.
    """

    ARCHS = ("llama", "mistral", "qwen2", "qwen3")

    @staticmethod
    def supports(model) -> bool:
        cfg = getattr(model, "config", None)
        inner = getattr(model, "model", None)
        if cfg is None or inner is None or getattr(cfg, "model_type", None) not in FastDecoder.ARCHS:
            return False
        if getattr(cfg, "use_sliding_window", False) or getattr(cfg, "sliding_window", None) is not None:
            return False
        need = ("embed_tokens", "layers", "norm", "rotary_emb")
        if not all(hasattr(inner, n) for n in need) or not hasattr(model, "lm_head"):
            return False
        layer = inner.layers[0]
        return all(hasattr(layer.self_attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")) and \
            hasattr(layer, "input_layernorm") and hasattr(layer, "post_attention_layernorm")

    def __init__(self, model, weights: DecodeWeights | None = None, attention_kernel: bool = False,
                 fused_step: bool = True, work: dict | None = None) -> None:
        """``weights``: fused / packed copies of the linear weights (None: the model's own modules).
        ``attention_kernel``: decode steps on CPU try :mod:`~teamrl.engines.cpu.attention`'s C kernel (where it
        builds; the engine's ``cpu_kernel``); False: torch's attention, and the library is never loaded.
        ``fused_step``: with that kernel, the work between the products runs in the library's fused calls: decode
        steps with prepacked weights in :func:`~teamrl.engines.cpu.fused_step.fused_step`, prefills' residual adds + norms and ``silu * up``
        (see :meth:`can_fuse_step`); False: torch's operations. ``work``: the owner's counts, whose
        ``prefill_tokens`` the prefills add the tokens they run to (:class:`~teamrl.engines.work.Work`)."""
        self.model = model
        self.work = work
        # prefixes prefilled earlier with the current weights, reused by prefill(); the owner sets it before each
        # prefill and keeps it valid (cleared when the weights change: HFEngine.prefix_store)
        self.store: PrefixStore | None = None
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
        self.weights = weights  # None: the model's own modules, unfused
        self.qk_norm = hasattr(self.inner.layers[0].self_attn, "q_norm")  # Qwen3
        self.attn_lib = None  # decode steps on CPU: teamrl.engines.cpu.attention's kernel where it builds
        if attention_kernel and cpu_attention.supports(self.dtype, self.device, self.n_heads, self.n_kv, self.head_dim):
            self.attn_lib = cpu_attention.load()
        self.exact_norm = exact_rms_norm(self.inner.norm)
        layers = self.inner.layers
        # the norm applied after each layer's residual stream: the next layer's input norm, the final norm last
        self.norm_after = [layer.input_layernorm for layer in layers[1:]] + [self.inner.norm]
        self.fused_step = fused_step and self.can_fuse_step()

    def can_fuse_step(self) -> bool:
        """Whether the library's fused calls apply (:func:`~teamrl.engines.cpu.fused_step.fused_step`, and in prefills): the C library loaded,
        fused q/k/v and gate/up weights, Llama-style RMSNorms (:func:`exact_rms_norm`), SiLU gated MLPs, no q/k
        norms (Qwen3)."""
        cfg = self.model.config
        return self.attn_lib is not None and self.weights is not None and self.exact_norm and not self.qk_norm \
            and getattr(cfg, "hidden_act", None) in ("silu", "swish") \
            and all(f is not None and f[2] is not None for f in self.weights.fused)

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
        if self.device.type == "cpu":  # the earlier calls' buffers, freed, do not hold a larger one: give them back
            release_before(2 * self.k.element_size() * torch.Size(shape).numel())
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

    @staticmethod
    def columns_for(prompts: list[list[int]], max_new: list[int]) -> int:
        """Cache columns that prefilling ``prompts`` and decoding ``max_new`` tokens each needs: the longest
        prompt + reply, plus room for the padded tokens of the prefill."""
        return max(len(p) + m for p, m in zip(prompts, max_new)) + max(map(len, prompts))

    def prefill(self, prompts: list[list[int]], first: int, max_new: list[int], *, share_prefix: int = 0) -> torch.Tensor:
        """Write ``prompts`` into rows ``first, first+1, ...``; returns their next-token logits [k, V] (model dtype).

        Identical prompts (a GRPO group's first calls) are run once and their cache rows copied.
        With ``share_prefix > 0``, distinct prompts whose common prefix has at least that many
        tokens are grouped: the prefix is run once per group, copied into every member's row, and
        only the rest of each prompt is run (one batched forward for all of them). With a
        :class:`PrefixStore` (``store``), prefixes prefilled by earlier calls with the same weights are
        copied from it instead of run again: a group's prefix, or the start of an ungrouped prompt, that
        shares at least ``share_prefix`` tokens with a stored one runs only the tokens after them; every
        group prefix run is stored.
        """
        k = len(prompts)
        uniq: dict[tuple[int, ...], int] = {}
        inv = [uniq.setdefault(tuple(p), len(uniq)) for p in prompts]  # distinct-prompt index of each prompt
        distinct = [list(p) for p in uniq]
        rows = first + torch.tensor([inv.index(i) for i in range(len(distinct))])  # row of each distinct prompt
        starts = [0] * len(distinct)
        groups = prefix_groups(distinct, share_prefix) if share_prefix > 0 else []
        store = self.store if share_prefix > 0 else None
        self.reserve(first + k, self.columns_for(prompts, max_new))
        self.lens[first : first + k] = 0
        runs = []  # (head, from, to): the group prefixes' tokens not found in the store
        for g, P in groups:  # run each group's prefix in its first member's row, copy it to the others
            c = self._from_store(store, distinct[g[0]], P, int(rows[g[0]]))
            if c < P:
                runs.append((g[0], c, P))
            for i in g:
                starts[i] = P
        if runs:
            self._run([distinct[i][c:P] for i, c, P in runs], rows[[i for i, _, _ in runs]], [c for _, c, _ in runs])
            if store is not None:
                for i, _, P in runs:
                    r = int(rows[i])
                    store.put(tuple(distinct[i][:P]), self.k[:, r, :, :P].clone(), self.v[:, r, :, :P].clone())
        for g, P in groups:
            self._copy(rows[g[:1] * (len(g) - 1)], rows[g[1:]], P)
        if store is not None:  # prompts in no group: the start of each from the store, where it has it
            grouped = {i for g, _ in groups for i in g}
            for i, p in enumerate(distinct):
                if i not in grouped:
                    starts[i] = self._from_store(store, p, len(p) - 1, int(rows[i]))
        h = self._run([p[s:] for p, s in zip(distinct, starts)], rows, starts)  # [d, H]
        dup = [b for b in range(k) if rows[inv[b]] != first + b]
        if dup:
            self._copy(rows[[inv[b] for b in dup]], first + torch.tensor(dup), max(map(len, prompts)))
            self.lens[first + torch.tensor(dup)] = self.lens[rows[[inv[b] for b in dup]]]
        return self.model.lm_head(h)[inv]

    def _from_store(self, store: PrefixStore | None, tokens: list[int], limit: int, row: int) -> int:
        """Copy the stored prefix sharing the most of ``tokens[:limit]`` (at least the store's minimum) into ``row``;
        returns how many columns it filled (0: none)."""
        if store is None:
            return 0
        k, v, n = store.match(tokens, limit)
        if n:
            self.k[:, row, :, :n] = k[:, :, :n]
            self.v[:, row, :, :n] = v[:, :, :n]
        return n

    def _run(self, seqs: list[list[int]], rows: torch.Tensor, starts: list[int]) -> torch.Tensor:
        """Run token sequences (right-padded) after ``starts`` cached columns of ``rows``; returns each last hidden state."""
        T = max(map(len, seqs))
        if self.work is not None:
            self.work["prefill_tokens"] += sum(map(len, seqs))
        ids = torch.zeros((len(seqs), T), dtype=torch.long)
        for b, s in enumerate(seqs):
            ids[b, : len(s)] = torch.tensor(s)
        start = torch.tensor(starts, device=self.device)
        n = torch.tensor([len(s) for s in seqs], device=self.device)
        h = self._forward(ids.to(self.device), rows.to(self.device), start, n)  # [b, H]
        self.lens[rows] = start + n
        return h

    def _copy(self, src: torch.Tensor, dst: torch.Tensor, cols: int) -> None:
        self.k[:, dst, :, :cols] = self.k[:, src, :, :cols]
        self.v[:, dst, :, :cols] = self.v[:, src, :, :cols]

    def move(self, src: list[int], dst: list[int], cols: int | None = None) -> None:
        """Copy rows ``src`` (cache and length) into rows ``dst``: their first ``cols`` columns (None: as many as
        the longest of them fills, read from the device; a caller that knows it saves that synchronisation)."""
        s, d = torch.tensor(src, device=self.device), torch.tensor(dst, device=self.device)
        self._copy(s, d, int(self.lens[s].max()) if cols is None else min(cols, self.k.shape[3]))
        self.lens[d] = self.lens[s]

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        """Feed one token to each of rows ``0 .. n-1`` (n = len(tok)); returns their next logits [n, V] (model dtype;
        :func:`~teamrl.engines.sampling.sample` computes in fp32)."""
        n = tok.shape[0]
        if int(self.lens[:n].max()) >= self.k.shape[3]:
            raise RuntimeError("fast decoder capacity exceeded")
        packed, head = self.weights.for_step(n) if self.weights is not None else (None, None)
        if self.fused_step and packed is not None:
            x = fused_step(self, tok, packed)
            self.lens[:n] += 1
            return packed_linear(x, head, self.model.lm_head.bias) if head is not None else self.model.lm_head(x)
        h = self._forward(tok.view(n, 1), slice(0, n), self.lens[:n])
        self.lens[:n] += 1
        if head is not None:
            return packed_linear(h[:, -1], head, self.model.lm_head.bias)
        return self.model.lm_head(h[:, -1])

    def _add_norm(self, lib, h: torch.Tensor, d: torch.Tensor | None, m, out: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream ``h + d`` (``d`` None: ``h``) and its norm by module ``m``: (stream, normed). With the
        fused step's library ``lib``, one of its calls: ``h`` updated in place and the norm written into ``out``
        (the same shape); otherwise torch's operations, new tensors."""
        if lib is None:
            h = h if d is None else h + d
            return h, (rms_norm if self.exact_norm else call_module)(m, h)
        assert out is not None
        h2 = h.view(-1, h.shape[-1])
        cpu_attention.add_rms_norm(lib, h2, None if d is None else d.reshape(h2.shape), m.weight, m.variance_epsilon,
                                   out.view_as(h2))
        return h, out

    def _forward(self, ids: torch.Tensor, rows: slice | torch.Tensor, start: torch.Tensor,
                 n: torch.Tensor | None = None) -> torch.Tensor:
        """Tokens ``ids`` [B, T] at positions ``start + 0..T-1`` of ``rows``; returns final hidden states [B, T, H].

        ``n`` (a prefill): each row's number of real tokens, right padding after them; returns the hidden state
        of each row's last real token [B, H]. Where padding is more than :data:`PAD_SHARE` of the tokens, the
        layers' products, norms and MLP run over the real tokens only (packed one after another); only the
        attention sees the padded layout.
        """
        B, T = ids.shape
        pos = start[:, None] + torch.arange(T, device=ids.device)  # [B, T]
        cmax = int(pos.max()) + 1
        where = (torch.arange(rows.start, rows.stop, device=ids.device) if isinstance(rows, slice) else rows)[:, None]
        h = self.inner.embed_tokens(ids)  # [B, T, H]
        cos, sin = self.inner.rotary_emb(h, pos)  # [B, T, D]
        g = self.n_heads // self.n_kv
        D = self.head_dim
        nq = self.n_heads * D
        # rotate_half(x) * sin == roll(x, D/2) * ssin, ssin = sin with its first half negated (exactly)
        cos, ssin = cos[:, :, None], torch.cat([-sin[..., : D // 2], sin[..., D // 2 :]], -1)[:, :, None]
        real: torch.Tensor | None = None  # packed prefill: the indices of the real tokens in the B * T layout
        if n is not None and T > 1 and B * T - int(n.sum()) > PAD_SHARE * B * T:
            real = (torch.arange(T, device=ids.device) < n[:, None]).view(-1).nonzero().squeeze(1)  # [N]
            h, cos, ssin = (t.reshape((B * T,) + t.shape[2:])[real][None] for t in (h, cos, ssin))  # [1, N, ...]
            tok_rows, tok_pos = where.expand(B, T).reshape(-1)[real], pos.reshape(-1)[real]
        decode = T == 1 and isinstance(rows, slice)
        fresh = not decode and T > 1 and not bool(start.any())  # every row starts at column 0
        mask: torch.Tensor | None = None  # column c visible to position p iff c <= p: [B, 1, T, cmax], built where used
        k_all: Sequence[torch.Tensor] | torch.Tensor = ()  # per layer: unbound tensors, or one [L, ...] view
        v_all: Sequence[torch.Tensor] | torch.Tensor = ()
        if not fresh and not (decode and self.attn_lib is not None):
            mask = (torch.arange(cmax, device=ids.device) <= pos[:, :, None])[:, None]
        if decode:  # per-forward views and indices shared by every layer
            C = self.k.shape[3]
            flat = ((where * self.n_kv + torch.arange(self.n_kv, device=ids.device)) * C + pos)  # [B, n_kv]
            k_flat, v_flat = self.k.view(self.k.shape[0], -1, D), self.v.view(self.k.shape[0], -1, D)
            if self.attn_lib is not None:  # the whole cache of each layer, with each row's visible columns
                k_all, v_all = self.k.unbind(0), self.v.unbind(0)
                visible = pos[:, 0] + 1
            else:
                k_all, v_all = self.k[:, rows, :, :cmax], self.v[:, rows, :, :cmax]  # views [L, B, n_kv, cmax, D]
                if self.device.type == "cpu" and mask is not None:  # torch's CPU kernel takes an additive mask: once
                    mask = torch.zeros(mask.shape, dtype=self.dtype, device=ids.device).masked_fill_(~mask, -torch.inf)
        packed = self.weights.for_step(B)[0] if self.weights is not None and T == 1 else None
        layers = self.inner.layers
        # a prefill with the fused step's library: residual adds + norms and silu * up as its calls, h updated in place
        glue = self.attn_lib if self.fused_step and T > 1 else None
        h, x = self._add_norm(glue, h, None, layers[0].input_layernorm, torch.empty_like(h) if glue is not None else None)
        for i, layer in enumerate(layers):
            a = layer.self_attn
            packed_i = packed[i] if packed is not None else None
            q, k, v = self._qkv(i, layer, x, cos, ssin, packed_i)
            if decode:  # query heads packed per kv head (head h uses kv head h // g): no repeated keys
                k_flat[i].index_put_((flat,), k[:, 0])  # row b's token at its own column
                v_flat[i].index_put_((flat,), v[:, 0])
                if self.attn_lib is not None:
                    o = cpu_attention.decode_attention(self.attn_lib, q.view(B, self.n_kv, g, D), k_all[i], v_all[i],
                                                       visible, self.scale)
                else:
                    o = torch_decode_attention(q.view(B, self.n_kv, g, D), k_all[i], v_all[i], mask, self.scale)
                o = o.reshape(B, 1, nq)  # [B, n_kv, g, D] -> [B, 1, heads * D]
            else:  # a prefill: keys and values at each token's own column of its row, attention in the padded layout
                if real is not None:  # packed real tokens
                    self.k[i][tok_rows, :, tok_pos] = k[0]
                    self.v[i][tok_rows, :, tok_pos] = v[0]
                    q = _unpack(q, real, B, T)
                    if fresh:  # a fresh prefill attends over its own keys and values, not the cache's
                        k, v = _unpack(k, real, B, T), _unpack(v, real, B, T)
                else:
                    self.k[i][where, :, pos] = k
                    self.v[i][where, :, pos] = v
                o = self._attend(i, rows, q, k if fresh else None, v if fresh else None, mask, cmax)
                if real is not None:
                    o = o.reshape(B * T, nq)[real][None]  # [1, N, heads * D]
            o = a.o_proj(o) if packed_i is None else packed_linear(o, packed_i[1], a.o_proj.bias)
            h, x = self._add_norm(glue, h, o, layer.post_attention_layernorm, x)
            h, x = self._add_norm(glue, h, self._mlp(i, layer, x, packed_i, glue), self.norm_after[i], x)
        h = x  # the final norm's output
        if n is None:
            return h
        if real is not None:
            return h[0, n.cumsum(0) - 1]
        return h[torch.arange(B, device=ids.device), n - 1]

    def _attend(self, i: int, rows: slice | torch.Tensor, q: torch.Tensor, k: torch.Tensor | None,
                v: torch.Tensor | None, mask: torch.Tensor | None, cmax: int) -> torch.Tensor:
        """A prefill's attention of layer ``i`` in the padded layout, [B, T, heads * D]: queries ``q`` [B, T, heads, D]
        over their own keys and values ``k``, ``v`` [B, T, kv, D] (a fresh prefill: causal), or over the cache
        columns ``0 .. cmax-1`` of ``rows`` with the boolean ``mask`` (a prefill that continues cached columns)."""
        B, T = q.shape[:2]
        g = self.n_heads // self.n_kv
        if k is not None and v is not None:
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True, scale=self.scale, enable_gqa=True)
        else:
            keys, values = self.k[i, rows, :, :cmax], self.v[i, rows, :, :cmax]  # [B, n_kv, cmax, D]
            if self.device.type == "cpu":  # the CPU kernel reads each kv head for its g query heads
                o = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask,
                                                   scale=self.scale, enable_gqa=True)  # [B, heads, T, D]
            else:  # on CUDA, grouped heads with a mask would fall back to the unfused math kernel
                o = F.scaled_dot_product_attention(q.transpose(1, 2), keys.repeat_interleave(g, 1),
                                                   values.repeat_interleave(g, 1), attn_mask=mask, scale=self.scale)
        return o.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)

    def _qkv(self, i: int, layer, x: torch.Tensor, cos: torch.Tensor, ssin: torch.Tensor,
             packed_i: tuple | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer ``i``'s queries and keys (rotated; Qwen3: normed first) [B, T, heads, D], [B, T, kv, D] and values
        [B, T, kv, D] for normed hidden states ``x`` [B, T, H]: one fused matmul where the decode weights have
        one (``packed_i``: its prepacked copies), else the module's three."""
        a, (B, T), D = layer.self_attn, x.shape[:2], self.head_dim
        nq, nk = self.n_heads * D, self.n_kv * D
        fused = self.weights.fused[i] if self.weights is not None else None
        if fused is None:
            q, k, v = a.q_proj(x), a.k_proj(x), a.v_proj(x)
        else:
            w_qkv, b_qkv, _ = fused
            qkv = F.linear(x, w_qkv, b_qkv) if packed_i is None else packed_linear(x, packed_i[0], b_qkv)
            q, k, v = qkv[..., :nq], qkv[..., nq : nq + nk], qkv[..., nq + nk :]
        if fused is not None and not self.qk_norm:  # q and k are adjacent columns: rotate them together
            qk = rope(qkv[..., : nq + nk].view(B, T, self.n_heads + self.n_kv, D), cos, ssin)
            q, k = qk[:, :, : self.n_heads], qk[:, :, self.n_heads :]
        else:
            q, k = q.reshape(B, T, self.n_heads, D), k.reshape(B, T, self.n_kv, D)
            if self.qk_norm:
                q, k = a.q_norm(q), a.k_norm(k)
            q, k = rope(q, cos, ssin), rope(k, cos, ssin)
        return q, k, v.view(B, T, self.n_kv, D)

    def _mlp(self, i: int, layer, x: torch.Tensor, packed_i: tuple | None, lib=None) -> torch.Tensor:
        """Layer ``i``'s MLP of normed hidden states ``x``: fused gate/up where the decode weights have it; with
        ``lib`` (the fused step's library, a SiLU MLP), ``silu(gate) * up`` in one of its calls."""
        w_gu = self.weights.fused[i][2] if self.weights is not None else None
        if w_gu is None:
            return layer.mlp(x)
        m = layer.mlp
        if packed_i is None:
            gu = F.linear(x, w_gu)
            if lib is not None:
                gu2 = gu.view(-1, gu.shape[-1])
                act = torch.empty((gu2.shape[0], gu2.shape[1] // 2), dtype=gu.dtype)
                return m.down_proj(cpu_attention.silu_mul(lib, gu2, act).view(*gu.shape[:-1], -1))
            gate, up = gu.chunk(2, dim=-1)
            return m.down_proj(m.act_fn(gate) * up)
        gate, up = packed_linear(x, packed_i[2], None).chunk(2, dim=-1)
        return packed_linear(m.act_fn(gate) * up, packed_i[3], m.down_proj.bias)


PAD_SHARE = 0.05  # a prefill with more padding than this share of its tokens runs its real tokens packed


def _unpack(x: torch.Tensor, real: torch.Tensor, B: int, T: int) -> torch.Tensor:
    """Packed tokens ``x`` [1, N, ...] back in the padded layout [B, T, ...] (zeros at the padding)."""
    out = x.new_zeros((B * T,) + x.shape[2:])
    out[real] = x[0]
    return out.view((B, T) + x.shape[2:])
