"""The float32 panel product of :mod:`teamrl.engines.cpu.attention`'s C library, for a decode step's linears.

At decode batch sizes (a few dozen rows) a step's products read every weight once, and MKL's packed
product does not overlap those reads with the arithmetic. This one (``panel_*`` in
``csrc/decode_attention.c``, built where the compiler targets AVX2 + FMA or AVX-512) packs each weight
once into panels of :func:`panel_width` output features, ``[N/16][K][16]`` with AVX2; each thread
multiplies whole panels by blocks of 6 rows held in registers, and prefetches the next panel into L2
while it computes the current one (docs/results/speed.md, "Panel product"). Where it builds, the engine's
float32 decode steps all multiply by its copies, their only packed copy of the weights
(``DecodeWeights.for_step``).

Each output is a float32 sum over K in one sequence: another order than the BLAS behind ``F.linear``,
so the two agree to float32 rounding, not bit for bit; a row's result depends on that row only.
"""

from __future__ import annotations

import ctypes
import functools
from typing import NamedTuple

import torch


class PanelWeight(NamedTuple):
    """A float32 weight ``orig`` [N, K] packed by :func:`panel_pack` into ``lib``'s panels for :func:`panel_linear`."""

    packed: torch.Tensor
    orig: torch.Tensor
    lib: ctypes.CDLL


def panel_width(lib: ctypes.CDLL) -> int:
    """Output features per panel (16 with AVX2 + FMA, 32 with AVX-512), 0 where this build has no panel product (then
    :func:`panel_pack` raises)."""
    return int(lib.panel_width())


@functools.cache
def available(lib: ctypes.CDLL) -> bool:
    """Whether ``lib`` has the panel product and it agrees with ``F.linear`` here (checked once per library)."""
    if panel_width(lib) == 0:
        return False
    g = torch.Generator().manual_seed(0)
    w, b, x = torch.randn((45, 37), generator=g), torch.randn(45, generator=g), torch.randn((13, 37), generator=g)
    got = panel_linear(x, panel_pack(lib, w), b)
    return bool(torch.allclose(got, torch.nn.functional.linear(x, w, b), atol=1e-4, rtol=1e-5))


def panel_pack(lib: ctypes.CDLL, w: torch.Tensor) -> PanelWeight:
    """``w`` [N, K] (float32, CPU) packed into panels of :func:`panel_width` output features for :func:`panel_linear`
    (zero-padded to whole panels; ``w`` itself is kept as ``orig``, not copied)."""
    nr = panel_width(lib)
    if nr == 0:
        raise RuntimeError("panel_pack: this build of the library has no panel product (it needs AVX2 and FMA)")
    if w.dtype != torch.float32 or not w.is_cpu or w.dim() != 2:
        raise TypeError(f"panel_pack: a 2-D float32 CPU weight expected; got {w.dtype} {tuple(w.shape)} on {w.device}")
    N, K = w.shape
    src = w.detach().contiguous()
    out = torch.empty((-(-N // nr), K, nr), dtype=torch.float32)
    lib.panel_pack_f32(src.data_ptr(), N, K, out.data_ptr(), torch.get_num_threads())
    return PanelWeight(out, w, lib)


def panel_linear(x: torch.Tensor, w: PanelWeight, b: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, w.orig, b)`` for float32 ``x`` [..., K] on the CPU. (A decode step makes about four calls per
    layer: the checks before the raw-pointer call are kept cheap.)"""
    N, K = w.orig.shape
    x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    if x2.dtype != torch.float32 or x2.shape[1] != K or x2.device.type != "cpu" or \
            (b is not None and (b.dtype != torch.float32 or b.shape != (N,) or b.device.type != "cpu")):
        raise ValueError(f"panel_linear: float32 CPU x [..., {K}] and bias [{N}] expected; got x {x.dtype} "
                         f"{tuple(x.shape)} on {x.device}" + ("" if b is None else f", bias {b.dtype} {tuple(b.shape)}"))
    M = x2.shape[0]
    y = torch.empty((M, N), dtype=torch.float32)
    bias = None if b is None else b.contiguous()  # held until the call returns
    w.lib.panel_linear_f32(x2.data_ptr(), x2.stride(0), M, K, w.packed.data_ptr(), N,
                           None if bias is None else bias.data_ptr(), y.data_ptr(), torch.get_num_threads())
    return y if x.dim() == 2 else y.view(*x.shape[:-1], N)
