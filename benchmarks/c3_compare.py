"""C3 against Dr. MAS and SHARP on the quickstart's math team, on the CPU, over seeds.

Three arms, each the shipped config of its method with the same shortened schedule:

* ``drmas``: ``configs/quickstart.yaml`` (Dr. MAS's per-agent normalisation, 8 independent episodes per problem);
* ``sharp``: ``configs/math_team_sharp.yaml`` (SHARP's Shapley credit over the math team's own counterfactual);
* ``c3``: ``configs/math_team_c3.yaml`` (C3: the 8 episodes of a problem a 2 x 4 prefix tree, sibling credit).

Every run trains ``--steps`` steps of ``--batch`` problems from the embedded SmolLM2-135M-Instruct with
``train.seed`` = each seed, then is scored on the same ``--problems`` held-out problems (``--samples`` answers each,
the config's temperature). The rollout budget is the same number of episodes per problem (8); the tokens each arm
generated are measured and printed (C3 generates fewer: the first answer under each 4 verdicts is replayed, not
generated again). The untrained model is scored once on the same problems.

    python benchmarks/c3_compare.py --seeds 3

Prints a table of accuracy (mean and 95% t-interval over seeds), the paired difference to drmas by seed, tokens
generated and seconds per run; last line ``RESULT name=c3_compare ...``. Runs go one after another (one CPU-heavy job).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from teamrl.study.stats import format_difference, format_interval, mean_ci, paired_ci

REPO = Path(__file__).resolve().parents[1]
ARMS = {"drmas": "configs/quickstart.yaml", "sharp": "configs/math_team_sharp.yaml", "c3": "configs/math_team_c3.yaml"}


def train(arm: str, seed: int, out: Path, args: argparse.Namespace, *, before: bool) -> dict[str, float]:
    run = out / f"{arm}_seed{seed}"
    if not (run / "summary.json").is_file():
        cmd = [sys.executable, "-m", "teamrl.cli", "train", str(REPO / ARMS[arm]), f"run_dir={run}",
               f"train.seed={seed}", f"train.steps={args.steps}", f"rollout.batch_size={args.batch}",
               f"train.save_every={args.steps}", "train.loggers=[]", f"eval.before={str(before).lower()}",
               f"eval.problems={args.problems}", f"eval.samples={args.samples}"]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        (run / "wall_s.txt").write_text(f"{time.perf_counter() - t0:.1f}\n")
    summary = json.loads((run / "summary.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "perf/rollout/decoded_tokens" in r and "rollout/reward_mean" in r]
    tokens = sum(r["perf/rollout/decoded_tokens"] for r in train_rows)
    return {"after": float(summary["after"]["accuracy"]),
            "before": float(summary.get("before", {}).get("accuracy", float("nan"))),
            "tokens": float(tokens), "seconds": float((run / "wall_s.txt").read_text())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--problems", type=int, default=100)
    ap.add_argument("--samples", type=int, default=1)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "c3_compare")
    args = ap.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    found: dict[str, dict[int, dict[str, float]]] = {a: {} for a in arms}
    for seed in range(args.seeds):
        for arm in arms:
            found[arm][seed] = train(arm, seed, args.out, args, before=arm == arms[0] and seed == 0)
            r = found[arm][seed]
            print(f"{arm} seed {seed}: accuracy {r['after']:.3f}, {r['tokens']:.0f} tokens generated, "
                  f"{r['seconds']:.0f} s", flush=True)
    untrained = found[arms[0]][0]["before"]
    print(f"\nheld-out accuracy on {args.problems} problems x {args.samples}, after {args.steps} steps of {args.batch} "
          f"problems x 8 episodes; untrained {untrained:.3f}; {args.seeds} seeds; 95% t-intervals")
    print(f"{'arm':<6} {'accuracy':<22} {'minus drmas (paired)':<26} {'tokens/run':>10} {'s/run':>6}")
    parts = [f"untrained={untrained:.3f}"]
    for arm in arms:
        acc = {s: r["after"] for s, r in found[arm].items()}
        iv = mean_ci(acc.values())
        diff = format_difference(paired_ci(acc, {s: r["after"] for s, r in found["drmas"].items()}).diff) \
            if arm != "drmas" and "drmas" in found else "-"
        tokens = sum(r["tokens"] for r in found[arm].values()) / len(found[arm])
        secs = sum(r["seconds"] for r in found[arm].values()) / len(found[arm])
        print(f"{arm:<6} {format_interval(iv):<22} {diff:<26} {tokens:>10.0f} {secs:>6.0f}")
        parts.append(f"{arm}={iv.mean:.3f} {arm}_tokens={tokens:.0f}")
    print("RESULT name=c3_compare " + " ".join(parts))


if __name__ == "__main__":
    main()
