"""How far the engine's sampling log-probs are from the learner's recomputation, per dtype.

The PPO/GRPO ratio is exp(learner log-prob - old log-prob). With ``loss.old_logprobs: engine`` the
old log-probs are the engine's, so any numerical gap between the engine and the learner shows up as
a ratio != 1 before the first update (and, past the clip range, as clipped tokens). This script
samples replies with the ``hf`` engine (SmolLM2-135M-Instruct, the rollout benchmark's prompts,
temperature ``--temperature``, at most ``--new-tokens`` tokens, stopping at end of turn) in fp32
and in bf16, and recomputes the same tokens' log-probs with the learner's function
(``teamrl.learner.learner.response_logprobs``) on the fp32 model, with and without bf16 autocast
(``models.<m>.train_autocast``). For each pair it prints, over all sampled tokens: max and mean
absolute difference, the 99th percentile, the mean signed difference, the share of tokens whose
token-level ratio leaves [1 - eps, 1 + eps] (``--clip``, PPO's clip range), and the largest
deviation of a sequence-level (GSPO) ratio exp(mean difference) from 1.

    python benchmarks/logprobs.py
    python benchmarks/logprobs.py --prompts 64 --new-tokens 128 --temperature 1.0

Last line: ``RESULT name=logprobs fp32_max=... bf16_max=... bf16_mean=... bf16_clip_frac=...
bf16_autocast_max=...`` (fp32: fp32 engine vs fp32 learner; bf16: bf16 engine vs fp32 learner;
bf16_autocast: bf16 engine vs the learner under bf16 autocast).
"""

from __future__ import annotations

import argparse
import time

import torch
from rollout import make_prompts  # the rollout benchmark's prompts (same folder)


def sample(model, tok, prompts, dtype, args):
    from teamrl.engines.base import GenRequest, SamplingParams
    from teamrl.engines.hf import HFEngine

    engine = HFEngine(model, tok, seed=args.seed, dtype=dtype)
    reqs = [GenRequest(p, SamplingParams(temperature=args.temperature, max_new_tokens=args.new_tokens)) for p in prompts]
    t0 = time.perf_counter()
    outs = engine.generate(reqs)
    return outs, time.perf_counter() - t0


def recompute(model, prompts, outs, temperature: float, autocast: bool) -> list[torch.Tensor]:
    from teamrl.learner.learner import response_logprobs
    from teamrl.team.records import Step

    rows = [Step(prompt_index=0, episode=i, agent="a", agent_call=0, model="m", prompt_ids=p, response_ids=o.response_ids,
                 logprobs=o.logprobs, temperature=temperature, text=o.text, valid=True)
            for i, (p, o) in enumerate(zip(prompts, outs))]
    out = []
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        for i in range(0, len(rows), 8):  # the learner's micro-batches are of this order
            logp, _, _ = response_logprobs(model, rows[i:i + 8])
            out += [logp[b, :len(r.response_ids)].float() for b, r in enumerate(rows[i:i + 8])]
    return out


def compare(name: str, learner: list[torch.Tensor], outs, clip: float) -> dict[str, float]:
    d = [lp - torch.tensor(o.logprobs) for lp, o in zip(learner, outs)]  # learner - engine, per token
    flat = torch.cat(d)
    a = flat.abs()
    ratio = flat.exp()
    seq = torch.stack([x.mean() for x in d if len(x)]).exp()
    s = {"tokens": len(flat), "max": float(a.max()), "mean": float(a.mean()), "p99": float(a.quantile(0.99)),
         "bias": float(flat.mean()), "clip_frac": float(((ratio - 1).abs() > clip).float().mean()),
         "seq_ratio_dev": float((seq - 1).abs().max())}
    print(f"{name:<34} tokens={s['tokens']:>5}  max|d|={s['max']:.2e}  mean|d|={s['mean']:.2e}  "
          f"p99|d|={s['p99']:.2e}  mean d={s['bias']:+.1e}  outside 1±{clip}: {100 * s['clip_frac']:.2f}%  "
          f"max|seq ratio-1|={s['seq_ratio_dev']:.2e}")
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--clip", type=float, default=0.2, help="PPO clip range eps for the clipped-token share")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from teamrl.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer("default")  # fp32: the learner's weights
    model.eval()
    prompts = make_prompts(tok, args.prompts)
    res = {}
    for label, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        outs, secs = sample(model, tok, prompts, dtype, args)
        n = sum(len(o.response_ids) for o in outs)
        print(f"engine {label}: {n} tokens sampled in {secs:.1f} s")
        res[label] = compare(f"engine {label} vs learner fp32", recompute(model, prompts, outs, args.temperature, False),
                             outs, args.clip)
        if label == "bf16":
            res["bf16_autocast"] = compare("engine bf16 vs learner bf16-autocast",
                                           recompute(model, prompts, outs, args.temperature, True), outs, args.clip)
    print(f"RESULT name=logprobs fp32_max={res['fp32']['max']:.2e} bf16_max={res['bf16']['max']:.2e} "
          f"bf16_mean={res['bf16']['mean']:.2e} bf16_clip_frac={res['bf16']['clip_frac']:.4f} "
          f"bf16_autocast_max={res['bf16_autocast']['max']:.2e} bf16_autocast_mean={res['bf16_autocast']['mean']:.2e}")


if __name__ == "__main__":
    main()
