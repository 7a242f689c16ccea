"""``teamrl ablate``: train one config under several estimator presets and seeds, then compare.

Each run lives in ``<out>/<preset>_seed<k>``. The grid is resumable: a run with ``summary.json``
is finished and skipped, a run with a checkpoint resumes from it, any other starts afresh.
Runs are sequential (one process, one run at a time).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from teamrl.algos.advantages import get_estimator
from teamrl.learner import checkpoint

log = logging.getLogger(__name__)


def parse_presets(text: str) -> list[str]:
    """Comma-separated preset names, each checked against the registered presets.

    >>> parse_presets("grpo, drmas")
    ['grpo', 'drmas']
    """
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise ValueError(f"--presets {text!r} names no preset; give a comma-separated list such as grpo,drmas")
    for name in names:
        try:
            get_estimator(name)
        except ValueError as exc:  # the same message as algo.estimator's
            raise ValueError(f"--presets: {exc}") from None
    return names


def grid(presets: Sequence[str], seeds: int, out: Path) -> list[tuple[str, int, Path]]:
    """(preset, seed, run directory) of every run, presets outer, seeds inner.

    >>> [(p, s, d.name) for p, s, d in grid(["grpo", "drmas"], 2, Path("o"))][:3]
    [('grpo', 0, 'grpo_seed0'), ('grpo', 1, 'grpo_seed1'), ('drmas', 0, 'drmas_seed0')]
    """
    if seeds < 1:
        raise ValueError(f"--seeds {seeds} must be >= 1 (runs use train.seed = 0 .. seeds-1)")
    return [(p, s, out / f"{p}_seed{s}") for p in presets for s in range(seeds)]


def run_state(run_dir: Path) -> str:
    """'done' (summary.json written), 'resume' (a checkpoint exists) or 'new'."""
    if (run_dir / "summary.json").is_file():
        return "done"
    return "resume" if checkpoint.latest(run_dir / "checkpoints") is not None else "new"


def ablate(config: str | None, presets: Sequence[str], seeds: int, overrides: Sequence[str], out: str | Path, *,
           progress: bool = True, train: Callable | None = None) -> Path:
    """Run the grid, then write the comparison report into ``out``; returns report.html's path.

    ``train(cfg, resume)`` runs one training run (default: :class:`teamrl.train.trainer.Trainer`).
    """
    from teamrl.config import load_config
    from teamrl.study.report import write_report

    out = Path(out)
    runs = grid(presets, seeds, out)
    configs = [load_config(config, [*overrides, f"algo.estimator={p}", f"train.seed={s}", f"run_dir={d}"])
               for p, s, d in runs]  # every config is checked before the first run starts
    train = train or _train_one(progress)
    for (preset, seed, run_dir), cfg in zip(runs, configs):
        state = run_state(run_dir)
        log.info("ablate: %s seed %d -> %s (%s)", preset, seed, run_dir, state)
        if state != "done":
            train(cfg, state == "resume")
            gc.collect()
    return write_report([d for _, _, d in runs], out, title=f"ablation: {out.name}")


def _train_one(progress: bool) -> Callable:
    def run(cfg, resume: bool) -> None:
        from teamrl.train.trainer import Trainer

        Trainer(cfg, resume=resume, progress=progress).train()

    return run
