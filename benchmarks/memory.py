"""Peak memory of agent→model mappings: one agent, two agents sharing a model, two separate models.

Each mapping runs in a fresh subprocess that loads its models (SmolLM2-135M-Instruct, `default`),
does one short rollout and one update with a tiny batch, and reports its peak resident set size.
A baseline subprocess imports and builds everything but loads no model; ratios are of the memory
above that baseline (the models, optimizer state, activations), and the raw peaks are printed too.

    python benchmarks/memory.py            # prints a table and one RESULT line
    python benchmarks/memory.py --help

Prints ``RESULT name=memory shared_ratio=... separate_ratio=...``: shared / single (two agents
on one model; should stay <= 1.2) and separate / single (each agent its own model; about 2).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

MAPPINGS = {
    "single": ["workflow.name=single", "agents={solver: {max_new_tokens: 8}}"],
    "shared": ["agents={solver: {max_new_tokens: 8}, verifier: {max_new_tokens: 4}}"],
    "separate": ["models={a: {path: default}, b: {path: default}}",
                 "agents={solver: {model: a, max_new_tokens: 8}, verifier: {model: b, max_new_tokens: 4}}"],
}


def child(mapping: str, run_dir: str, threads: int) -> dict[str, float]:
    """Build the mapping's trainer and run one rollout + one update; return peaks in GiB."""
    from teamrl.config.schema import load_config
    from teamrl.metrics.memory import PeakMemory, peak_rss_gb
    from teamrl.train.trainer import Trainer

    base = [f"run_dir={run_dir}", "rollout.batch_size=1", "rollout.group_size=2", "train.steps=1",
            "eval.before=false", "eval.after=false", f"train.threads={threads}", "loss.entropy_coef=0.01"]
    if mapping == "baseline":  # everything but the models
        load_config(None, base)
        import transformers  # noqa: F401

        return {"peak_rss_gb": peak_rss_gb()}
    cfg = load_config(None, base + MAPPINGS[mapping])
    tr = Trainer(cfg, progress=False)
    meter = PeakMemory()
    with meter.phase("rollout"):
        episodes = tr.rollout.collect(tr.sampler.next(1), 2, progress=False)
    steps = tr.scorer.rewards_and_advantages(episodes)
    with meter.phase("update"):
        for name, learner in tr.learners.items():
            learner.update([s for s in steps if s.model == name])
    m = meter.metrics()
    return {"peak_rss_gb": max(m.values()), **m}


def measure(mapping: str, threads: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([sys.executable, __file__, "--child", mapping, "--run-dir", tmp, "--threads", str(threads)],
                             check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads per subprocess")
    ap.add_argument("--child", choices=["baseline", *MAPPINGS], help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.run_dir, args.threads)))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    peaks = {m: measure(m, args.threads) for m in ["baseline", *MAPPINGS]}
    base = peaks["baseline"]["peak_rss_gb"]
    net = {m: peaks[m]["peak_rss_gb"] - base for m in MAPPINGS}
    for m, p in peaks.items():
        phases = " ".join(f"{k.split('/')[-1]}={v:.2f}" for k, v in p.items() if k.startswith("perf/"))
        print(f"{m:9s} peak RSS {p['peak_rss_gb']:.2f} GiB  above baseline {p['peak_rss_gb'] - base:.2f} GiB  {phases}")
    print(f"RESULT name=memory shared_ratio={net['shared'] / net['single']:.2f} "
          f"separate_ratio={net['separate'] / net['single']:.2f} single_gb={peaks['single']['peak_rss_gb']:.2f} "
          f"shared_gb={peaks['shared']['peak_rss_gb']:.2f} separate_gb={peaks['separate']['peak_rss_gb']:.2f} "
          f"baseline_gb={base:.2f}")


if __name__ == "__main__":
    main()
