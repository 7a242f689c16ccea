"""Where a team's evaluation spends its engine time (prefill vs decode steps), with shared-prefix prefill
off and on.

Runs the held-out evaluation of a config (``teamrl eval --untrained``: the same code, problems and sampling)
once per ``share_prefix`` value, alternating over ``--reps`` repetitions after a warm-up, and times the
``hf`` engine's two kinds of work: prefills (``FastDecoder.prefill``: admitting prompts, their first
token's logits) and decode steps (``FastDecoder.step``). The quickstart's replies are short (at most 32
and 16 tokens) and its prompts are not, so prefill is a large share of its rollouts. Also printed: the
prompt tokens the prefills received, after merging identical prompts, and after shared prefixes (of
which how many the engine's store of prefixes copied from earlier calls instead of running them).

    python benchmarks/eval_prefill.py configs/quickstart.yaml --problems 50 --reps 2

The dtype is what ``auto`` resolves on this machine (float32 without native bf16). Last line:
``RESULT name=eval_prefill prefill_ratio=... eval_ratio=...`` (prefill seconds and whole-evaluation seconds
with ``share_prefix`` 0 over the same with the largest value given, median of per-repetition ratios).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import time

import torch
from dtypes import rollout_dtype  # benchmarks/ is on sys.path when run as a script


def _timed(cls, name: str, acc: dict[str, float]) -> None:
    f = getattr(cls, name)

    def wrapped(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            acc[name] += time.perf_counter() - t

    setattr(cls, name, wrapped)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", nargs="?", default="configs/quickstart.yaml")
    ap.add_argument("--problems", type=int, default=50, help="held-out problems (x eval.samples episodes)")
    ap.add_argument("--share-prefix", type=int, nargs="+", default=[0, 16])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rollout_dtype("auto", "cpu")  # prints what auto resolves to here, and why

    from teamrl.config.schema import load_config
    from teamrl.engines.fast_decoder import FastDecoder
    from teamrl.engines.prefixes import prefix_groups
    from teamrl.study.evaluate import run_eval

    acc: dict[str, float] = collections.defaultdict(float)
    _timed(FastDecoder, "prefill", acc)
    _timed(FastDecoder, "step", acc)
    tokens: dict[str, int] = collections.Counter()
    prefill = FastDecoder.prefill

    def counting(self, prompts, first, max_new, *, share_prefix=0):
        distinct = [list(p) for p in {tuple(p): None for p in prompts}]
        tokens["prompts"] += sum(map(len, prompts))
        tokens["distinct"] += sum(map(len, distinct))
        groups = prefix_groups(distinct, share_prefix) if share_prefix else []
        tokens["shared"] += sum(map(len, distinct)) - sum((len(g) - 1) * n for g, n in groups)
        before = self.store.tokens_reused if self.store is not None else 0
        out = prefill(self, prompts, first, max_new, share_prefix=share_prefix)
        tokens["stored"] += (self.store.tokens_reused if self.store is not None else 0) - before
        return out

    FastDecoder.prefill = counting  # type: ignore[method-assign]
    rows: dict[int, list[tuple[float, float, float]]] = {s: [] for s in args.share_prefix}
    counts: dict[int, dict[str, int]] = {}
    with tempfile.TemporaryDirectory() as out:
        for rep in range(args.reps + 1):  # repetition 0 is the warm-up
            for sp in args.share_prefix:
                cfg = load_config(args.config, [f"run_dir={out}", f"eval.problems={args.problems}", "train.loggers=[]",
                                                f"models.main.share_prefix={sp}"])
                acc.clear()
                tokens.clear()
                t = time.perf_counter()
                run_eval(cfg, checkpoint=None, benchmarks={}, k=1, progress=False)
                wall = time.perf_counter() - t
                if rep:
                    rows[sp].append((wall, acc["prefill"], acc["step"]))
                    counts[sp] = dict(tokens)
                    print(f"rep {rep} share_prefix={sp}: evaluation {wall:.1f} s, prefill {acc['prefill']:.1f} s, "
                          f"decode steps {acc['step']:.1f} s", flush=True)
    for sp in args.share_prefix:
        wall, pre, dec = (statistics.median(r[i] for r in rows[sp]) for i in range(3))
        c = counts[sp]
        print(f"share_prefix={sp}: evaluation {wall:.1f} s, prefill {pre:.1f} s ({100 * pre / wall:.0f}%), decode "
              f"steps {dec:.1f} s ({100 * dec / wall:.0f}%); prompt tokens {c['prompts']:,}, distinct "
              f"{c['distinct']:,}, after shared prefixes {c.get('shared', c['distinct']):,}, of which copied from "
              f"earlier calls {c.get('stored', 0):,}")
    lo, hi = min(args.share_prefix), max(args.share_prefix)
    pre = statistics.median(a[1] / b[1] for a, b in zip(rows[lo], rows[hi]))
    ev = statistics.median(a[0] / b[0] for a, b in zip(rows[lo], rows[hi]))
    print(f"RESULT name=eval_prefill prefill_ratio={pre:.2f} eval_ratio={ev:.2f}")


if __name__ == "__main__":
    sys.exit(main())
