"""On-policy distillation on the CPU: one teacher (tinker-cookbook's reverse KL), two (MAD-OPD's mt_opd) and two in a
debate (mad_opd), against RL from scratch, on the quickstart's math team at the same steps and held-out set.

Every arm starts from the untrained embedded model and runs ``configs/quickstart.yaml`` for ``--steps`` steps of
``--batch`` problems x 8 episodes with both agents sampling at temperature 1 (the reverse KL needs the policy's own
log-probs; the other arms sample the same way so that only the signal differs):

* ``rl``: the quickstart's RL (Dr. MAS), no teacher;
* ``opd``: ``algo.distill.loss: reverse_kl`` towards teacher A, ``rl_weight`` 0;
* ``opd_rl``: the same with ``rl_weight`` 1 (the reward's advantage beside the term);
* ``mt_opd``: ``loss: jsd`` towards teachers A and B, equal fixed weights, ``rl_weight`` 0;
* ``mad_opd``: ``loss: jsd``, A and B debating ``--rounds`` rounds of at most ``--debate-tokens`` tokens per answer,
  confidence weights, ``rl_weight`` 0.

Teachers A and B are exported checkpoints (``teamrl export RUN --out DIR`` then ``DIR/main``), e.g. the quickstart's
trained team and a second trained team. Every run is scored on the same ``--problems`` held-out problems x
``--samples`` answers at temperature 0.7, seed 0; the untrained model once. Intervals: 95% t over the problems
(one training seed per arm), and the difference to ``rl`` paired over the problems.

    python benchmarks/distill_compare.py --teacher-a runs/quickstart_export/main --teacher-b runs/second_export/main

Last line ``RESULT name=distill_compare ...``. Runs go one after another (one CPU-heavy job); a finished run is
read back, not run again.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from teamrl.study.stats import format_difference, format_interval, mean_ci, paired_ci

REPO = Path(__file__).resolve().parents[1]
ARMS = ("rl", "opd", "opd_rl", "mt_opd", "mad_opd")


def arm_overrides(arm: str, args: argparse.Namespace) -> list[str]:
    teachers = [f"models.ta.path={args.teacher_a}", "models.ta.trainable=false"]
    two = teachers + [f"models.tb.path={args.teacher_b}", "models.tb.trainable=false"]
    both = lambda ts: [f"algo.distill.teachers.{a}={ts}" for a in ("solver", "verifier")]  # noqa: E731
    if arm == "rl":
        return []
    if arm in ("opd", "opd_rl"):
        return teachers + both("ta") + [f"algo.distill.rl_weight={1 if arm == 'opd_rl' else 0}"]
    jsd = two + both("[ta,tb]") + ["algo.distill.loss=jsd", "algo.distill.rl_weight=0"]
    if arm == "mt_opd":
        return jsd
    return jsd + [f"algo.distill.debate_rounds={args.rounds}", f"algo.distill.debate_max_tokens={args.debate_tokens}"]


def run(arm: str, out: Path, args: argparse.Namespace, *, before: bool) -> dict[str, object]:
    path = out / arm
    if not (path / "summary.json").is_file():
        cmd = [sys.executable, "-m", "teamrl.cli", "train", str(REPO / "configs/quickstart.yaml"), f"run_dir={path}",
               f"train.steps={args.steps}", f"rollout.batch_size={args.batch}", f"train.save_every={args.steps}",
               "train.loggers=[]", f"eval.before={str(before).lower()}", f"eval.problems={args.problems}",
               f"eval.samples={args.samples}", "eval.temperature=0.7", "agents.solver.temperature=1.0",
               "agents.verifier.temperature=1.0", *arm_overrides(arm, args)]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        (path / "wall_s.txt").write_text(f"{time.perf_counter() - t0:.1f}\n")
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "rollout/reward_mean" in r]
    out_ = {"after": per_problem(path / "eval_after_episodes.jsonl"), "seconds": float((path / "wall_s.txt").read_text()),
            "tokens": sum(r.get("perf/rollout/decoded_tokens", 0.0) for r in train_rows),
            "step_s": sorted(r["perf/step_s"] for r in train_rows)[len(train_rows) // 2] if train_rows else 0.0,
            "first": train_rows[0] if train_rows else {}, "last": train_rows[-1] if train_rows else {}}
    if before:
        out_["before"] = per_problem(path / "eval_before_episodes.jsonl")
    return out_


def per_problem(path: Path) -> dict[int, float]:
    """Each held-out problem's mean reward over its samples, keyed by the problem's order."""
    sums: dict[str, list[float]] = defaultdict(list)
    for line in path.read_text().splitlines():
        ep = json.loads(line)
        sums[ep["problem_id"]].append(float(ep["reward"]))
    return {i: sum(v) / len(v) for i, (_, v) in enumerate(sorted(sums.items()))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--teacher-a", required=True)
    ap.add_argument("--teacher-b", required=True)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--problems", type=int, default=200)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--debate-tokens", type=int, default=128)
    ap.add_argument("--out", default=str(REPO / "runs" / "distill_compare"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    arms = [a for a in args.arms.split(",") if a]
    results = {a: run(a, out, args, before=(a == arms[0])) for a in arms}
    base = results[arms[0]]
    untrained = base["before"]
    print(f"{'arm':<8} {'held-out (avg@' + str(args.samples) + ')':<22} {'minus ' + arms[0] + ' (paired)':<26} "
          f"{'tokens':>8} {'median step s':>13} {'s/run':>6}")
    print(f"{'untrained':<8} {format_interval(mean_ci(untrained.values())):<22}")
    for a in arms:
        r = results[a]
        diff = "" if a == arms[0] else format_difference(paired_ci(r["after"], base["after"]).diff)
        print(f"{a:<8} {format_interval(mean_ci(r['after'].values())):<22} {diff:<26} {r['tokens']:>8.0f} "
              f"{r['step_s']:>13.1f} {r['seconds']:>6.0f}")
        kl = {k: (r["first"].get(k), r["last"].get(k)) for k in r["last"]
              if k.endswith("/reverse_kl") or k.endswith("/distill_jsd") or "/weight/" in k or "confidence" in k}
        for k, (v0, v1) in sorted(kl.items()):
            print(f"    {k}: first step {v0 if v0 is None else round(v0, 4)}, last {round(v1, 4)}")
    means = " ".join(f"{a}={mean_ci(results[a]['after'].values()).mean:.3f}" for a in arms)
    print(f"RESULT name=distill_compare untrained={mean_ci(untrained.values()).mean:.3f} {means}")


if __name__ == "__main__":
    main()
