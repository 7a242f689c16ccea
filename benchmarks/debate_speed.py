"""MAD-OPD's debate (``algo.distill.debate_rounds``): its generation as first written (float32, 16 prompts per
``generate`` call) against as shipped (bf16 autocast where the CPU has bf16 products, 64 per call), on the same
prompts in one process.

    python benchmarks/debate_speed.py --prompts 32 [--teacher-a DIR --teacher-b DIR]

Two teachers (default: the embedded model twice) debate ``--prompts`` arithmetic questions for 2 rounds of at most
``--tokens`` tokens per answer. Prints each way's seconds, tokens written and tokens/s, the share of debates in which
both teachers tagged a confidence, and the ratio; last line ``RESULT name=debate_speed ...``.
"""

from __future__ import annotations

import argparse
import time

import torch

from teamrl.models import load_model_and_tokenizer
from teamrl.scoring import debate as debates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--teacher-a", default="default")
    ap.add_argument("--teacher-b", default="default")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    ta, tok = load_model_and_tokenizer(args.teacher_a, dtype="float32", device="cpu")
    tb, _ = load_model_and_tokenizer(args.teacher_b, dtype="float32", device="cpu")
    prompts = [tok.decode(tok.apply_chat_template([{"role": "user", "content": f"What is {i} + {2 * i + 3}?"}],
                                                  add_generation_prompt=True), skip_special_tokens=True).strip()
               for i in range(args.prompts)]
    seconds = {}
    for name, batch, bf16 in [("float32, 16 per call", 16, False), ("bf16 autocast, 64 per call", 64, True)]:
        debates.BATCH = batch
        torch.manual_seed(0)
        t0 = time.perf_counter()
        found = debates.debate((ta.eval(), tb.eval()), tok, prompts, debates.Sampling(args.tokens, 0.7, 0.8, 20, bf16),
                               rounds=2)
        seconds[name] = time.perf_counter() - t0
        written = sum(d.tokens for d in found)
        tagged = sum(min(d.confidences) >= 0 for d in found)
        print(f"{name}: {seconds[name]:.1f} s for {len(prompts)} prompts x 2 teachers x 2 rounds, {written} tokens "
              f"written ({written / seconds[name]:.0f} tokens/s), both confidences tagged in {tagged}/{len(prompts)}")
    before, after = seconds.values()
    print(f"RESULT name=debate_speed before_s={before:.1f} after_s={after:.1f} ratio={before / after:.2f}")


if __name__ == "__main__":
    main()
