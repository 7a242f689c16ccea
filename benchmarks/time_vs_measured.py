"""The time plan of ``teamrl train CONFIG --dry-run`` against the measured time of the same run, per config and phase.

Each config runs as users run it (``teamrl train``, its own process) for ``--steps`` steps with one evaluation before
training on ``--eval-problems`` problems and checkpoint saves off. The steps after the first ``--prior-steps`` are
compared, their mean (the first pays the one-time costs: the C library's first load, oneDNN's first products; the
first ``--prior-steps`` are those ``--priors`` makes the work priors of), with the evaluation. Per phase it prints the
measured seconds, the run's own floor (``perf/<phase>/floor_s``: the work it counted at this machine's limits) and
its share (``limit_frac``), the dry-run's planned seconds, and their ratio (plan / measured; the plan is meant to be
within 25%):

    python benchmarks/time_vs_measured.py                          # every configs/*.yaml
    python benchmarks/time_vs_measured.py configs/quickstart.yaml --steps 3
    python benchmarks/time_vs_measured.py --steps 4 --prior-steps 2  # priors from steps 1-2, steps 3-4 compared
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


def perf(row: dict) -> dict:
    return {k: v for k, v in row.items() if k.startswith("perf/")}


def compared(row: dict) -> list[dict]:
    """The compared steps' perf rows of a measured row (an earlier --json without them: its last step)."""
    return row["steps"][row["prior_steps"]:] if "steps" in row else [row["counts"]]


def prior_steps(row: dict) -> list[dict]:
    """The steps the work prior is made of (an earlier --json without them: its first)."""
    return row["steps"][:row["prior_steps"]] if "steps" in row else [row["first"]]


def mean(values: list) -> float | None:
    seen = [float(v) for v in values if v is not None]
    return sum(seen) / len(seen) if seen else None


