"""One decode step of teamrl's ``hf`` engine: where its time goes, and its attention kernel.

Two modes (SmolLM2-135M-Instruct, 2 torch threads):

* ``--profile``: torch.profiler over ``--profile-steps`` decode steps of the fast loop (as the
  engine runs it: fused and prepacked weights, the C attention kernel) and of the generic loop
  (``model.forward`` + ``DynamicCache``) at each of ``--batches``, after a warm-up; self CPU time
  of aten ops grouped by kind. The C library's calls (attention; with the fused step also rotation +
  cache write + attention, residual add + RMSNorm, ``silu * up``; in float32 the panel product where the
  first-use timing picks it) are ``ctypes`` calls the profiler does
  not see: they are timed around the calls. "Python / framework overhead" is the wall time minus all of these.
* ``--attention``: one layer's decode attention at the model's shapes, torch's CPU flash kernel vs
  :mod:`teamrl.engines.cpu.attention`, time per call with 30 layers' caches cycled (as in a step),
  repetitions alternating.

    python benchmarks/decode_step.py --profile --batches 32 64 --profile-steps 12
    python benchmarks/decode_step.py --attention --batches 8 32 64 --reps 3
    python benchmarks/decode_step.py --gpu-profile --shape 1.5b --batches 128 --profile-steps 64

* ``--gpu-profile`` (CUDA): torch.profiler (CPU and CUDA activity) over a ``generate`` of
  ``--profile-steps`` tokens per row at each batch size, for the engine's eager fast loop (sampling
  on the host; the loop before the device loop existed) and for its device loop with CUDA graphs,
  unfused (``fuse=False``: the device loop before its fused weights), fused (the default) and
  compiled (``compile=True``): wall time per step, GPU kernels per step, GPU kernel time per step and
  its share of the wall time (how busy the GPU is), and the costliest kernels.
* ``--step-ops`` (CPU or ``--device cuda``): the operations one device-loop step launches (the
  forward and the sampling, eagerly: what a CUDA graph captures), unfused vs fused, and time per step:
  on CPU the aten ops that compute (views and allocations left out), on CUDA the GPU kernels.

    python benchmarks/decode_step.py --step-ops --shape 1.5b --batches 8 --profile-steps 4

``--attention`` ends with ``RESULT name=decode_attention b8_ratio=... b32_ratio=...`` (torch's time
per call / teamrl's, median of per-repetition ratios).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from dtypes import rollout_dtype
from limits import sync
from rollout import left_pad, make_prompts  # benchmarks/ is on sys.path when run as a script
from shapes import SHAPES, prompt_tokenizer, random_model

# ---- decode attention: torch's CPU kernel vs teamrl's -------------------------------------------

def bench_attention(args) -> dict[int, list[float]]:
    """Per-layer decode attention at SmolLM2-135M's shapes (3 kv heads x 3 query heads, head dim 64),
    ``--attn-columns`` filled columns per row (rows 0-35 shorter), bf16: torch's flash kernel with an
    additive mask vs :mod:`teamrl.engines.cpu.attention`; 30 layers' caches cycled so they come from
    memory, as in a decode step. Returns per-repetition time ratios (torch / teamrl) per batch size."""
    from teamrl.engines.cpu import attention as cpu_attention

    lib = cpu_attention.load()
    if lib is None:
        print("attention: the teamrl kernel does not build here; skipped", flush=True)
        return {}
    H, G, D, L, cols = 3, 3, 64, 30, args.attn_columns
    C = -(-(cols + 72) // 64) * 64  # buffer columns as the engine reserves them
    out: dict[int, list[float]] = {}
    for B in args.batches:
        gen = torch.Generator().manual_seed(B)
        k, v = (torch.randn((L, B, H, C, D), generator=gen).to(torch.bfloat16) for _ in range(2))
        q = torch.randn((B, H, G, D), generator=gen).to(torch.bfloat16)
        lens = torch.randint(cols - 35, cols + 1, (B,), generator=gen)
        lens[0] = cols
        mask = torch.zeros((B, 1, 1, cols), dtype=torch.bfloat16).masked_fill_(
            ~(torch.arange(cols) < lens[:, None])[:, None, None], -torch.inf)
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu

        def run_torch(n):
            for i in range(n):
                flash(q, k[i % L, :, :, :cols], v[i % L, :, :, :cols], 0.0, False, attn_mask=mask, scale=0.125)

        def run_teamrl(n):
            for i in range(n):
                cpu_attention.decode_attention(lib, q, k[i % L], v[i % L], lens, 0.125)

        n = 600
        run_torch(30), run_teamrl(30)
        ratios = []
        for rep in range(args.reps):
            t = {}
            for name, fn in (("torch", run_torch), ("teamrl", run_teamrl)):
                t0 = time.perf_counter()
                fn(n)
                t[name] = (time.perf_counter() - t0) / n
            ratios.append(t["torch"] / t["teamrl"])
            print(f"attention B={B} rep {rep}: torch flash {t['torch'] * 1e3:.3f} ms  teamrl {t['teamrl'] * 1e3:.3f} ms "
                  f"per layer call ({cols} columns)", flush=True)
        out[B] = ratios
        print(f"attention B={B} median speed-up {statistics.median(ratios):.2f}\n", flush=True)
    return out


# ---- decode-step profile -----------------------------------------------------------------------

CATEGORIES = [  # (category, substrings of aten op names), first match wins
    ("matmul (linear, lm_head)", ("addmm", "aten::mm", "aten::bmm", "matmul", "linear")),
    ("attention (sdpa kernel)", ("scaled_dot_product", "flash_attention", "_efficient_attention", "softmax")),
    ("KV cache (cat / in-place write / reindex)", ("aten::cat", "copy_", "index", "slice_scatter", "empty")),
    ("sampling (logsumexp, multinomial, gather)", ("logsumexp", "multinomial", "log_softmax", "gather", "argmax",
                                                   "exp", "sort", "cumsum", "isin")),
    ("norms, rotary, activations, adds", ("mul", "add", "rsqrt", "pow", "mean", "silu", "neg", "cos", "sin", "div",
                                          "sub", "embedding", "where", "to", "_to_copy")),
]


def profile_steps(args, model, tok) -> None:
    """Profile decode steps of the fast loop and of the generic loop (``model.forward`` + DynamicCache)."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import DynamicCache

    from teamrl.engines.cpu import attention as cpu_attention
    from teamrl.engines.cpu import panel
    from teamrl.engines.decode_weights import decode_weights
    from teamrl.engines.fast_decoder import FastDecoder
    from teamrl.engines.sampling import sample

    steps = args.profile_steps
    for B in args.batches:
        prompts = make_prompts(tok, B)
        ids, attn = left_pad(prompts, tok.pad_token_id)
        temps, tp, tk = torch.ones(B), torch.ones(B), torch.zeros(B, dtype=torch.long)
        g = torch.Generator().manual_seed(0)
        for name in ("fast", "generic"):
            with torch.no_grad():
                if name == "fast":
                    # as the engine runs it: fused, prepacked weights and the C attention kernel
                    dec = FastDecoder(model, decode_weights(model, {}, pack=True, panel=True), attention_kernel=True)
                    logits = dec.prefill(prompts, 0, [2 * steps + 8] * B)
                    fwd = dec.step
                else:
                    cache = DynamicCache()
                    a = attn.clone()
                    out = model(input_ids=ids, attention_mask=a, position_ids=(a.cumsum(-1) - 1).clamp(min=0),
                                past_key_values=cache, use_cache=True, logits_to_keep=1)
                    logits = out.logits[:, -1].float()

                    def fwd(t, _s={"a": a}):
                        _s["a"] = torch.cat([_s["a"], torch.ones((B, 1), dtype=_s["a"].dtype)], 1)
                        o = model(input_ids=t.view(-1, 1), attention_mask=_s["a"],
                                  position_ids=_s["a"].sum(-1, keepdim=True) - 1, past_key_values=cache, use_cache=True)
                        return o.logits[:, -1].float()
                for _ in range(steps // 2):  # warm-up
                    t, _ = sample(logits, temps, tp, tk, g)
                    logits = fwd(t)
                # the C library's calls are ctypes calls, invisible to torch.profiler: timed here
                kernel_s = {call: 0.0 for call in C_CALLS}
                modules = {call: panel if call.startswith("panel") else cpu_attention for call in C_CALLS}
                originals = {call: getattr(modules[call], call) for call in C_CALLS}

                def timed(call: str):
                    def wrapped(*a, **kw):
                        t1 = time.perf_counter()
                        out = originals[call](*a, **kw)
                        kernel_s[call] += time.perf_counter() - t1
                        return out
                    return wrapped

                for call in C_CALLS:
                    setattr(modules[call], call, timed(call))
                try:
                    with profile(activities=[ProfilerActivity.CPU]) as prof:
                        t0 = time.perf_counter()
                        for _ in range(steps):
                            t, _ = sample(logits, temps, tp, tk, g)
                            logits = fwd(t)
                        wall = (time.perf_counter() - t0) / steps
                finally:
                    for call, fn in originals.items():
                        setattr(modules[call], call, fn)
            totals: dict[str, float] = {}
            for call, label in C_CALLS.items():
                if kernel_s[call]:
                    totals[label] = totals.get(label, 0.0) + kernel_s[call] / steps
            for ev in prof.key_averages():
                cat = next((c for c, subs in CATEGORIES if any(s in ev.key for s in subs)), "other ops")
                totals[cat] = totals.get(cat, 0.0) + ev.self_cpu_time_total / 1e6 / steps
            ops = sum(totals.values())
            totals["Python / framework overhead (wall - ops)"] = max(0.0, wall - ops)
            print(f"\nprofile {name} B={B} {args.dtype}: {wall * 1e3:.1f} ms/step (under the profiler), "
                  f"{B / wall:.0f} tok/s")
            for cat, sec in sorted(totals.items(), key=lambda kv: -kv[1]):
                print(f"  {cat:45s} {sec * 1e3:7.2f} ms  {100 * sec / wall:5.1f}%")
            top = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:8]
            print("  top ops: " + ", ".join(f"{e.key} {e.self_cpu_time_total / 1e3 / steps:.2f}ms" for e in top))


