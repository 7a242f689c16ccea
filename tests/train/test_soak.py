"""A long tiny run stays flat: resident memory, open files, threads, child processes and the run folder's
checkpoints stop growing after a warm-up (the checkpoints pruned by train.keep_checkpoints, memory given back
between phases by train.release_memory). The default suite runs 10 steps; the slow one 30."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil
import pytest

from teamrl.config.schema import load_config
from teamrl.train.trainer import Trainer

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")

MB = 1 << 20
WARMUP = 3
"""Steps after which nothing should grow: the first update allocates AdamW's state, the first save a checkpoint."""


def sample(run_dir: Path) -> dict[str, int]:
    """This process's resources now, and the run folder's size (its checkpoints apart)."""
    def size(root: Path) -> int:
        return sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) if root.is_dir() else 0

    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return {"rss": rss, "fds": len(os.listdir("/proc/self/fd")), "threads": len(os.listdir("/proc/self/task")),
            "children": len(psutil.Process().children(recursive=True)),
            "checkpoints": size(run_dir / "checkpoints"), "run_dir": size(run_dir)}


def soak(run_dir: Path, model_dir: Path, steps: int) -> list[dict[str, int]]:
    """Train ``steps`` steps (a checkpoint each) and sample the resources as each step's metrics are written."""
    cfg = load_config(None, [f"run_dir={run_dir}", f"models.main.path={model_dir}", f"train.steps={steps}",
                             "train.save_every=1", "train.keep_checkpoints=1", "rollout.batch_size=2",
                             "rollout.group_size=2", "eval.before=false", "eval.after=false", "train.loggers=[]",
                             "agents.solver.max_new_tokens=8", "agents.verifier.max_new_tokens=8"])
    trainer = Trainer(cfg, progress=False)
    samples: list[dict[str, int]] = []
    write = trainer.sink.write

    def write_and_sample(step, metrics):
        write(step, metrics)
        samples.append(sample(run_dir))  # after step-1's checkpoint was pruned (it is saved after this write)

    trainer.sink.write = write_and_sample  # type: ignore[method-assign]
    trainer.train()
    return samples


def assert_flat(samples: list[dict[str, int]]) -> None:
    warm, later = samples[WARMUP], samples[WARMUP + 1:]
    for key in ("fds", "threads", "children"):
        assert max(s[key] for s in later) <= warm[key], f"{key} grew after warm-up: {[s[key] for s in samples]}"
    assert max(s["checkpoints"] for s in later) <= 1.05 * warm["checkpoints"], [s["checkpoints"] for s in samples]
    per_step = (later[-1]["run_dir"] - later[-1]["checkpoints"] - warm["run_dir"] + warm["checkpoints"]) / len(later)
    assert per_step < 256 * 1024, f"records grow {per_step / 1024:.0f} KiB per step"  # metrics and transcripts only
    grew = later[-1]["rss"] - warm["rss"]
    assert grew < 64 * MB, f"resident memory grew {grew / MB:.0f} MiB after warm-up: {[s['rss'] // MB for s in samples]}"


@pytest.mark.slow  # about 30 s; test_a_long_run_stays_flat below is its longer form
def test_a_short_run_stays_flat(tmp_path, tiny_model_dir):
    assert_flat(soak(tmp_path / "run", tiny_model_dir, 10))


@pytest.mark.slow
def test_a_long_run_stays_flat(tmp_path, tiny_model_dir):
    assert_flat(soak(tmp_path / "run", tiny_model_dir, 30))
