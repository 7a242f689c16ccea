"""Torch operations of the ``hf`` engine's fast loop (:mod:`teamrl.engines.fast_decoder`) that reproduce a
Llama-style layer's modules with fewer kernels, shared by its host loop and its device loop: the rotary embedding,
RMSNorm through one fused kernel (used only where it is bit-identical to the module), and decode attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rope(x: torch.Tensor, cos: torch.Tensor, ssin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` in 4 kernels instead of 7, with the same roundings."""
    return (x * cos).add_(x.roll(x.shape[-1] // 2, -1) * ssin)


def torch_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                           scale: float) -> torch.Tensor:
    """``F.scaled_dot_product_attention``; on CPU its flash kernel called directly (the same kernel, no re-dispatch)."""
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask,
                                                                          scale=scale)[0]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def call_module(m, x: torch.Tensor) -> torch.Tensor:
    """``m(x)``: the norm to use where :func:`rms_norm` does not reproduce the module."""
    return m(x)


def rms_norm(m, x: torch.Tensor) -> torch.Tensor:
    """A Llama-style RMSNorm module's output from one fused kernel (checked bit-identical in ``exact_rms_norm``)."""
    y = torch.ops.aten._fused_rms_norm(x.float(), [x.shape[-1]], None, m.variance_epsilon)[0]
    return m.weight * y.to(x.dtype)


def exact_rms_norm(m) -> bool:
    """Whether :func:`rms_norm` reproduces the module ``m`` bit for bit (checked on random rows, once per
    norm class, dtype, device and epsilon)."""
    if not hasattr(torch.ops.aten, "_fused_rms_norm") or not hasattr(m, "variance_epsilon"):
        return False
    key = (type(m), m.weight.dtype, m.weight.device, m.variance_epsilon)
    if key not in _EXACT_NORM:
        _EXACT_NORM[key] = _check_rms_norm(m)
    return _EXACT_NORM[key]


_EXACT_NORM: dict[tuple, bool] = {}


def _check_rms_norm(m) -> bool:
    w = m.weight
    x = torch.randn((7, w.shape[-1]), generator=torch.Generator().manual_seed(0)).to(w.device, w.dtype) * 3
    try:
        with torch.no_grad():
            return torch.equal(rms_norm(m, x), m(x))
    except RuntimeError:
        return False
