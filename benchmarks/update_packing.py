"""The learner's update on real rollouts: padded rows vs packed rows vs packed rows with shared prefixes.

For each config, one rollout batch is sampled with the config's own team, task and model (the
embedded SmolLM2-135M by default), its advantages assigned, and then the learner's gradient pass
over that batch (``compute_gradients``: every micro-batch's forward and backward, what an update
costs before its optimizer step) is timed under the three layouts, alternating, ``--reps`` times
each. Prints tokens computed vs needed (the sum of each row's own length) and the median times, and
one ``RESULT`` line per config with ``ratio`` = padded time / shared time.

    python benchmarks/update_packing.py                       # quickstart, search quickstart, MARS2 tree
    python benchmarks/update_packing.py --configs quickstart --reps 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CONFIGS = {
    "quickstart": ("configs/quickstart.yaml", []),
    "search": ("configs/search_quickstart.yaml", []),
    "multiturn": ("configs/quickstart.yaml", ["workflow.math_team.max_loops=3"]),
    "tree": ("configs/math_team_mars2.yaml", []),
}
LAYOUTS = {"padded": (False, False), "packed": (True, False), "shared": (True, True)}


def sample_steps(name: str, threads: int, out: Path):
    """One rollout batch of config ``name`` with advantages; returns (trainer, steps)."""
    from teamrl.config.schema import load_config
    from teamrl.train.trainer import Trainer

    path, over = CONFIGS[name]
    cfg = load_config(str(REPO / path), [*over, f"run_dir={out / name}", "train.loggers=[]", f"train.threads={threads}"])
    trainer = Trainer(cfg, progress=False)
    problems = trainer.sampler.next(cfg.rollout.batch_size)
    episodes = trainer.rollout.collect(problems, cfg.rollout.group_size, progress=False)
    trainer.scorer.credit.assign(episodes, problems, step=0)
    steps = trainer.scorer.rewards_and_advantages(episodes)
    return trainer, steps


def time_layouts(trainer, steps, reps: int) -> dict[str, dict[str, float]]:
    """Median seconds of one gradient pass per layout (all models), and tokens computed / needed."""
    times: dict[str, list[float]] = {k: [] for k in LAYOUTS}
    tokens: dict[str, tuple[float, float]] = {}
    base = {m: learner.s for m, learner in trainer.learners.items()}
    for _ in range(reps):
        for layout, (pack, share) in LAYOUTS.items():
            computed = needed = 0.0
            t0 = time.perf_counter()
            for m, learner in trainer.learners.items():
                learner.s = replace(base[m], pack_rows=pack, share_prefixes=share)
                out = learner.compute_gradients([s for s in steps if s.model == m])
                learner.optimizer.zero_grad(set_to_none=True)
                computed += out.get("perf/update_tokens_computed", 0.0)
                needed += out.get("perf/update_tokens_needed", 0.0)
            times[layout].append(time.perf_counter() - t0)
            tokens[layout] = (computed, needed)
    for m, learner in trainer.learners.items():
        learner.s = base[m]
    return {k: {"s": statistics.median(v), "computed": tokens[k][0], "needed": tokens[k][1]} for k, v in times.items()}


def preload_tcmalloc() -> None:
    """Restart this script with tcmalloc preloaded when it is installed and not yet loaded (as the CLI does)."""
    from teamrl.cli import _TCMALLOC

    lib = next((p for p in _TCMALLOC if os.path.exists(p)), None)
    if lib is None or "tcmalloc" in os.environ.get("LD_PRELOAD", ""):
        return
    env = dict(os.environ, LD_PRELOAD=" ".join(filter(None, [lib, os.environ.get("LD_PRELOAD", "")])))
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=["quickstart", "search", "tree"], choices=sorted(CONFIGS))
    ap.add_argument("--reps", type=int, default=3, help="timed gradient passes per layout (alternating)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--allocator", choices=["tcmalloc", "system"], default="tcmalloc",
                    help="memory allocator: tcmalloc (preloaded when installed, as `teamrl train` does) or glibc's")
    args = ap.parse_args(argv)
    if argv is None and args.allocator == "tcmalloc":
        preload_tcmalloc()
    print(f"allocator: {'tcmalloc' if 'tcmalloc' in os.environ.get('LD_PRELOAD', '') else 'system'}", flush=True)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.configs:
            trainer, steps = sample_steps(name, args.threads, Path(tmp))
            r = time_layouts(trainer, steps, args.reps)
            print(f"\n{name}: {len(steps)} rows, {r['padded']['needed']:.0f} tokens needed")
            print(f"{'layout':<8} {'computed':>9} {'computed/needed':>16} {'seconds':>8} {'vs padded':>10}")
            for k, v in r.items():
                print(f"{k:<8} {v['computed']:>9.0f} {v['computed'] / v['needed']:>16.3f} {v['s']:>8.2f} "
                      f"{r['padded']['s'] / v['s']:>9.2f}x")
            print(f"RESULT name=update_packing config={name} rows={len(steps)} needed={r['padded']['needed']:.0f} "
                  + " ".join(f"{k}_computed={v['computed']:.0f} {k}_s={v['s']:.3f}" for k, v in r.items())
                  + f" ratio={r['padded']['s'] / r['shared']['s']:.3f}", flush=True)
            trainer.sink.close({})
            del trainer


if __name__ == "__main__":
    main()