# teamrl's C calls in a decode step (teamrl.engines.cpu.attention, and .panel for panel_*) -> the category their
# time goes to
C_CALLS = {"decode_attention": "attention (teamrl C kernel)",
           "rope_attention": "rotary + KV write + attention (teamrl C, fused)",
           "add_rms_norm": "residual add + RMSNorm (teamrl C, fused)",
           "silu_mul": "silu(gate) * up (teamrl C, fused)",
           "panel_linear": "matmuls (teamrl C panel product)"}


def gpu_profile(args, model, tok) -> None:
    from torch.profiler import ProfilerActivity, profile

    from teamrl.engines.base import GenRequest, SamplingParams
    from teamrl.engines.hf import HFEngine

    for B in args.batches:
        prompts = make_prompts(tok, B)
        for name, kw in (("eager fast loop, host sampling", {"device_loop": False}),
                         ("device loop + CUDA graphs, unfused", {"fuse": False}),
                         ("device loop + CUDA graphs", {}),
                         ("device loop compiled + CUDA graphs", {"compile": True})):
            eng = HFEngine(model, tok, max_batch_size=B, **kw)
            sp = SamplingParams(temperature=1.0, max_new_tokens=args.profile_steps, ignore_eos=True)
            eng.generate([GenRequest(p, sp) for p in prompts])  # warm-up (captures the graphs)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                t = time.perf_counter()
                eng.generate([GenRequest(p, sp) for p in prompts])
                torch.cuda.synchronize()
                wall = (time.perf_counter() - t) / args.profile_steps
            events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
            gpu = sum(e.self_device_time_total for e in events) / 1e6 / args.profile_steps
            kernels = sum(e.count for e in events) / args.profile_steps
            print(f"\ngpu profile {name} B={B}: {wall * 1e3:.2f} ms/step wall (under the profiler; prefill "
                  f"included), {kernels:.0f} GPU kernels/step taking {gpu * 1e3:.2f} ms/step = {100 * gpu / wall:.0f}% "
                  f"of the wall time, {B / wall:.0f} tok/s")
            top = sorted(events, key=lambda e: -e.self_device_time_total)[:8]
            for e in top:
                print(f"  {e.key[:70]:70s} {e.self_device_time_total / 1e3 / args.profile_steps:7.3f} ms/step")


