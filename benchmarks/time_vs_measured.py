"""The time plan of ``teamrl train CONFIG --dry-run`` against the measured time of the same run, per config and phase.

Each config runs as users run it (``teamrl train``, its own process) for ``--steps`` steps with one evaluation before
training on ``--eval-problems`` problems and checkpoint saves off. The last step is compared (the first pays the
one-time costs: the C library's first load, oneDNN's first products), with the evaluation. Per phase it prints the
measured seconds, the run's own floor (``perf/<phase>/floor_s``: the work it counted at this machine's limits) and
its share (``limit_frac``), the dry-run's planned seconds, and their ratio (plan / measured; the plan is meant to be
within 25%):

    python benchmarks/time_vs_measured.py                          # every configs/*.yaml
    python benchmarks/time_vs_measured.py configs/quickstart.yaml --steps 3
    python benchmarks/time_vs_measured.py --json out.json          # also the rows as JSON (tests/test_time_plan.py)
    python benchmarks/time_vs_measured.py --replan out.json --set train.threads=1   # plan them again, no run

Prints one ``RESULT name=time_vs_measured config=... phase=... measured_s=... floor_s=... limit_frac=... planned_s=...
ratio=...`` line per config and phase, and a markdown table.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHASES = ("rollout", "logprobs", "update", "sync", "eval")


def overrides(run_dir: Path, steps: int, eval_problems: int) -> list[str]:
    return [f"run_dir={run_dir}", f"train.steps={steps}", "train.save_every=0", "eval.before=true",
            "eval.after=false", "eval.every=0", f"eval.problems={eval_problems}", "train.loggers=[]"]


def planned(config: str, over: list[str]) -> dict[str, float]:
    """Planned seconds per phase from ``--dry-run``'s time plan lines."""
    out = subprocess.run([sys.executable, "-m", "teamrl.cli", "train", config, *over, "--dry-run"], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    plan = {}
    for m in re.finditer(r"time plan: (\w+) .* planned ([0-9.]+) (s|min|h) \(([0-9,]+ tokens)?", out.stdout):
        plan[m.group(1)] = float(m.group(2)) * {"s": 1, "min": 60, "h": 3600}[m.group(3)]
        if m.group(4):
            plan[m.group(1) + "_tokens"] = float(m.group(4).split()[0].replace(",", ""))
    if not plan:
        raise RuntimeError(f"{config}: no time plan in --dry-run's output:\n{out.stdout[-1500:]}{out.stderr[-1500:]}")
    return plan


def measure(config: str, steps: int, eval_problems: int, extra: list[str]) -> list[dict]:
    name = Path(config).stem
    with tempfile.TemporaryDirectory(prefix="time_plan_") as tmp:
        run = Path(tmp) / "run"
        over = overrides(run, steps, eval_problems) + extra
        plan = planned(config, over)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "teamrl.cli", "train", config, *over], cwd=REPO,
                              capture_output=True, text=True, timeout=3600)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            print(f"{name}: exit {proc.returncode}: {proc.stderr[-800:]}", file=sys.stderr)
            return []
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        last = [r for r in rows if "perf/rollout/s" in r][-1]
        summary = json.loads((run / "summary.json").read_text())
        measured = {p: (last.get(f"perf/{p}/s"), last.get(f"perf/{p}/floor_s")) for p in PHASES if p != "eval"}
        ev = summary.get("time_evals", {}).get("before", {})
        measured["eval"] = (ev.get("s"), ev.get("floor_s"))
        shutil.rmtree(run, ignore_errors=True)
    out = []
    for phase in PHASES:
        s, floor = measured.get(phase, (None, None))
        if s is None and phase not in plan:
            continue
        row = {"config": name, "phase": phase, "measured_s": s, "floor_s": floor, "planned_s": plan.get(phase),
               "limit_frac": (floor / s) if s and floor is not None else None,
               "ratio": (plan[phase] / s) if s and phase in plan else None, "wall_s": wall,
               "tokens": last.get("perf/rollout/decoded_tokens") if phase == "rollout" else
               last.get("perf/update_tokens_computed") if phase == "update" else None,
               "planned_tokens": plan.get(f"{phase}_tokens"),
               "counts": ev if phase == "eval" else {k: v for k, v in last.items() if k.startswith("perf/")}}
        out.append(row)
        print("RESULT name=time_vs_measured " + " ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items() if k != "counts"), flush=True)
    return out


def shares(config: str, over: list[str]) -> dict[str, float]:
    """The share of its floor each phase is planned to reach (teamrl.plan.timing.REACHED) in the dtype it computes in
    under ``config`` as resolved on this machine (the engine's for rollouts and evaluations, the update's for the
    update; the bandwidth's for the weight sync)."""
    from teamrl.config.schema import load_config
    from teamrl.hardware import resolve_config
    from teamrl.plan.timing import REACHED

    cfg = resolve_config(load_config(REPO / config, over))
    mc = cfg.models[sorted({a.model for a in cfg.agents.values()})[0]]
    engine = "bfloat16" if "bfloat16" in (mc.rollout_dtype, mc.dtype) else "float32"
    update = "bfloat16" if "bfloat16" in (mc.dtype, mc.train_autocast) else "float32"
    reach = REACHED["cpu"]
    return {"rollout": reach["rollout"][engine], "eval": reach["eval"][engine], "update": reach["update"][update],
            "logprobs": reach["logprobs"][update], "sync": reach["sync"]["memory"]}


def replan(rows: list[dict], extra: list[str]) -> list[dict]:
    """``rows`` measured earlier, planned again with the plan's current constants: the dry-run's ``planned_s`` (from
    the config) and ``work_plan_s`` (the run's own floor, of the work it counted, over the planned share)."""
    for config in sorted({r["config"] for r in rows}):
        path = f"configs/{config}.yaml"
        over = overrides(Path("/nonexistent/run"), 2, 4) + extra
        plan, share = planned(path, over), shares(path, over)
        for r in (r for r in rows if r["config"] == config):
            r["planned_s"] = plan.get(r["phase"])
            r["ratio"] = r["planned_s"] / r["measured_s"] if r["planned_s"] and r["measured_s"] else None
            r["work_plan_s"] = r["floor_s"] / share[r["phase"]] if r["floor_s"] else None
            r["work_ratio"] = r["work_plan_s"] / r["measured_s"] if r["work_plan_s"] and r["measured_s"] else None
    return rows


def table(rows: list[dict]) -> str:
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    out = ["| config | phase | measured s | floor s | share of floor | planned from the config s | plan / measured | "
           "planned from the counted work s | that / measured |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        out.append(f"| {r['config']} | {r['phase']} | {f(r['measured_s'], '.2f')} | {f(r['floor_s'], '.3f')} | "
                   f"{f(r['limit_frac'], '.1%')} | {f(r['planned_s'], '.2f')} | {f(r['ratio'], '.2f')} | "
                   f"{f(r.get('work_plan_s'), '.2f')} | {f(r.get('work_ratio'), '.2f')} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("configs", nargs="*", help="default: every configs/*.yaml")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--eval-problems", type=int, default=4)
    ap.add_argument("--set", action="append", default=[], help="an override for every config (repeatable)")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    ap.add_argument("--replan", default=None, metavar="JSON", help="plan the rows of an earlier --json again with the "
                    "plan's current constants (no run)")
    args = ap.parse_args()
    if args.replan:
        rows = replan(json.loads(Path(args.replan).read_text()), args.set)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        print(table(rows))
        return
    configs = args.configs or sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").glob("*.yaml"))
    rows = []
    for c in configs:
        rows += measure(c, args.steps, args.eval_problems, args.set)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    print("\n" + table(replan(rows, args.set)))


if __name__ == "__main__":
    main()
