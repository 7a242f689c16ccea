"""The CPU products a decode step's linears may take, and the first-use timing that picks one per row bucket:
oneDNN's prepacked product (bit-identical to ``F.linear`` in bf16), MKL's packed GEMM for a bucket's row count, and
the panel product of the C library (:mod:`teamrl.engines.cpu.panel`). :class:`~teamrl.engines.decode_weights.DecodeWeights`
makes the prepacked copies and calls :func:`packed_linear`."""

from __future__ import annotations

import functools
import platform
import time
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from teamrl.engines.cpu import panel as panel_product
from teamrl.engines.cpu.panel import PanelWeight

MKL_BUCKETS = (16, 32, 64, 128, 256)  # row counts MKL-packed copies are made for (a step's rows pad up to one)
def pick_product(times: dict[str, float]) -> tuple[str, str]:
    """From a step's products timed at a bucket's row count (``oneDNN``, and ``mkl``, ``panel`` where tried), the
    one to use for the bucket's top quarter and the one below it (where MKL's packed product does not apply): the
    fastest, where another than oneDNN's must be at least 5% faster than it (it costs another copy of the weights).

    >>> pick_product({"oneDNN": 1.0, "mkl": 0.9, "panel": 0.8})
    ('panel', 'panel')
    >>> pick_product({"oneDNN": 1.0, "mkl": 0.7, "panel": 0.8})
    ('mkl', 'panel')
    >>> pick_product({"oneDNN": 1.0, "mkl": 0.97, "panel": 0.96})
    ('oneDNN', 'oneDNN')
    """
    base = times["oneDNN"]

    def best(names: tuple[str, ...]) -> str:
        ok = {n: times[n] for n in names if n in times and (n == "oneDNN" or times[n] < 0.95 * base)}
        return min(ok, key=ok.__getitem__)

    return best(("oneDNN", "mkl", "panel")), best(("oneDNN", "panel"))


class MklWeight(NamedTuple):
    """A weight packed by MKL for products with exactly ``rows`` input rows, and the weight itself."""

    packed: torch.Tensor
    orig: torch.Tensor
    rows: int


def mkl_pack(w: torch.Tensor, rows: int) -> MklWeight:
    return MklWeight(torch.ops.mkl._mkl_reorder_linear_weight(w, rows), w, rows)


def mkl_linear(x: torch.Tensor, w: MklWeight, b: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, w.orig, b)`` through MKL's packed product, ``x``'s rows zero-padded to ``w.rows`` (each output
    row depends on its own input row only; more rows than ``w.rows`` would take MKL's unpacked product)."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    n = x2.shape[0]
    if n < w.rows:
        x2 = F.pad(x2, (0, 0, 0, w.rows - n))
    y = torch.ops.mkl._mkl_linear(x2, w.packed, w.orig, b, w.rows)
    return y[:n].view(*shape[:-1], y.shape[-1])


@functools.cache
def _mkl_pack_works() -> bool:
    if not torch.backends.mkl.is_available() or not hasattr(torch.ops.mkl, "_mkl_linear") or \
            platform.machine() not in ("x86_64", "AMD64"):
        return False
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn((96, 64), generator=g), torch.randn((5, 64), generator=g)
    try:
        with torch.no_grad():
            got = mkl_linear(x, mkl_pack(w, 8), None)
    except RuntimeError:
        return False
    return got.shape == (5, 96) and bool(torch.allclose(got, F.linear(x, w), rtol=1e-5, atol=1e-5))


def _step_weights(layer, fused: tuple) -> tuple:
    """A layer's weights in the order of a decode step's products: q/k/v (fused), o, gate/up (fused) and down (None
    without a fused gate/up)."""
    w_qkv, _, w_gu = fused
    return w_qkv, layer.self_attn.o_proj.weight, w_gu, None if w_gu is None else layer.mlp.down_proj.weight


def time_step_linears(cands: dict[str, tuple[list, Any]], model, fused: list, rows: int) -> dict[str, float]:
    """Seconds of one decode step's products at ``rows`` rows (every layer, then the lm_head; weights from memory, as
    in a step) for each candidate set of prepacked copies of ``model``'s weights (name -> (layers, head), in the
    order of :func:`_step_weights` with ``fused``): the best of 3 after a warm-up, the candidates alternating."""
    widths = [[None if w is None else int(w.shape[1]) for w in _step_weights(layer, f)]
              for layer, f in zip(model.model.layers, fused)]
    head_width = int(model.lm_head.weight.shape[1])
    xs = {k: torch.randn((rows, k)) for k in {k for ks in widths for k in ks if k is not None} | {head_width}}

    def run(layers, head) -> float:
        t = time.perf_counter()
        for layer, ks in zip(layers, widths):
            for w, k in zip(layer, ks):
                if w is not None and k is not None:
                    packed_linear(xs[k], w, None)
        packed_linear(xs[head_width], head, None)
        return time.perf_counter() - t

    best = dict.fromkeys(cands, float("inf"))
    with torch.no_grad():
        for i in range(4):
            for name, (layers, head) in cands.items():
                t = run(layers, head)
                if i:
                    best[name] = min(best[name], t)
    return best


@functools.cache
def _float32_pack_works() -> bool:
    """oneDNN's float32 prepacked product runs here and agrees with ``F.linear`` (checked once per process)."""
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn((96, 64), generator=g), torch.randn((8, 64), generator=g)
    try:
        with torch.no_grad():
            got = packed_linear(x, torch.ops.mkldnn._reorder_linear_weight(w), None)
    except RuntimeError:
        return False
    return got.shape == (8, 96) and bool(torch.allclose(got, F.linear(x, w), rtol=1e-5, atol=1e-5))


PACK_MAX_ROWS = 256  # decode steps with more rows use F.linear (in bf16 the packed product is bit-identical to it)


def packed_linear(x: torch.Tensor, w, b: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, W, b)`` with ``w`` a weight prepacked by :func:`decode_weights` (oneDNN's, an
    :class:`MklWeight` or a :class:`~teamrl.engines.cpu.panel.PanelWeight`)."""
    if type(w) is MklWeight:
        return mkl_linear(x, w, b)
    if type(w) is PanelWeight:
        return panel_product.panel_linear(x, w, b)
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
