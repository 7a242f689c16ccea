"""A config run as shipped against the same config with some settings changed, one after the other in one command: wall
time, time by phase, peak resident memory and held-out accuracy side by side, and their ratios.

    python benchmarks/quickstart_ab.py                                   # the quickstart, its former engine batch (64)
    python benchmarks/quickstart_ab.py --before models.main.max_batch_size=64 --config configs/quickstart.yaml
    python benchmarks/quickstart_ab.py --before train.steps=2 --after train.steps=2 --set eval.problems=16

Each arm is ``teamrl train CONFIG`` in its own process (as the README's first command runs it), its resident memory
sampled every 20 ms (benchmarks/plan_vs_measured.py). Prints one ``RESULT name=quickstart_ab arm=...`` line per arm,
the ratios (after / before), and a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_vs_measured import REPO, run_sampled  # noqa: E402


def arm(name: str, config: str, over: list[str], work: Path) -> dict:
    run = work / name
    got = run_sampled([sys.executable, "-m", "teamrl.cli", "train", config, f"run_dir={run}", *over],
                      log=work / f"{name}.log", cwd=REPO)
    if got["rc"] != 0:
        tail = (work / f"{name}.log").read_text()[-1500:]
        raise SystemExit(f"arm {name}: teamrl train exited {got['rc']}:\n{tail}")
    summary = json.loads((run / "summary.json").read_text())
    metrics = run / "metrics.jsonl"  # none where train.steps is 0
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.is_file() else []
    steps = [r["perf/step_s"] for r in rows if "perf/step_s" in r]
    out = {"arm": name, "overrides": " ".join(over) or "(as shipped)", "wall_s": round(got["wall_s"], 1),
           "peak_gib": round(max(got["sampled_gib"], summary.get("peak_rss_gb", 0.0)), 2),
           "step_median_s": round(statistics.median(steps), 2) if steps else None}
    for tag in ("before", "after"):
        ev = summary.get(tag) or {}
        out[f"accuracy_{tag}"] = ev.get("accuracy")
        out[f"eval_{tag}_s"] = (summary.get("time_evals") or {}).get(tag, {}).get("s")
    for phase, t in (summary.get("time") or {}).items():
        out[f"{phase}_s"] = t.get("s")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/quickstart.yaml")
    ap.add_argument("--before", action="append", default=None, metavar="KEY=VALUE",
                    help="the baseline's overrides (repeatable; default: models.main.max_batch_size=64, the "
                         "quickstart's engine batch before the change of docs/time.md)")
    ap.add_argument("--after", action="append", default=[], metavar="KEY=VALUE", help="the other arm's overrides")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for both arms")
    ap.add_argument("--work", default=None, help="folder for the runs and logs (default: a temporary one)")
    args = ap.parse_args()
    before = ["models.main.max_batch_size=64"] if args.before is None else args.before
    work = Path(args.work or tempfile.mkdtemp(prefix="quickstart-ab-"))
    work.mkdir(parents=True, exist_ok=True)
    base = list(args.set)  # otherwise as the README runs it: checkpoints, loggers
    res = []
    for name, over in (("before", before), ("after", args.after)):
        r = arm(name, args.config, base + over, work)
        res.append(r)
        print("RESULT name=quickstart_ab " + " ".join(f"{k}={v}" for k, v in r.items() if k != "overrides"),
              f"overrides={r['overrides']!r}", flush=True)
    b, a = res
    ratios = {k: round(a[k] / b[k], 3) for k in a if isinstance(a.get(k), float) and isinstance(b.get(k), float)
              and b[k] and not k.startswith("accuracy")}
    print("RATIO name=quickstart_ab after/before " + " ".join(f"{k}={v}" for k, v in ratios.items()))
    keys = [k for k in a if k not in ("arm", "overrides")]
    print("\n| arm | overrides | " + " | ".join(keys) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in keys) + " |")
    for r in res:
        print(f"| {r['arm']} | {r['overrides']} | " + " | ".join(str(r.get(k)) for k in keys) + " |")
    print("| after / before | | " + " | ".join(str(ratios.get(k, "")) for k in keys) + " |")
    print(f"runs and logs: {work}")


if __name__ == "__main__":
    main()
