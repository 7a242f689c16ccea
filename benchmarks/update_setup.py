"""What the learner-update benchmarks share: their command-line options, model, rows and learner settings."""

from __future__ import annotations

import argparse

from shapes import SHAPES, random_model  # benchmarks/ is on sys.path when run as a script


def add_update_args(ap: argparse.ArgumentParser) -> None:
    """The model and the update: which model, its dtype and autocast, the rows, micro-batch, chunk, checkpointing."""
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--model", help="a model path or hub id ('default': the embedded SmolLM2-135M)")
    src.add_argument("--shape", choices=sorted(SHAPES), default="tiny", help="a random Qwen2.5-shaped model")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weight dtype (float32: "
                    "what dtype: auto keeps for a trained model)")
    ap.add_argument("--no-autocast", dest="autocast", action="store_false", default=None,
                    help="no bf16 autocast (default: auto, bf16 autocast where bf16 is native, as train_autocast: auto)")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--length", type=int, default=256, help="tokens per row (prompt + response)")
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens per row")
    ap.add_argument("--micro-batch", type=int, default=4096, help="loss.micro_batch_tokens")
    ap.add_argument("--chunk", type=int, default=4096, help="loss.logits_chunk_tokens (0: all at once)")
    ap.add_argument("--checkpointing", action="store_true", help="gradient checkpointing")
    ap.add_argument("--checkpoint-layers", type=float, default=1.0,
                    help="with --checkpointing, the fraction of decoder layers recomputed (models.<m>.checkpoint_layers)")
    ap.add_argument("--packing", choices=["padded", "packed", "shared"], default="padded",
                    help="loss.pack_rows / share_prefixes: padded rows (both off), packed rows, packed + shared prefixes")
    ap.add_argument("--group", type=int, default=1,
                    help="rows share their prompt in groups of this size (GRPO's group; 1: every prompt different)")


def check_update_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, as argparse does, the option values :func:`add_update_args` cannot check one by one."""
    if not 0 < args.checkpoint_layers <= 1 or (args.checkpoint_layers < 1 and not args.checkpointing):
        ap.error(f"--checkpoint-layers {args.checkpoint_layers}: a fraction in (0, 1], with --checkpointing")


def build_model(args: argparse.Namespace, device: str):
    """``--model`` loaded, or a random model of ``--shape``, on ``device``, checkpointed with ``--checkpointing``
    (``--checkpoint-layers`` of its layers)."""
    from teamrl.runtime.local import enable_checkpointing

    if args.model:
        from teamrl.models import load_model_and_tokenizer

        model = load_model_and_tokenizer(args.model, dtype=args.dtype, device=device)[0]
    else:
        model = random_model(args.shape, args.dtype, device)
    if args.checkpointing:
        enable_checkpointing(model, args.checkpoint_layers)
    return model


def update_settings(args: argparse.Namespace, **over):
    """One PPO update per batch at lr 1e-6, clipped at 1.0, with the options' micro-batch, chunk and autocast."""
    from teamrl.learner.learner import LearnerSettings

    base = dict(lr=1e-6, betas=(0.9, 0.999), weight_decay=0.0, grad_clip=1.0, warmup_steps=0, schedule="constant",
                total_steps=2, clip_low=0.2, clip_high=0.2, dual_clip=None, agg="token-mean", level="token",
                kl_coef=0.0, kl_kind="k3", entropy_coef=0.0, micro_batch_tokens=args.micro_batch,
                updates_per_batch=1, old_logprobs="engine", autocast=args.autocast,
                logits_chunk_tokens=args.chunk, fused_adamw=True,  # whole weights: teamrl.runtime.local.fused_adamw
                pack_rows=args.packing != "padded", share_prefixes=args.packing == "shared")
    return LearnerSettings(**{**base, **over})


def update_rows(args: argparse.Namespace, vocab: int) -> list:
    """``--rows`` rows of agent ``a`` with random tokens (seed 0), advantages +1 and -1 in turn; the rows of each
    ``--group`` share one prompt."""
    import torch

    from teamrl.team.records import Step

    g = torch.Generator().manual_seed(0)
    response = args.length - args.prompt
    prompts = [torch.randint(0, vocab, (args.prompt,), generator=g).tolist() for _ in range(args.rows)]
    return [Step(prompt_index=i // args.group, episode=i, agent="a", agent_call=0, model="m",
                 prompt_ids=prompts[i - i % args.group],
                 response_ids=torch.randint(0, vocab, (response,), generator=g).tolist(),
                 logprobs=[-5.0] * response, temperature=1.0, text="", valid=True,
                 advantage=1.0 if i % 2 else -1.0) for i in range(args.rows)]
