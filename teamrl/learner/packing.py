"""Packed rows and shared prefixes: each token of a micro-batch computed once.

A micro-batch's rows (prompt + reply token ids) are laid end to end in one row with no padding
(:func:`pack_rows`). With ``share=True`` rows whose token ids start the same way share those
tokens: the rows form a prefix tree (a radix tree: each edge is a *segment*, a run of tokens with
one parent segment) laid out depth first, so the G copies of a group's prompt, or an agent's earlier
prompt that a later call extends, are computed once in the forward and once in the backward.

Attention follows the tree: a segment's tokens see every token of their ancestor segments and the
earlier tokens of their own segment, at positions equal to their depth (so RoPE sees each row's own
positions). That is exactly what each row sees when it is computed alone, so log-probs are the
row-by-row ones and the gradient of a shared token is the sum of the gradients the rows give it
(equal up to float summation order). :func:`tree_attention` attends each segment over (ancestors, own
tokens), segments of similar size batched into a few padded calls (:func:`buckets`): the cost is each
segment's length times its context, never the square of the packed row.

The attention function is registered with transformers under :data:`ATTENTION` and is installed on a
model by :func:`use_packed_attention`; calls without a layout (generation, export, anything else
that runs the model) fall through to transformers' own ``sdpa`` attention unchanged.

Left out: models whose attention is not ``sdpa`` (eager, flash, sliding windows are refused by the
config rules with the fix), and sharing across micro-batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

ATTENTION = "teamrl_packed"
"""The name of the packed attention in transformers' attention registry."""


@dataclass(frozen=True)
class Segment:
    """A run of tokens of the layout, ``[start, end)``, whose context is its ancestors' tokens."""

    start: int
    end: int
    context: tuple[int, ...]
    """Layout indices of every ancestor token, root first (empty for a root segment)."""


@dataclass(frozen=True)
class PackedLayout:
    """Rows laid out as one packed row."""

    ids: list[int]
    """[N] token ids of the layout."""
    positions: list[int]
    """[N] each token's position in its rows (its depth in the tree)."""
    segments: tuple[Segment, ...]
    """The layout's segments in order; together they cover ``[0, N)``."""
    index: list[list[int]]
    """Per row: the layout index of each of its tokens (``index[r][t]`` holds row r's token t)."""

    @property
    def computed(self) -> int:
        """Tokens the forward computes (N)."""
        return len(self.ids)

    def buckets(self, device: torch.device) -> list[Bucket]:
        """The padded attention calls of this layout on ``device`` (built once, then reused by every layer)."""
        cache = self.__dict__.setdefault("_buckets", {})
        if device not in cache:
            cache[device] = buckets(self, device)
        return cache[device]

    def plain(self, device: torch.device, heads: int) -> list[bool]:
        """Per bucket: whether :func:`_attend` computes it with plain matmuls (:func:`plain_buckets`; built once)."""
        cache = self.__dict__.setdefault("_plain", {})
        if (device, heads) not in cache:
            cache[(device, heads)] = plain_buckets([b.shape for b in self.buckets(device)], heads, device.type)
        return cache[(device, heads)]


def pack_rows(seqs: Sequence[Sequence[int]], *, share: bool) -> PackedLayout:
    """Lay out ``seqs`` end to end; with ``share`` rows share the tokens of their common prefixes.

    >>> lay = pack_rows([[5, 6, 7], [5, 6, 8, 9], [4]], share=True)
    >>> lay.ids, lay.positions, lay.index
    ([5, 6, 7, 8, 9, 4], [0, 1, 2, 2, 3, 0], [[0, 1, 2], [0, 1, 3, 4], [5]])
    >>> [(s.start, s.end, s.context) for s in lay.segments]
    [(0, 2, ()), (2, 3, (0, 1)), (3, 5, (0, 1)), (5, 6, ())]
    >>> pack_rows([[5, 6, 7], [5, 6]], share=False).index
    [[0, 1, 2], [3, 4]]
    """
    if not share:
        segments: list[Segment] = []
        index: list[list[int]] = []
        ids: list[int] = []
        positions: list[int] = []
        for s in seqs:
            start = len(ids)
            ids += s
            positions += range(len(s))
            index.append(list(range(start, len(ids))))
            segments.append(Segment(start, len(ids), ()))
        return PackedLayout(ids, positions, tuple(segments), index)
    return _radix_layout(seqs)


