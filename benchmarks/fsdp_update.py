"""What FSDP2 sharding (``placement.sharding: fsdp``, ``offload``) saves per learner worker, and what it costs.

One learner update of ``--rows`` rows of ``--length`` tokens by ``--workers`` data-parallel workers (one
process each: gloo on the CPU, NCCL with one GPU per worker), once per layout, each in fresh
processes so that one layout's freed memory cannot hide another's peak:

- ``replicate``: every worker holds every weight, gradient and AdamW moment (one worker: no process group);
- ``fsdp``: FSDP2 shards them across the workers;
- ``fsdp_offload`` (``--offload``, GPUs): the shards and the optimizer step in CPU memory.

Per layout it prints the bytes of weights and AdamW state one worker holds on its device, its peak
memory during the update (``torch.cuda.max_memory_allocated``; on the CPU the process's peak RSS),
the update time and tokens/s (and MFU on GPUs); then the ratios against ``replicate``, beside the
ideal ``1/workers`` for the held bytes.

    python benchmarks/fsdp_update.py --model default --workers 2 --rows 8 --length 256       # CPU, 2 processes
    python benchmarks/fsdp_update.py --shape 7b --workers 1 --offload --checkpointing        # one GPU
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # shapes.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # teamrl, when run from a checkout

from dtypes import learner_autocast  # noqa: E402
from update_setup import add_update_args, build_model, check_update_args, update_rows, update_settings  # noqa: E402


def worker(rank: int, args: argparse.Namespace, layout: str, port: int, out: str) -> None:
    import resource

    import torch
    import torch.distributed as dist

    from teamrl.learner.learner import TorchLearner
    from teamrl.runtime.distributed.dp import DataParallel, ShardedDataParallel

    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    device = f"cuda:{rank}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(rank)
    grouped = layout != "replicate" or args.workers > 1
    if grouped:
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=args.workers)
    result: dict = {"rank": rank}
    try:
        model = build_model(args, device)
        n_params = sum(p.numel() for p in model.parameters())
        dp = (ShardedDataParallel(rank, args.workers, offload=layout == "fsdp_offload") if layout != "replicate"
              else DataParallel(rank, args.workers) if grouped else None)
        learner = TorchLearner("m", model, update_settings(args, fused_adamw=cuda), {"a": 1.0}, dp=dp)
        rows = update_rows(args, model.config.vocab_size)
        learner.update(rows[: 2 * args.workers])  # warm-up: allocates AdamW's state; not measured
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        learner.update(rows)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0

        def local(t):
            return t.to_local() if hasattr(t, "to_local") else t

        def on_device(t) -> int:
            t = local(t)
            return t.numel() * t.element_size() if t.device.type == ("cuda" if cuda else "cpu") else 0

        weights = sum(on_device(p) for p in model.parameters())
        moments = sum(on_device(v) for st in learner.optimizer.state.values() for v in st.values()
                      if isinstance(v, torch.Tensor) and v.dim() > 0)
        result.update(params=n_params, seconds=seconds, tokens=args.rows * args.length,
                      weights_gb=weights / 1e9, moments_gb=moments / 1e9,
                      peak_gb=(torch.cuda.max_memory_allocated() if cuda
                               else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) / 1e9)
    except torch.OutOfMemoryError:
        result["out_of_memory"] = 1
    if grouped:
        gathered: list = [None] * args.workers
        dist.all_gather_object(gathered, result)
        dist.destroy_process_group()
    else:
        gathered = [result]
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))


def measure(args: argparse.Namespace, layout: str) -> dict | None:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "result.json")
        mp.spawn(worker, args=(args, layout, port, out), nprocs=args.workers)
        ranks = json.loads(Path(out).read_text())
    if any(r.get("out_of_memory") for r in ranks):
        print(f"RESULT name=fsdp_update layout={layout} workers={args.workers} out_of_memory=1", flush=True)
        return None
    worst = max(ranks, key=lambda r: r["peak_gb"])
    m = {"layout": layout, "workers": args.workers, "params": worst["params"],
         "weights_gb": max(r["weights_gb"] for r in ranks), "moments_gb": max(r["moments_gb"] for r in ranks),
         "peak_gb": worst["peak_gb"], "seconds": max(r["seconds"] for r in ranks)}
    m["tokens_per_s"] = ranks[0]["tokens"] / m["seconds"]
    if args.device == "cuda":
        import torch

        from teamrl.metrics.perf import mfu, peak_tflops

        peak = peak_tflops(torch.cuda.get_device_name(), "bfloat16" if args.autocast else args.dtype)
        m["mfu"] = mfu(6 * m["params"] * ranks[0]["tokens"], m["seconds"], peak * args.workers) if peak else None
    print("RESULT name=fsdp_update " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                for k, v in m.items()), flush=True)
    return m


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_update_args(ap)
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")
    ap.add_argument("--workers", type=int, default=2, help="data-parallel workers (on GPUs: one GPU each)")
    ap.add_argument("--offload", action="store_true", help="also measure fsdp with CPU offload (GPUs)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads per worker")
    args = ap.parse_args(argv)
    check_update_args(ap, args)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.autocast = learner_autocast(args.autocast, args.device)
    if args.offload and args.device != "cuda":
        ap.error("--offload moves GPU memory to the CPU; it needs --device cuda")
    layouts = ["replicate", "fsdp"] + (["fsdp_offload"] if args.offload else [])
    got = {layout: measure(args, layout) for layout in layouts}
    base = got["replicate"]
    for layout in layouts[1:]:
        m = got[layout]
        if base and m:
            held = (m["weights_gb"] + m["moments_gb"]) / (base["weights_gb"] + base["moments_gb"])
            print(f"RESULT name=fsdp_update_ratio layout={layout} held_ratio={held:.3f} "
                  f"ideal={0 if layout == 'fsdp_offload' else 1 / args.workers:.3f} "
                  f"peak_ratio={m['peak_gb'] / base['peak_gb']:.3f} time_ratio={m['seconds'] / base['seconds']:.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
