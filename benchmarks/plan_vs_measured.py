"""The memory plan of ``teamrl train CONFIG --dry-run`` against the measured peak of the same run, per config.

Each config runs as users run it (``teamrl train``, its own process, tcmalloc preloaded where installed) for
``--steps`` steps with the evaluations and checkpoint saves off (``--keep-evals`` keeps them); a sampler reads the
process's resident memory (``VmRSS``) every 20 ms. The trainer resets the kernel's peak mark at each phase
(``perf/peak_rss_gb/<phase>``), which also clears the figure ``getrusage`` and ``/usr/bin/time`` report, so the
sampled maximum and the run's own ``peak_rss_gb`` (summary.json) are printed instead; the larger is the measured
peak.

    python benchmarks/plan_vs_measured.py                        # every configs/*.yaml, 2 steps each
    python benchmarks/plan_vs_measured.py configs/quickstart.yaml --steps 12 --keep-evals
    python benchmarks/plan_vs_measured.py --cmd -- teamrl train configs/quickstart.yaml   # any command's peak

Prints one ``RESULT name=plan_vs_measured config=... planned_gib=... measured_gib=... ratio=...`` line per config
(ratio: planned / measured; the plan is meant to be within 20%; none where no row trained, whose update never ran:
``--set loss.entropy_coef=0.001`` gives every row a gradient), and a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GIB = 1 << 30


def tree_rss(pid: int) -> tuple[int, int]:
    """(the process's own resident bytes, its whole process tree's), from /proc."""
    own = total = 0
    try:
        import psutil

        proc = psutil.Process(pid)
        own = proc.memory_info().rss
        total = own + sum(c.memory_info().rss for c in proc.children(recursive=True))
    except Exception:  # the process (or a child) ended between the calls
        pass
    return own, total


def run_sampled(cmd: list[str], *, log: Path, every: float = 0.02, cwd: Path | None = None) -> dict:
    """Run ``cmd`` in ``cwd`` (stdout and stderr to ``log``) sampling its resident memory; returns rc, wall and the
    peaks."""
    peak = {"own": 0, "tree": 0}
    with open(log, "w") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
        done = threading.Event()

        def poll() -> None:
            while not done.wait(every):
                own, tree = tree_rss(proc.pid)
                peak["own"], peak["tree"] = max(peak["own"], own), max(peak["tree"], tree)

        sampler = threading.Thread(target=poll, daemon=True)
        sampler.start()
        rc = proc.wait()
        done.set()
        sampler.join()
    return {"rc": rc, "wall_s": time.perf_counter() - t0, "sampled_gib": peak["own"] / GIB,
            "tree_gib": peak["tree"] / GIB}


def planned_gib(config: str, overrides: list[str]) -> float | None:
    """The CPU plan's peak of ``config`` with ``overrides``, from ``teamrl train --dry-run``."""
    out = subprocess.run([sys.executable, "-m", "teamrl.cli", "train", config, *overrides, "--dry-run"], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    m = re.search(r"\(the CPU\), ([0-9.]+) GiB", out.stdout + out.stderr)
    return float(m.group(1)) if m else None


def trained_tokens(run_dir: Path) -> int:
    """Tokens the run's updates trained, over its steps (``loss/<model>/tokens``); 0 where no row had an advantage."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    return int(sum(v for r in rows for k, v in r.items() if k.startswith("loss/") and k.endswith("/tokens")))


def measure(config: str, *, steps: int, keep_evals: bool, work: Path, extra: list[str] = ()) -> dict:
    name = Path(config).stem
    run_dir = work / name
    over = [f"train.steps={steps}", "train.save_every=0", f"run_dir={run_dir}", *extra]
    if not keep_evals:
        over += ["eval.before=false", "eval.after=false"]
    plan = planned_gib(config, over)
    got = run_sampled([sys.executable, "-m", "teamrl.cli", "train", config, *over], log=work / f"{name}.log", cwd=REPO)
    summary = run_dir / "summary.json"
    run_peak = json.loads(summary.read_text()).get("peak_rss_gb", 0.0) if summary.is_file() else 0.0
    measured = max(got["sampled_gib"], run_peak)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # the final save: 1.6 GB for SmolLM2-135M
    trained = trained_tokens(run_dir)
    return {"config": name, "planned_gib": plan, "measured_gib": measured, "run_peak_gib": run_peak, **got,
            "trained_tokens": trained, "ratio": plan / measured if plan and measured and trained else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", help="config files (default: every configs/*.yaml)")
    ap.add_argument("--steps", type=int, default=2, help="training steps per config (default 2: AdamW's state exists "
                                                         "in the second step's phases)")
    ap.add_argument("--keep-evals", action="store_true", help="keep the configs' evaluations before and after")
    ap.add_argument("--work", help="folder for the runs and logs (default: a temporary one)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an override for every config's run and plan (repeatable), e.g. loss.entropy_coef=0.001 so "
                         "that rows train where no reward differs within a group")
    ap.add_argument("--cmd", action="store_true", help="measure the peak of the command after -- instead")
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = argv[argv.index("--") + 1:] if "--" in argv else []
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="plan-vs-measured-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.cmd:
        if not cmd:
            ap.error("--cmd needs a command after --")
        got = run_sampled(cmd, log=work / "cmd.log")
        print(f"RESULT name=peak_rss rc={got['rc']} wall_s={got['wall_s']:.1f} peak_gib={got['sampled_gib']:.3f} "
              f"tree_gib={got['tree_gib']:.3f} log={work / 'cmd.log'}", flush=True)
        return got["rc"]
    configs = args.configs or sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").glob("*.yaml"))
    rows = []
    for config in configs:
        r = measure(config, steps=args.steps, keep_evals=args.keep_evals, work=work, extra=args.set)
        rows.append(r)
        ratio = f"{r['ratio']:.2f}" if r["ratio"] else "-"
        print(f"RESULT name=plan_vs_measured config={r['config']} rc={r['rc']} planned_gib={r['planned_gib']} "
              f"measured_gib={r['measured_gib']:.2f} sampled_gib={r['sampled_gib']:.2f} "
              f"run_peak_gib={r['run_peak_gib']:.2f} trained_tokens={r['trained_tokens']} ratio={ratio} "
              f"wall_s={r['wall_s']:.0f}", flush=True)
        if not r["trained_tokens"]:
            print(f"  {r['config']}: no row trained (no reward differed within a group), so the update's memory was "
                  "never used and no ratio is given; rerun with --set loss.entropy_coef=0.001", flush=True)
    print("\n| config | plan (GiB) | measured (GiB) | plan / measured |\n| --- | --- | --- | --- |")
    for r in rows:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] else "-"
        print(f"| {r['config']} | {r['planned_gib']} | {r['measured_gib']:.2f} | {ratio} |")
    bad = [r["config"] for r in rows if r["rc"] != 0 or not r["ratio"] or abs(r["ratio"] - 1) > 0.2]
    print(f"RESULT name=plan_vs_measured_all configs={len(rows)} within_20pct={len(rows) - len(bad)} "
          f"outside={','.join(bad) or '-'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