NO_KERNEL = {"aten::empty", "aten::resize_", "aten::type_as", "aten::empty_strided", "aten::empty_like", "aten::view", "aten::_unsafe_view",
             "aten::as_strided", "aten::slice", "aten::select", "aten::reshape", "aten::_reshape_alias",
             "aten::expand", "aten::t", "aten::transpose", "aten::permute", "aten::unsqueeze", "aten::squeeze",
             "aten::alias", "aten::detach", "aten::lift_fresh", "aten::resolve_conj", "aten::resolve_neg",
             "aten::split", "aten::split_with_sizes", "aten::chunk", "aten::unbind", "aten::narrow",
             "aten::contiguous", "aten::to", "aten::numpy_T", "aten::view_as", "aten::result_type"}


def _computes(e) -> bool:
    return e.name.startswith("aten::") and e.name not in NO_KERNEL


def _computes_below(e) -> bool:
    """Whether an op calls a computing aten op (then the innermost ones are counted, not this one)."""
    return any(_computes(c) or _computes_below(c) for c in e.cpu_children)


def step_ops(args, model, tok) -> dict[int, dict[str, float]]:
    """Operations and time of one device-loop step (forward + sampling, eager), unfused vs fused weights."""
    from torch.profiler import ProfilerActivity, profile

    from teamrl.engines.cuda_graphs import DecodeGraphs, column_bucket
    from teamrl.engines.decode_weights import DeviceWeights
    from teamrl.engines.fast_decoder import FastDecoder

    cuda = args.device == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    out: dict[int, dict[str, float]] = {}
    for B in args.batches:
        prompts = make_prompts(tok, B)
        res: dict[str, float] = {}
        for name in ("unfused", "fused"):
            with torch.no_grad():
                dec = FastDecoder(model, DeviceWeights(model, own=False) if name == "fused" else None)
                dec.prefill(prompts, 0, [args.profile_steps + 8] * B)
                graphs = DecodeGraphs(dec, B, capture=False)
                cols = column_bucket(int(dec.lens[:B].max()) + args.profile_steps, dec.k.shape[3])
                for _ in range(2):  # warm-up
                    graphs._body(B, cols, False, False)
                sync()
                with profile(activities=acts) as prof:
                    t0 = time.perf_counter()
                    for _ in range(args.profile_steps):
                        graphs._body(B, cols, False, False)
                        dec.lens[:B] += 1
                    sync()
                    wall = (time.perf_counter() - t0) / args.profile_steps
            if cuda:
                n = sum(e.count for e in prof.key_averages() if e.self_device_time_total > 0)
            else:
                n = sum(1 for e in prof.events() if _computes(e) and not _computes_below(e))
            res[f"{name}_ops"], res[f"{name}_ms"] = n / args.profile_steps, wall * 1e3
            print(f"step-ops {name:8s} B={B} {args.dtype}: {n / args.profile_steps:.0f} "
                  f"{'GPU kernels' if cuda else 'computing aten ops'} per step "
                  f"({n / args.profile_steps / len(model.model.layers):.1f} per layer), {wall * 1e3:.2f} ms/step "
                  f"(under the profiler)", flush=True)
        out[B] = res
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--profile", action="store_true", help="profile decode steps (fast and generic loops)")
    mode.add_argument("--attention", action="store_true", help="torch's CPU attention kernel vs teamrl's, per call")
    mode.add_argument("--gpu-profile", action="store_true", help="decode steps on CUDA: eager loop vs CUDA graphs")
    mode.add_argument("--step-ops", action="store_true", help="ops per device-loop step, unfused vs fused weights")
    ap.add_argument("--shape", choices=sorted(set(SHAPES) - {"tiny"}),
                    help="--gpu-profile, --step-ops: a random Qwen2.5-shaped model")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="--step-ops: where the step runs")
    ap.add_argument("--tokenizer", help="--shape: a tokenizer folder (default: the default model's)")
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                    help="model dtype (auto: bf16 where it is native, else float32)")
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32, 64])
    ap.add_argument("--reps", type=int, default=3, help="--attention: repetitions")
    ap.add_argument("--attn-columns", type=int, default=136, help="--attention: filled cache columns")
    ap.add_argument("--profile-steps", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    args.dtype = rollout_dtype(args.dtype, "cuda" if args.gpu_profile else args.device)
    if args.attention:
        ratios = bench_attention(args)
        print("RESULT name=decode_attention " + " ".join(f"b{B}_ratio={statistics.median(r):.2f}"
                                                         for B, r in ratios.items()))
        return
    from teamrl.models import load_model_and_tokenizer

    if args.step_ops:
        if args.shape:
            tok = prompt_tokenizer(args.tokenizer)
            model = random_model(args.shape, args.dtype, args.device)
        else:
            model, tok = load_model_and_tokenizer("default", dtype=args.dtype, device=args.device)
        res = step_ops(args, model.eval(), tok)
        print("RESULT name=step_ops " + " ".join(
            f"b{B}_ops_ratio={r['unfused_ops'] / r['fused_ops']:.2f} b{B}_time_ratio={r['unfused_ms'] / r['fused_ms']:.2f}"
            for B, r in res.items()))
        return
    if args.gpu_profile:
        if args.shape:
            tok = prompt_tokenizer(args.tokenizer)
            model = random_model(args.shape, args.dtype, "cuda")
        else:
            model, tok = load_model_and_tokenizer("default", dtype=args.dtype, device="cuda")
        gpu_profile(args, model.eval(), tok)
        return
    model, tok = load_model_and_tokenizer("default", dtype=args.dtype)
    model.eval()
    profile_steps(args, model, tok)


if __name__ == "__main__":
    main()
