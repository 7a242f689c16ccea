"""The fast loop's fused CPU decode step: a decode step whose work between the prepacked products runs as three
calls of the C library per layer (:mod:`teamrl.engines.cpu.attention`). :meth:`FastDecoder.step
<teamrl.engines.fast_decoder.FastDecoder.step>` takes it where :meth:`~teamrl.engines.fast_decoder.FastDecoder.can_fuse_step`."""

from __future__ import annotations

from typing import Any

import torch

from teamrl.engines.cpu import attention as cpu_attention
from teamrl.engines.cpu.products import packed_linear

__all__ = ["fused_step"]


def fused_step(dec: Any, tok: torch.Tensor, packed: list) -> torch.Tensor:
    """One decode step of a :class:`~teamrl.engines.fast_decoder.FastDecoder` ``dec``'s rows ``0 .. n-1`` (n = len(tok)) with the prepacked weights ``packed``; returns the final
    normed hidden states [n, H] (``lens`` not advanced). Between the products, three calls of the C library per
    layer instead of about twenty torch operations: rotation, cache write and attention
    (:func:`~teamrl.engines.cpu.attention.rope_attention`); residual add and RMSNorm
    (:func:`~teamrl.engines.cpu.attention.add_rms_norm`, twice); ``silu(gate) * up``. The same roundings as the
    unfused step in the same order; sums and the reciprocal square root in another order or approximation, so
    results agree to rounding, not bit for bit (``tests/engines/test_cpu_attention.py``)."""
    lib, n, D = dec.attn_lib, tok.shape[0], dec.head_dim
    assert lib is not None and dec.weights is not None  # can_fuse_step
    g = dec.n_heads // dec.n_kv
    pos = dec.lens[:n]
    h = dec.inner.embed_tokens(tok.view(n))  # [n, H], updated in place by each residual add
    cos, sin = dec.inner.rotary_emb(h, pos[:, None])  # [n, 1, D]
    cos = cos.reshape(n, D).contiguous()
    ssin = torch.cat([-sin[..., : D // 2], sin[..., D // 2 :]], -1).reshape(n, D)
    o = torch.empty((n, dec.n_kv, g, D), dtype=dec.dtype)
    x = torch.empty_like(h)
    act = torch.empty((n, dec.weights.fused[0][2].shape[0] // 2), dtype=dec.dtype)
    layers = dec.inner.layers
    dec._add_norm(lib, h, None, layers[0].input_layernorm, x)
    for i, (layer, k, v) in enumerate(zip(layers, dec.k.unbind(0), dec.v.unbind(0))):
        w_qkv, w_o, w_gu, w_down = packed[i]
        qkv = packed_linear(x, w_qkv, dec.weights.fused[i][1])
        cpu_attention.rope_attention(lib, qkv, cos, ssin, k, v, pos, dec.scale, o)
        o_out = packed_linear(o.view(n, -1), w_o, layer.self_attn.o_proj.bias)
        dec._add_norm(lib, h, o_out, layer.post_attention_layernorm, x)
        cpu_attention.silu_mul(lib, packed_linear(x, w_gu, None), act)
        dec._add_norm(lib, h, packed_linear(act, w_down, layer.mlp.down_proj.bias), dec.norm_after[i], x)
    return x