def measure(config: str, steps: int, eval_problems: int, extra: list[str], prior_k: int = 1) -> list[dict]:
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
        steps = [perf(r) for r in rows if "perf/rollout/s" in r]
        later = steps[prior_k:] or steps[-1:]
        last = later[-1]
        summary = json.loads((run / "summary.json").read_text())
        measured = {p: (mean([s.get(f"perf/{p}/s") for s in later]), mean([s.get(f"perf/{p}/floor_s") for s in later]))
                    for p in PHASES if p != "eval"}
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
               "counts": ev if phase == "eval" else last, "steps": steps,
               "prior_steps": min(prior_k, len(steps) - len(later))}
        out.append(row)
        print("RESULT name=time_vs_measured " + " ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items() if k not in ("counts", "steps")), flush=True)
    return out


def replan(rows: list[dict], extra: list[str]) -> list[dict]:
    """``rows`` measured earlier, planned again with the plan's current constants, three ways: ``planned_s`` from the
    config and its shipped prior (what ``--dry-run`` prints), ``caps_s`` from the config's caps alone (no prior), and
    ``work_plan_s`` from the work the run counted (the plan of the compared step's own counts, its host seconds
    included)."""
    from teamrl.plan.prior import NONE
    from teamrl.plan.timing import plan_time

    counts = {(c, ph): (cfg, lim, prior) for c, ph, cfg, lim, prior, _ in counted(rows, extra)}
    plans = {}  # per config: the plans from its shipped prior and from its caps
    for (config, phase), (cfg, lim, _) in counts.items():
        if phase == "rollout":
            plans[config] = tuple({p.phase: p.planned_s for p in plan_time(cfg, lim, on_gpu=False, prior=pr)}
                                  for pr in (None, NONE))
    for r in rows:
        cfg, lim, prior = counts[(r["config"], "rollout")]
        shipped, caps = plans[r["config"]]
        if r["phase"] == "eval" and (r["config"], "eval") in counts:
            prior = counts[(r["config"], "eval")][2]
        work = {p.phase: p.planned_s for p in plan_time(cfg, lim, on_gpu=False, prior=prior)}
        s = r["measured_s"]
        for name, plan in (("planned_s", shipped), ("caps_s", caps), ("work_plan_s", work)):
            r[name] = plan.get(r["phase"])
            r[name.replace("_s", "") + "_ratio"] = r[name] / s if r[name] and s else None
        r["ratio"] = r.pop("planned_ratio")
    return rows


def priors(rows: list[dict], extra: list[str]) -> dict:
    """The work priors (teamrl.plan.prior) of ``rows``' first training steps, per (workflow, task): each config's
    measured shares against the plan of its caps, and their median over the configs of one workflow and task."""
    from teamrl.config.schema import load_config
    from teamrl.plan.prior import combine, key
    from teamrl.plan.timing import measure

    by_key: dict[tuple[str, str, str, str], list] = {}
    for config in sorted({r["config"] for r in rows}):
        steps = prior_steps(next(r for r in rows if r["config"] == config and r["phase"] == "rollout"))
        cfg = load_config(REPO / f"configs/{config}.yaml", overrides(Path("/nonexistent/run"), 2, 4) + extra)
        p = measure(cfg, steps, config)
        print(f"PRIOR config={config} key={key(cfg)} {p.describe()}")
        by_key.setdefault(key(cfg), []).append((config, p))
    return {k: combine([p for _, p in v], "the first steps of " + ", ".join(c for c, _ in v))
            for k, v in by_key.items()}


def counted(rows: list[dict], extra: list[str]):
    """Per config, phase and measured row: the config resolved on this machine, this machine's limits, and the
    :class:`~teamrl.plan.prior.WorkPrior` of the counts the compared step (or evaluation) did, so that the plan of
    that prior counts the work the run counted."""
    from teamrl.config.schema import load_config
    from teamrl.hardware import resolve_config
    from teamrl.plan.limits import cpu_limits
    from teamrl.plan.prior import WorkPrior
    from teamrl.plan.timing import base_counts, measure

    for config in sorted({r["config"] for r in rows}):
        cfg = resolve_config(load_config(REPO / f"configs/{config}.yaml", overrides(Path("/nonexistent/run"), 2, 4)
                                         + extra))
        limits = cpu_limits(cfg.train.threads)
        by = {r["phase"]: r for r in rows if r["config"] == config}
        later = compared(by["rollout"])
        yield (config, "rollout", cfg, limits, measure(cfg, later, "the compared steps"),
               mean([s["perf/rollout/engine_s"] for s in later]))
        ev = by.get("eval", {}).get("counts") or {}
        base = base_counts(cfg, "eval")
        if ev.get("engine_s") and base["decoded"]:
            shares = {k: ev[f] / base[k] for k, f in (("decoded", "decoded_tokens"), ("steps", "decode_steps"),
                                                       ("prefill", "prefill_tokens"))}
            host = ev.get("host_s", 0.0) / max(1, (cfg.eval.problems or 0) * cfg.eval.samples)
            yield config, "eval", cfg, limits, WorkPrior(**shares, host_s=host, source="the evaluation"), ev["engine_s"]


def fit(rows: list[dict], extra: list[str]) -> dict:
    """The decode phases' shares of the bf16 peak, the float32 peak and the bandwidth (teamrl.plan.timing.REACHED's
    rollout and eval entries): the least-squares fit, in relative error, of ``engine seconds = bf16 FLOPs / (peak x
    r16) + float32 FLOPs / (peak x r32) + bytes / (bandwidth x rm)`` over every measured rollout and evaluation, their
    work counted as the run counted it."""
    import numpy as np

    from teamrl.plan.timing import plan_time

    x, names = [], []
    for config, phase, cfg, limits, prior, engine_s in counted(rows, extra):
        plan = next(p for p in plan_time(cfg, limits, on_gpu=False, prior=prior) if p.phase == phase)
        c16 = sum(w.flops / (limits.bfloat16 * 1e9) for w in plan.work.values() if w.dtype == "bfloat16")
        c32 = sum(w.flops / (limits.float32 * 1e9) for w in plan.work.values() if w.dtype != "bfloat16")
        mem = sum(w.nbytes for w in plan.work.values()) / (limits.bandwidth * 1e9)
        x.append([c16 / engine_s, c32 / engine_s, mem / engine_s])
        names.append(f"{config}/{phase}")
    a = np.asarray(x)
    inv, *_ = np.linalg.lstsq(a, np.ones(len(x)), rcond=None)
    pred = a @ inv
    for n, v in zip(names, pred):
        print(f"FIT {n} planned/measured engine seconds {v:.2f}")
    print(f"FIT within 25%: {int(((pred > 0.75) & (pred < 1.25)).sum())} of {len(pred)}")
    return {"bfloat16": 1 / inv[0], "float32": 1 / inv[1], "memory": 1 / inv[2]}


def table(rows: list[dict]) -> str:
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    out = ["| config | phase | measured s | floor s | share of floor | planned s | plan / measured | from the caps s | "
           "caps / measured | from the counted work s | that / measured |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        out.append(f"| {r['config']} | {r['phase']} | {f(r['measured_s'], '.2f')} | {f(r['floor_s'], '.3f')} | "
                   f"{f(r['limit_frac'], '.0%')} | {f(r['planned_s'], '.2f')} | {f(r['ratio'], '.2f')} | "
                   f"{f(r.get('caps_s'), '.2f')} | {f(r.get('caps_ratio'), '.2f')} | "
                   f"{f(r.get('work_plan_s'), '.2f')} | {f(r.get('work_plan_ratio'), '.2f')} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("configs", nargs="*", help="default: every configs/*.yaml")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prior-steps", type=int, default=1, help="steps the priors are made of; the later ones are "
                    "compared (their mean)")
    ap.add_argument("--eval-problems", type=int, default=4)
    ap.add_argument("--set", action="append", default=[], help="an override for every config (repeatable)")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    ap.add_argument("--replan", default=None, metavar="JSON", help="plan the rows of an earlier --json again with the "
                    "plan's current constants (no run)")
    ap.add_argument("--priors", default=None, metavar="JSON", help="print the work priors (teamrl.plan.prior.PRIORS) "
                    "of the first steps of an earlier --json's runs")
    ap.add_argument("--fit", default=None, metavar="JSON", help="fit the decode phases' shares of the limits "
                    "(teamrl.plan.timing.REACHED) to an earlier --json's engine seconds")
    args = ap.parse_args()
    if args.fit:
        print("FIT decode shares:", {k: round(float(v), 3) for k, v in fit(json.loads(Path(args.fit).read_text()),
                                                                             args.set).items()})
        return
    if args.priors:
        for key, p in sorted(priors(json.loads(Path(args.priors).read_text()), args.set).items()):
            print(f"    {key!r}: {p!r},")
        return
    if args.replan:
        rows = replan(json.loads(Path(args.replan).read_text()), args.set)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        print(table(rows))
        return
    configs = args.configs or sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").glob("*.yaml"))
    rows = []
    for c in configs:
        rows += measure(c, args.steps, args.eval_problems, args.set, args.prior_steps)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    print("\n" + table(replan(rows, args.set)))


if __name__ == "__main__":
    main()