def _radix_layout(seqs: Sequence[Sequence[int]]) -> PackedLayout:
    # a token trie: node = (token, children); rows are inserted in order, so a group's rows stay together
    children: list[dict[int, int]] = [{}]  # node 0 is the root (no token)
    token: list[int] = [-1]
    paths: list[list[int]] = []
    for s in seqs:
        node, path = 0, []
        for t in s:
            nxt = children[node].get(t)
            if nxt is None:
                nxt = len(token)
                token.append(t)
                children.append({})
                children[node][t] = nxt
            path.append(nxt)
            node = nxt
        paths.append(path)
    # depth-first layout; a segment is a maximal chain of nodes with one child each
    where: dict[int, int] = {}
    ids: list[int] = []
    positions: list[int] = []
    segments: list[Segment] = []
    stack: list[tuple[int, int, tuple[int, ...]]] = [(c, 0, ()) for c in reversed(list(children[0].values()))]
    while stack:
        node, depth, context = stack.pop()
        start = len(ids)
        while True:
            where[node] = len(ids)
            ids.append(token[node])
            positions.append(depth)
            depth += 1
            kids = list(children[node].values())
            if len(kids) != 1:
                break
            node = kids[0]
        segments.append(Segment(start, len(ids), context))
        below = context + tuple(range(start, len(ids)))
        stack += [(c, depth, below) for c in reversed(kids)]
    return PackedLayout(ids, positions, tuple(segments), [[where[n] for n in p] for p in paths])


@dataclass(frozen=True)
class Bucket:
    """Segments attended in one padded call: their query and key/value rows as gather indices into the packed row
    (padding points at row 0: padded keys are masked, padded query rows are dropped), and which padded query
    rows are real."""

    q_index: torch.Tensor  # [S * Lq] layout index of each padded query row
    kv_index: torch.Tensor  # [S * Lk] layout index of each padded key row (context first, then own tokens)
    mask: torch.Tensor  # [S, 1, Lq, Lk] bool: may query row i of a segment see key j
    real: torch.Tensor  # [n] the padded query rows that are real tokens, in layout order of ...
    positions: torch.Tensor  # [n] ... these layout indices
    shape: tuple[int, int, int]  # (S, Lq, Lk)

    def query_mask(self, rep: int) -> torch.Tensor:
        """[S, 1, rep * Lq, Lk]: the mask for ``rep`` query heads stacked along the query axis (built once per rep)."""
        if rep == 1:
            return self.mask
        cache = self.__dict__.setdefault("_query_masks", {})
        if rep not in cache:
            cache[rep] = self.mask.repeat(1, 1, rep, 1)
        return cache[rep]


def buckets(layout: PackedLayout, device: torch.device, *, waste: float = 2.0) -> list[Bucket]:
    """Group the layout's segments into a few padded attention calls.

    Segments are sorted by context + length; a bucket closes when its padded area (segments × longest
    query × longest key) would exceed ``waste`` × the area it needs. Padded query rows may see key 0 only
    (a finite softmax; their outputs are dropped), padded key rows are seen by nobody.
    """
    segs = sorted(layout.segments, key=lambda g: (len(g.context) + g.end - g.start, g.end - g.start))
    groups: list[list[Segment]] = []
    need = 0
    for g in segs:
        lq, lk = g.end - g.start, len(g.context) + g.end - g.start
        cur = groups[-1] if groups else None
        if cur is not None:
            n = len(cur) + 1
            mq = max(lq, max(x.end - x.start for x in cur))
            mk = max(lk, max(len(x.context) + x.end - x.start for x in cur))
            if n * mq * mk <= waste * (need + lq * lk):
                cur.append(g)
                need += lq * lk
                continue
        groups.append([g])
        need = lq * lk
    return [_bucket(group, 0, device) for group in groups]


