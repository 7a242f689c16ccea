"""The physical limits of a CPU decode step on this machine, and how close the matmuls of one come.

Prints, with ``--threads`` torch threads, in the dtype ``auto`` resolves here (or ``--dtype``):

* the matmul peak: a square ``--peak-size``³ product, GFLOP/s (what the cores reach on large shapes);
* the memory read bandwidth: a sum over a 256 MiB tensor, GB/s;
* per linear of SmolLM2-135M-Instruct (q/k/v fused, o, gate/up fused, down, the lm_head) at each of
  ``--rows``: GFLOP/s through ``F.linear`` (the BLAS) and through the engine's oneDNN-prepacked product,
  with warm caches (the same weight every call);
* the floors of one decode step at each row count: its FLOPs at the peak and its weight bytes at the
  bandwidth (the step cannot be faster than the larger of the two);
* all the linears of one decode step at each row count, every layer with its own weights (read from
  memory, as in a step): ``F.linear``, oneDNN's prepacked product and, in float32, MKL's packed product
  for that row count and the C library's panel product (the products the engine can use: in float32 the panel
  product where the library builds, else oneDNN's and MKL's), ms and share of the peak.

    python benchmarks/cpu_limits.py --rows 32 64
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python benchmarks/cpu_limits.py

Last line: ``RESULT name=cpu_limits peak_gflops=... read_gbs=... b32_floor_ms=...``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from dtypes import rollout_dtype  # benchmarks/ is on sys.path when run as a script

from teamrl.engines.cpu import attention as cpu_attention
from teamrl.engines.cpu import panel

# SmolLM2-135M-Instruct: hidden 576, 9 query and 3 key/value heads of 64, MLP 1536, 30 layers, vocabulary 49152
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}
LAYERS = 30


def per_call(fn, n: int) -> float:
    fn()
    fn()
    times = []
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t) / n)
    return statistics.median(times)


def step_linears(rows: int, dt: torch.dtype, g: torch.Generator) -> dict[str, float]:
    """Seconds for the linears of one decode step at ``rows`` rows, each layer with its own weights (so they come
    from memory, as in a step): ``F.linear``, oneDNN's prepacked product and (float32) MKL's packed product for
    exactly ``rows`` rows and the C library's panel product, those the engine can use (teamrl.engines.decode_weights);
    the best of 3 after a warm-up."""
    shapes = [s for k, s in SHAPES.items() if k != "lm_head"] * LAYERS + [SHAPES["lm_head"]]
    ws = [torch.randn(s, generator=g).to(dt) / 24 for s in shapes]
    xs = {i: torch.randn((rows, i), generator=g).to(dt) for _, i in SHAPES.values()}
    runs = {"F.linear": lambda: [F.linear(xs[w.shape[1]], w) for w in ws]}
    try:
        dn = [torch.ops.mkldnn._reorder_linear_weight(w) for w in ws]
        runs["oneDNN prepacked"] = lambda: [torch.ops.mkldnn._linear_pointwise(xs[w.shape[1]], p, None, "none", [], "")
                                            for w, p in zip(ws, dn)]
    except RuntimeError:
        pass
    if dt == torch.float32 and torch.backends.mkl.is_available():
        mk = [torch.ops.mkl._mkl_reorder_linear_weight(w, rows) for w in ws]
        runs["MKL packed"] = lambda: [torch.ops.mkl._mkl_linear(xs[w.shape[1]], p, w, None, rows) for w, p in zip(ws, mk)]
    lib = cpu_attention.load() if dt == torch.float32 else None
    if lib is not None and panel.available(lib):
        pn = [panel.panel_pack(lib, w) for w in ws]
        runs["panel"] = lambda: [panel.panel_linear(xs[p.orig.shape[1]], p, None) for p in pn]
    best = {k: float("inf") for k in runs}
    with torch.no_grad():
        for i in range(4):
            for k, fn in runs.items():
                t = time.perf_counter()
                fn()
                if i:
                    best[k] = min(best[k], time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    ap.add_argument("--peak-size", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dt = getattr(torch, rollout_dtype(args.dtype, "cpu"))
    g = torch.Generator().manual_seed(0)

    n = args.peak_size
    a, b = torch.randn((n, n), generator=g).to(dt), torch.randn((n, n), generator=g).to(dt)
    peak = 2 * n**3 / per_call(lambda: a @ b, 3) / 1e9
    x = torch.randn(256 * 2**20 // 4, generator=g)
    read = x.numel() * 4 / per_call(lambda: x.sum(), 5) / 1e9
    print(f"matmul peak ({n}^3, {dt}): {peak:.0f} GFLOP/s; memory read (256 MiB): {read:.1f} GB/s", flush=True)

    reorder = torch.ops.mkldnn._reorder_linear_weight
    result = [f"RESULT name=cpu_limits peak_gflops={peak:.0f} read_gbs={read:.1f}"]
    for rows in args.rows:
        for name, (out, inp) in SHAPES.items():
            w, xin = torch.randn((out, inp), generator=g).to(dt), torch.randn((rows, inp), generator=g).to(dt)
            flops = 2 * rows * out * inp
            calls = max(3, int(2e9 / flops))
            plain = flops / per_call(lambda: F.linear(xin, w), calls) / 1e9
            try:
                wp = reorder(w)
                packed = flops / per_call(lambda: torch.ops.mkldnn._linear_pointwise(xin, wp, None, "none", [], ""),
                                          calls) / 1e9
                packed_s = f"{packed:6.0f}"
            except RuntimeError:
                packed_s = "     -"
            print(f"rows {rows:4d} {name:8s} {out:5d}x{inp:<5d} F.linear {plain:6.0f} GFLOP/s  prepacked {packed_s} GFLOP/s")
        per_layer = sum(o * i for k, (o, i) in SHAPES.items() if k != "lm_head")
        weights = LAYERS * per_layer + SHAPES["lm_head"][0] * SHAPES["lm_head"][1]
        flops = 2 * rows * weights
        compute_ms, memory_ms = 1e3 * flops / (peak * 1e9), 1e3 * weights * dt.itemsize / (read * 1e9)
        print(f"rows {rows}: a decode step is {flops / 1e9:.2f} GFLOP over {weights * dt.itemsize / 1e6:.0f} MB of "
              f"weights: {compute_ms:.1f} ms at the matmul peak, {memory_ms:.1f} ms at the read bandwidth", flush=True)
        result.append(f"b{rows}_floor_ms={max(compute_ms, memory_ms):.1f}")
        stack = step_linears(rows, dt, g)
        print(f"rows {rows}: a decode step's linears, {LAYERS} layers + lm_head, weights read from memory: " +
              ", ".join(f"{k} {v * 1e3:.1f} ms ({flops / v / 1e9:.0f} GFLOP/s, {flops / v / 1e9 / peak:.0%} of the peak)"
                        for k, v in stack.items()), flush=True)
        result += [f"b{rows}_step_linears_{k.split()[0].replace('.', '_').lower()}_ms={v * 1e3:.1f}"
                   for k, v in stack.items()]
    print(" ".join(result))


if __name__ == "__main__":
    main()
