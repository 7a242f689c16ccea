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

# Qwen2.5 dimensions (config.json of the Qwen/Qwen2.5-*-Instruct models): layers, hidden, intermediate, heads, kv heads
SHAPES = {"tiny": (2, 128, 256, 4, 2), "0.5b": (24, 896, 4864, 14, 2), "1.5b": (28, 1536, 8960, 12, 2),
          "3b": (36, 2048, 11008, 16, 2), "7b": (28, 3584, 18944, 28, 4)}
VOCAB = 151936


def build_model(args):
    import torch

    if args.model:
        from teamrl.models import load_model_and_tokenizer

        return load_model_and_tokenizer(args.model, dtype=args.dtype, device=args.device)[0]
    from transformers import Qwen2Config, Qwen2ForCausalLM

    layers, hidden, inter, heads, kv = SHAPES[args.shape]
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=32768,
                      tie_word_embeddings=args.shape in ("tiny", "0.5b", "1.5b", "3b"))
    torch.manual_seed(0)
    with torch.device(args.device):
        return Qwen2ForCausalLM(cfg).to(getattr(torch, args.dtype))


def child(args) -> dict:
    import torch

    from teamrl.learner.learner import LearnerSettings, TorchLearner
    from teamrl.metrics.memory import PeakMemory
    from teamrl.metrics.perf import mfu, peak_tflops
    from teamrl.runtime.local import enable_checkpointing
    from teamrl.team.records import Step

    torch.set_num_threads(args.threads)
    model = build_model(args)
    if args.checkpointing:
        enable_checkpointing(model)
    n_params = sum(p.numel() for p in model.parameters())
    s = LearnerSettings(lr=1e-6, betas=(0.9, 0.999), weight_decay=0.0, grad_clip=1.0, warmup_steps=0,
                        schedule="constant", total_steps=1, clip_low=0.2, clip_high=0.2, dual_clip=None,
                        agg="token-mean", level="token", kl_coef=0.0, kl_kind="k3", entropy_coef=0.0,
                        micro_batch_tokens=args.micro_batch, updates_per_batch=1, old_logprobs="engine",
                        autocast=args.autocast, logits_chunk_tokens=args.chunk,
                        fused_adamw=args.device.startswith("cuda"), optim_states=args.optim_states)
    learner = TorchLearner("m", model, s, {"a": 1.0})
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    rows = [Step(prompt_index=0, episode=i, agent="a", agent_call=0, model="m",
                 prompt_ids=torch.randint(0, vocab, (args.prompt,), generator=g).tolist(),
                 response_ids=torch.randint(0, vocab, (args.length - args.prompt,), generator=g).tolist(),
                 logprobs=[-5.0] * (args.length - args.prompt), temperature=1.0, text="", valid=True,
                 advantage=1.0 if i % 2 else -1.0) for i in range(args.rows)]
    meter = PeakMemory()
    learner.update(rows[:2])  # warm-up (allocates AdamW's state); not measured
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
    out = {"params": n_params, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
           "optim_states": args.optim_states, "moment_gb": moments / 1e9,
           **{k.split("/")[1]: v for k, v in meter.metrics().items()}}
    if meter.cuda:
        peak = peak_tflops(torch.cuda.get_device_name(), "bfloat16" if args.autocast else args.dtype)
        out["mfu"] = mfu(6 * n_params * tokens, seconds, peak) if peak else None
    return out


def measure(argv: list[str], **over) -> dict | None:
    extra = [f"--{k.replace('_', '-')}={v}" for k, v in over.items() if not isinstance(v, bool)]
    extra += [f"--{k.replace('_', '-')}" for k, v in over.items() if v is True]
    r = subprocess.run([sys.executable, __file__, *argv, *extra, "--child"], capture_output=True, text=True)
    if r.returncode != 0:
        if "out of memory" in r.stderr.lower():
            return None
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def report(label: str, m: dict | None) -> None:
    if m is None:
        print(f"RESULT name=update_memory {label} out_of_memory=1")
        return
    print(f"RESULT name=update_memory {label} " + " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in m.items()))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--model", help="a model path or hub id ('default': the embedded SmolLM2-135M)")
    src.add_argument("--shape", choices=sorted(SHAPES), default="tiny", help="a random Qwen2.5-shaped model")
    ap.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda when available)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weight dtype")
    ap.add_argument("--no-autocast", dest="autocast", action="store_false", help="no bf16 autocast")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--length", type=int, default=256, help="tokens per row (prompt + response)")
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens per row")
    ap.add_argument("--micro-batch", type=int, default=4096, help="loss.micro_batch_tokens")
    ap.add_argument("--chunk", type=int, default=4096, help="loss.logits_chunk_tokens (0: all at once)")
    ap.add_argument("--checkpointing", action="store_true", help="gradient checkpointing")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--optim-states", choices=["float32", "8bit"], default="float32",
                    help="optim.states: AdamW's moments in float32 or 8 bit (needs torchao)")
    ap.add_argument("--compare-chunking", action="store_true", help="also measure with --chunk 0")
    ap.add_argument("--compare-states", action="store_true", help="also measure with 8-bit AdamW moments")
    ap.add_argument("--find-max", action="store_true", help="largest micro-batch that fits, with and without checkpointing")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.child:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        print(json.dumps(child(args)))
        return
    argv = [a for a in (argv if argv is not None else sys.argv[1:]) if a not in ("--compare-chunking", "--compare-states", "--find-max")]
    argv += [f"--device={args.device}"]
    if args.find_max:
        for ckpt in (False, True):
            best, mb = None, 1024
            while mb <= args.rows * args.length:
                m = measure(argv, micro_batch=mb, checkpointing=ckpt)
                if m is None:
                    break
                best = (mb, m)
                mb *= 2
            report(f"checkpointing={int(ckpt)} largest_micro_batch={best[0] if best else 0}", best[1] if best else None)
        return
    report(f"chunk={args.chunk}", measure(argv))
    if args.compare_chunking:
        report("chunk=0", measure(argv, chunk=0))
    if args.compare_states:
        base, low = measure(argv, optim_states="float32"), measure(argv, optim_states="8bit")
        report("states=float32", base)
        report("states=8bit", low)
        if base and low:
            key = "cuda_max_allocated_gb" if "cuda_max_allocated_gb" in base else "peak_rss_gb"
            print(f"RESULT name=update_memory_states moment_ratio={low['moment_gb'] / base['moment_gb']:.3f} "
                  f"peak_ratio={low[key] / base[key]:.3f} "
                  f"time_ratio={low['seconds'] / base['seconds']:.3f}")


if __name__ == "__main__":
    main()