def _bucket(group: list[Segment], pad: int, device: torch.device) -> Bucket:
    lq = max(g.end - g.start for g in group)
    lk = max(len(g.context) + g.end - g.start for g in group)
    q_index = torch.full((len(group), lq), pad, dtype=torch.long)
    kv_index = torch.full((len(group), lk), pad, dtype=torch.long)
    mask = torch.zeros((len(group), 1, lq, lk), dtype=torch.bool)
    mask[:, :, :, 0] = True  # padded query rows see key 0; real rows are set below
    real: list[int] = []
    positions: list[int] = []
    for s, g in enumerate(group):
        n, c = g.end - g.start, len(g.context)
        q_index[s, :n] = torch.arange(g.start, g.end)
        kv_index[s, :c] = torch.tensor(g.context, dtype=torch.long)
        kv_index[s, c:c + n] = torch.arange(g.start, g.end)
        mask[s, 0, :n, :] = False
        mask[s, 0, :n, :c] = True  # every ancestor token
        mask[s, 0, :n, c:c + n] = torch.ones((n, n), dtype=torch.bool).tril()  # own tokens, causally
        real += range(s * lq, s * lq + n)
        positions += range(g.start, g.end)
    return Bucket(q_index.reshape(-1).to(device), kv_index.reshape(-1).to(device), mask.to(device),
                  torch.tensor(real, device=device), torch.tensor(positions, device=device), (len(group), lq, lk))


