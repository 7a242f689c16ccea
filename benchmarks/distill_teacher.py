"""Seconds of a distillation teacher's forward over one quickstart step's trained rows, padded against packed.

The stage (``teamrl/scoring/distill.py``) scores every trained reply with the teacher. This script builds the rows of
one quickstart step with the embedded SmolLM2-135M-Instruct as the teacher: 8 prompts x 8 replies, the prompts
written by the chat template, replies of ``--reply`` tokens. It times ``Distill.apply`` on them three ways, in one
process, alternating:

* padded fp32 (each row to the longest);
* packed without padding, each prompt's tokens computed once (``loss.pack_rows``, ``loss.share_prefixes``);
* the same under bf16 autocast (where the CPU has native bf16, as the learner then runs).

It prints the median of ``--repeats`` runs of each, their ratios to the padded one, and the compute floor of the
forward (2 x params x tokens computed, at ``teamrl.plan.limits``' measured matmul peak).

    python benchmarks/distill_teacher.py

Last line: ``RESULT name=distill_teacher padded_s=... packed_s=... packed_bf16_s=... packed_ratio=... bf16_ratio=...``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from teamrl.models import load_model_and_tokenizer
from teamrl.plan.limits import cpu_limits
from teamrl.scoring.distill import Distill
from teamrl.team.records import Step


def rows(tok, prompts: int, samples: int, reply: int) -> list[Step]:
    g = torch.Generator().manual_seed(0)
    out = []
    for p in range(prompts):
        ids = tok.apply_chat_template([{"role": "user", "content": f"What is {3 * p + 4} + {7 * p + 2}? Answer with "
                                        f"the number only, then say it again in words, please."}],
                                      add_generation_prompt=True, tokenize=True, return_dict=False)
        for s in range(samples):
            resp = torch.randint(100, 20000, (reply,), generator=g).tolist()
            out.append(Step(p, s, "solver", 0, "m", list(ids), resp, [-2.0] * reply, 1.0, "", True))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--reply", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    model, tok = load_model_and_tokenizer("default", dtype="float32", device="cpu")
    model.requires_grad_(False).eval()
    batch = rows(tok, args.prompts, args.samples, args.reply)
    ways = {"padded": (False, False, False), "packed": (True, True, False), "packed_bf16": (True, True, True)}
    stages = {name: Distill({"solver": model}, pack=p, logits_chunk=1024) for name, p in ways.items()}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, stage in stages.items():
            t0 = time.perf_counter()
            stage.apply(batch)
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(v) for name, v in times.items()}
    params = sum(p.numel() for p in model.parameters())
    prompt_tokens = sum(len(batch[i * args.samples].prompt_ids) for i in range(args.prompts))
    padded_tokens = len(batch) * max(len(r.prompt_ids) + len(r.response_ids) for r in batch)
    shared_tokens = prompt_tokens + len(batch) * args.reply
    lim = cpu_limits()  # cached, else measured (a busy machine: measured again next time)
    for name, s in med.items():
        tokens = padded_tokens if name == "padded" else shared_tokens
        peak = lim.peak("bfloat16" if name.endswith("bf16") else "float32") * 1e9
        floor = 2 * params * tokens / peak
        print(f"{name:12s} {s:7.3f} s  ({tokens:,} tokens computed; floor {floor:.3f} s, {floor / s:.0%} of it)  "
              f"x{med['padded'] / s:.2f} against padded")
    print(f"RESULT name=distill_teacher padded_s={med['padded']:.3f} packed_s={med['packed']:.3f} "
          f"packed_bf16_s={med['packed_bf16']:.3f} packed_ratio={med['padded'] / med['packed']:.2f} "
          f"bf16_ratio={med['padded'] / med['packed_bf16']:.2f}")


if __name__ == "__main__":
    main()
