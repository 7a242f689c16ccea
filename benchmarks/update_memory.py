"""Peak memory, tokens/s and MFU of one learner update, for a model path or a Qwen2.5-shaped random model.

Each measurement runs in a fresh subprocess (so one run's freed memory cannot hide another's
peak): one PPO update of ``--rows`` rows of ``--length`` tokens (``--prompt`` of them prompt),
with the given micro-batch size, logits chunk and gradient checkpointing. On CUDA the peak is
``torch.cuda.max_memory_allocated``; on the CPU the peak resident set size.

    python benchmarks/update_memory.py --shape tiny --rows 8 --length 256            # CPU, seconds
    python benchmarks/update_memory.py --model default --rows 16 --length 512 --chunk 1024 --compare-chunking
    python benchmarks/update_memory.py --shape 1.5b --rows 64 --length 512 --find-max  # on a GPU

``--compare-chunking`` measures with ``--chunk`` and with no chunking (0); ``--compare-states``
with float32 and with 8-bit AdamW moments (``optim.states``), and prints their ratios. ``--find-max`` doubles
the micro-batch from 1024 tokens until a run runs out of memory, with and without checkpointing,
and reports the largest that fits. Random weights serve for speed and memory: they do not depend
on the weights. Prints one ``RESULT`` line per measurement.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from dtypes import learner_autocast  # benchmarks/ is on sys.path
from update_setup import (  # benchmarks/ is on sys.path
    add_update_args,
    build_model,
    check_update_args,
    update_rows,
    update_settings,
)


def child(args) -> None:
    import torch

    from teamrl.learner.learner import TorchLearner

    torch.set_num_threads(args.threads)
    from teamrl.metrics.memory import peak_rss_gb

    args.base_rss_gb = peak_rss_gb()  # the process before the model: Python, torch, transformers
    model = build_model(args, args.device)
    n_params = sum(p.numel() for p in model.parameters())  # MFU counts the base model's FLOPs under LoRA too
    if args.lora:
        from teamrl.config.schema import LoraConfig
        from teamrl.runtime.local import add_adapters

        model = add_adapters(model, LoraConfig(rank=args.lora, targets=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                        "gate_proj", "up_proj", "down_proj"]), ["a"])
    s = update_settings(args, optim_states=args.optim_states)
    learner = TorchLearner("m", model, s, {"a": 1.0}, agent_adapters={"a": "a"} if args.lora else None)
    rows = update_rows(args, model.config.vocab_size)
    learner.update(rows[:2])  # warm-up (allocates AdamW's state); not measured
    mb = args.micro_batch
    while True:  # one size, or (--search) doubling sizes until one runs out of memory; one JSON line each
        learner.micro_batch_tokens = mb
        try:
            out = measure_update(args, learner, model, rows, n_params)
        except torch.OutOfMemoryError:
            out = None
        print(json.dumps({"micro_batch": mb, **(out or {"out_of_memory": 1})}), flush=True)
        mb *= 2
        if out is None or not args.search or mb > args.rows * args.length:
            return


def measure_update(args, learner, model, rows, n_params: int) -> dict:
    import torch

    from teamrl.metrics.memory import PeakMemory
    from teamrl.metrics.perf import mfu, peak_tflops

    meter = PeakMemory()
    if meter.cuda:
        torch.cuda.synchronize()
    with meter.phase("update"):
        t0 = time.perf_counter()
        learner.update(rows)
        if meter.cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    tokens = args.rows * args.length
    moments = sum(x.numel() * x.element_size() for st in learner.optimizer.state.values()
                  for key in ("exp_avg", "exp_avg_sq")
                  for x in ((st[key].codes, st[key].scale) if hasattr(st[key], "codes") else (st[key],)))
    out = {"params": n_params, "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
           "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
           "optim_states": args.optim_states, "moment_gb": moments / 1e9,
           **{k.split("/")[1]: v for k, v in meter.metrics().items()}}
    if not meter.cuda:
        out["planned_rss"] = args.base_rss_gb + planned_update_bytes(args, model) / 2**30
    if meter.cuda:
        peak = peak_tflops(torch.cuda.get_device_name(), "bfloat16" if args.autocast else args.dtype)
        flops = (4 if args.lora else 6) * n_params * tokens  # LoRA: no gradients of the frozen base weights
        out["mfu"] = mfu(flops, seconds, peak) if peak else None
    return out


def planned_update_bytes(args, model) -> float:
    """teamrl.plan's bytes of this update, the engine left out: weights, gradients, AdamW's moments, activations."""
    from teamrl.config.model import LoraConfig, ModelConfig, OptimConfig
    from teamrl.plan import Shape, plan_model

    c = model.config
    shape = Shape(c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.num_attention_heads,
                  c.num_key_value_heads, c.vocab_size, bool(c.tie_word_embeddings), getattr(c, "head_dim", 0) or 0)
    mc = ModelConfig(path="planned", dtype=args.dtype, gradient_checkpointing=args.checkpointing,
                     checkpoint_layers=args.checkpoint_layers,
                     train_autocast="bfloat16" if args.autocast else "none",
                     optim=OptimConfig(states=args.optim_states),
                     lora=LoraConfig(rank=args.lora, targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                              "up_proj", "down_proj"]))
    p = plan_model("m", mc, shape, tokens=min(args.micro_batch, args.rows * args.length), logits_chunk=args.chunk,
                   context=args.length, ray=False, on_gpu=False, bf16_native=bool(args.autocast),
                   release=True, agents=1)
    return p.weights - p.copies + p.train + p.activations


def run_child(argv: list[str], label: str = "", **over) -> list[dict]:
    """Run one child process; print a RESULT line for each measurement as it arrives; return them all."""
    extra = [f"--{k.replace('_', '-')}={v}" for k, v in over.items() if not isinstance(v, bool)]
    extra += [f"--{k.replace('_', '-')}" for k, v in over.items() if v is True]
    proc = subprocess.Popen([sys.executable, __file__, *argv, *extra, "--child"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    got = []
    for line in proc.stdout:  # type: ignore[union-attr]
        if line.startswith("{"):
            m = json.loads(line)
            got.append(m)
            report(label, None if m.get("out_of_memory") else m, m["micro_batch"])
    err = proc.stderr.read()  # type: ignore[union-attr]
    if proc.wait() != 0 and "out of memory" not in err.lower():
        raise RuntimeError(err[-2000:])
    if proc.returncode != 0 and not any(m.get("out_of_memory") for m in got):  # out of memory outside the update
        report(label, None, over.get("micro_batch", "?"))
        got.append({"out_of_memory": 1})
    return got


def measure(argv: list[str], label: str, **over) -> dict | None:
    got = run_child(argv, label, **over)
    return None if not got or got[-1].get("out_of_memory") else got[-1]


def report(label: str, m: dict | None, micro_batch) -> None:
    if m is None:
        print(f"RESULT name=update_memory {label} micro_batch={micro_batch} out_of_memory=1", flush=True)
        return
    print(f"RESULT name=update_memory {label} " + " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in m.items()), flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_update_args(ap)
    ap.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda when available)")
    ap.add_argument("--lora", type=int, default=0, help="LoRA rank on every linear layer (0: full fine-tuning)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--optim-states", choices=["float32", "8bit"], default="float32",
                    help="optim.states: AdamW's moments in float32 or 8 bit (needs torchao)")
    ap.add_argument("--compare-chunking", action="store_true", help="also measure with --chunk 0")
    ap.add_argument("--compare-states", action="store_true", help="also measure with 8-bit AdamW moments")
    ap.add_argument("--find-max", action="store_true", help="largest micro-batch that fits, with and without checkpointing")
    ap.add_argument("--compare-settings", action="store_true",
                    help="the former settings (logits chunk 1024, no checkpointing) against the quickstart's (chunk 256, "
                         "checkpointing) instead, same rows and micro-batch; prints their peak and time ratios")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--search", action="store_true", help=argparse.SUPPRESS)  # child: doubling sizes until OOM
    args = ap.parse_args(argv)
    check_update_args(ap, args)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.child:
        args.autocast = learner_autocast(args.autocast, args.device)
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        child(args)
        return
    argv = [a for a in (argv if argv is not None else sys.argv[1:])
            if a not in ("--compare-chunking", "--compare-states", "--find-max", "--compare-settings")]
    argv += [f"--device={args.device}"]
    if args.find_max:
        start = 1024
        for ckpt in (False, True):  # checkpointing fits at least what fits without it: start the search there
            got = run_child(argv, f"checkpointing={int(ckpt)}", micro_batch=start, checkpointing=ckpt, search=True)
            fit = [m for m in got if not m.get("out_of_memory")]
            if fit:
                start = fit[-1]["micro_batch"]
            print(f"RESULT name=update_memory_max checkpointing={int(ckpt)} "
                  f"largest_micro_batch={fit[-1]['micro_batch'] if fit else 0}", flush=True)
        return
    if args.compare_settings:  # docs/memory.md: the memory settings the quickstart trains with, on this device
        plain = [a for a in argv if a != "--checkpointing"]
        former = measure(plain, "former: chunk=1024 checkpointing=0", chunk=1024)
        now = measure(plain, "quickstart: chunk=256 checkpointing=1", chunk=256, checkpointing=True)
        if former and now:
            key = "cuda_max_allocated_gb" if "cuda_max_allocated_gb" in former else "peak_rss_gb"
            print(f"RESULT name=update_memory_settings peak_ratio={now[key] / former[key]:.3f} "
                  f"time_ratio={now['seconds'] / former['seconds']:.3f}", flush=True)
        return
    measure(argv, f"chunk={args.chunk}")
    if args.compare_chunking:
        measure(argv, "chunk=0", chunk=0)
    if args.compare_states:
        base, low = measure(argv, "states=float32", optim_states="float32"), measure(argv, "states=8bit",
                                                                                      optim_states="8bit")
        if base and low:
            key = "cuda_max_allocated_gb" if "cuda_max_allocated_gb" in base else "peak_rss_gb"
            print(f"RESULT name=update_memory_states moment_ratio={low['moment_gb'] / base['moment_gb']:.3f} "
                  f"peak_ratio={low[key] / base[key]:.3f} "
                  f"time_ratio={low['seconds'] / base['seconds']:.3f}")


if __name__ == "__main__":
    main()