def tree_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                   packed_layout: PackedLayout | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers attention function: attention over a :class:`PackedLayout`, else ``sdpa``'s.

    The layout's segments are attended in a few padded batches (:func:`buckets`): a gather of their
    query and key rows, one scaled-dot-product attention, and a gather of the real rows back.

    Args:
        query: [1, H, N, D]; key, value: [1, KV, N, D] (grouped-query heads are shared as sdpa does).

    Returns:
        [1, N, H, D] attention output, and no weights.
    """
    if packed_layout is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    H, KV, D = query.shape[1], key.shape[1], query.shape[3]
    # Grouped-query heads: the rep query heads that share a key/value head are stacked along the query axis
    # ([S, KV, rep * Lq, D], the mask repeated to match), so key/value rows are gathered once per KV head and
    # never copied per query head. Not sdpa's enable_gqa: on CPU its backward is not deterministic from run to
    # run (resume would no longer be bit-exact), and on CUDA a masked sdpa with it falls back to the math kernel.
    rep = H // KV
    q0, k0, v0 = query[0], key[0], value[0]  # [H, N, D], [KV, N, D]
    outs, where = [], []
    for b, plain in zip(packed_layout.buckets(query.device), packed_layout.plain(query.device, H)):
        S, lq, lk = b.shape
        q = q0.index_select(1, b.q_index).view(KV, rep, S, lq, D).permute(2, 0, 1, 3, 4).reshape(S, KV, rep * lq, D)
        k = k0.index_select(1, b.kv_index).view(KV, S, lk, D).transpose(0, 1)  # [S, KV, Lk, D]
        v = v0.index_select(1, b.kv_index).view(KV, S, lk, D).transpose(0, 1)
        o = _attend(q, k, v, b.query_mask(rep), dropout, scaling, plain=plain)
        o = o.view(S, KV, rep, lq, D).permute(1, 2, 0, 3, 4).reshape(H, S * lq, D)  # head h = kv * rep + r
        outs.append(o.index_select(1, b.real))  # [H, n, D]
        where.append(b.positions)
    order = torch.cat(where).argsort()  # the buckets' rows back in layout order
    return torch.cat(outs, dim=1).index_select(1, order).transpose(0, 1).unsqueeze(0).contiguous(), None


PLAIN_SCORES = 1 << 24
"""On a CPU, the score entries (summed over a layout's buckets, per layer) that :func:`_attend` may keep for the
backward: 16M, at most 96 MiB per layer as fp32 probabilities and their bf16 copy (the quickstart's layouts hold
up to about 6M; the update benchmark's peak RSS over three configs: 10.4 GB at 4M, 11.0 GB at 16M)."""


def plain_buckets(shapes: Sequence[tuple[int, int, int]], heads: int, device_type: str) -> list[bool]:
    """Which buckets of shapes (S, Lq, Lk) are attended with plain matmuls: on a CPU, the smallest first while their
    score entries (S · heads · Lq · Lk) add up to at most :data:`PLAIN_SCORES`; on other devices none.

    >>> plain_buckets([(2, 10, 20), (1, 3000, 3000), (4, 100, 200)], heads=9, device_type="cpu")
    [True, False, True]
    >>> plain_buckets([(2, 10, 20)], heads=9, device_type="cuda")
    [False]
    """
    out = [False] * len(shapes)
    if device_type != "cpu":
        return out
    used = 0
    for i in sorted(range(len(shapes)), key=lambda i: shapes[i][0] * shapes[i][1] * shapes[i][2]):
        S, lq, lk = shapes[i]
        if used + S * heads * lq * lk > PLAIN_SCORES:
            break
        used += S * heads * lq * lk
        out[i] = True
    return out


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, dropout: float,
            scaling: float | None, *, plain: bool) -> torch.Tensor:
    """Masked attention of one bucket: [S, KV, Lq', D] queries over [S, KV, Lk, D] keys and values.

    ``plain`` (small buckets on a CPU, :func:`plain_buckets`; the segments of a prefix tree are mostly a few
    to a few hundred tokens): matmul, fp32 softmax, matmul, as transformers' eager attention computes it; the
    CPU flash-attention kernel's backward costs several times its forward on such shapes. Otherwise
    ``scaled_dot_product_attention``, whose fused kernels never hold the scores. Padded query rows see key 0, so
    no row of the mask is empty and the softmax is finite.
    """
    if not plain or dropout:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale).masked_fill_(~mask, float("-inf"))
    return torch.matmul(scores.softmax(-1, dtype=torch.float32).to(v.dtype), v)


def register() -> None:
    """Add :func:`tree_attention` to transformers' attention registry (and ``sdpa``'s masks for its fallback)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ATTENTION, tree_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why ``model``'s attention cannot take a packed layout, or None when it can."""
    cfg = getattr(model, "config", None)
    impl = getattr(cfg, "_attn_implementation", None)
    if impl not in ("sdpa", ATTENTION):
        return f"its attention implementation is {impl!r}; packed rows need 'sdpa'"
    if getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None):
        return "it uses sliding-window attention, which the packed layout does not model"
    types = getattr(cfg, "layer_types", None) or []
    if any(t != "full_attention" for t in types):
        return f"its layers are not all full attention ({sorted(set(types))})"
    return None


def use_packed_attention(model: torch.nn.Module) -> None:
    """Make ``model`` (and the configs of its submodules) use :data:`ATTENTION`; refuse a model that cannot.

    Calls without a ``packed_layout`` keep computing exactly what ``sdpa`` computes.
    """
    reason = unsupported_reason(model)
    if reason is not None:
        raise ValueError(f"{type(model).__name__}: {reason}; set loss.pack_rows=false")
    register()
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and getattr(cfg, "_attn_implementation", None) == "sdpa":
            cfg._attn_implementation = ATTENTION


def dummy_mask(device: torch.device) -> torch.Tensor:
    """A 4-D mask that makes transformers skip building its own (the layout carries the structure)."""
    return torch.ones((1, 1, 1, 1), dtype=torch.bool, device=device)
