"""What the command line shows around a command: the end-of-run table and its next steps, hints for flags written
as another trainer's, the allocator restart of ``train``/``eval``/``ablate``/``probe``, and the cleanup of a run
folder a failed command created. :mod:`teamrl.cli` parses and dispatches."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from teamrl.plan.prior import WorkPrior


def format_results(results: dict, cfg) -> str:
    """The end-of-run table: untrained vs trained held-out accuracy; an evaluation whose episodes all failed is its
    one line (``failed``, :func:`teamrl.train.evaluation.failed_evaluation`)."""
    from teamrl.study.evaluate import pass_key

    lines = [f"run directory: {cfg.run_dir}"]
    if not results:
        return lines[0]
    any_r = next(iter(results.values()))
    lines.append(f"held-out accuracy ({any_r['problems']} problems x {any_r['samples']} samples, seed {cfg.train.seed}):")
    k = any_r["samples"]
    for tag, label in (("before", "untrained"), ("after", "trained")):
        if tag in results and "failed" in results[tag]:
            again = f" (the weights are saved: teamrl eval --checkpoint {cfg.run_dir} evaluates them again)"
            lines.append(f"  {label:<10} {results[tag]['failed']}{again if tag == 'after' else ''}")
        elif tag in results:
            r = results[tag]
            key = pass_key(r, k)  # "pass@k (EM)" where the task defines solved (search)
            lines.append(f"  {label:<10} accuracy {r['accuracy']:.3f}   {key} {r[key]:.3f}")
    if all(tag in results and "failed" not in results[tag] for tag in ("before", "after")):
        lines.append(f"  change     {results['after']['accuracy'] - results['before']['accuracy']:+.3f}")
    return "\n".join(lines)


def format_time(run_dir: str | Path) -> str | None:
    """The run's time by phase and each phase's share of its floor, one line (:func:`time_line`), from its
    summary.json; None without one."""
    path = Path(run_dir) / "summary.json"
    return time_line(json.loads(path.read_text())) if path.is_file() else None


def time_line(summary: dict) -> str | None:
    """The time by phase and each phase's share of its floor of a summary.json's ``time`` and ``time_evals``, one
    line; None when the run recorded none.

    >>> time_line({"time": {"rollout": {"s": 90.0, "floor_s": 30.0, "limit_frac": 0.333, "engine_s": 80.0,
    ...                                   "host_s": 10.0}, "update": {"s": 200.0, "floor_s": 60.0, "limit_frac": 0.3}},
    ...              "time_evals": {"before": {"s": 130.0, "floor_s": 26.0, "limit_frac": 0.2}}})
    'time by phase (share of its floor): rollout 90.0 s (33%; engine 80.0 s, host 10.0 s), update 3.3 min (30%), eval before 2.2 min (20%)'
    """
    def t(s: float) -> str:
        return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"

    parts = []
    for phase, v in (summary.get("time") or {}).items():
        share = f"{v['limit_frac']:.0%}" if v.get("floor_s") else "no floor"
        split = f"; engine {t(v['engine_s'])}, host {t(v['host_s'])}" if "engine_s" in v else ""
        parts.append(f"{phase} {t(v['s'])} ({share}{split})")
    for tag, v in (summary.get("time_evals") or {}).items():
        share = f"{v['limit_frac']:.0%}" if v.get("floor_s") else "no floor"
        parts.append(f"eval {tag} {t(v['s'])} ({share})")
    return f"time by phase (share of its floor): {', '.join(parts)}" if parts else None


_TCMALLOC = ("/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4", "/usr/lib/aarch64-linux-gnu/libtcmalloc.so.4",
             "/usr/lib64/libtcmalloc.so.4", "/usr/lib/libtcmalloc.so.4")


def run_prior(run_dir: str | Path) -> WorkPrior:
    """The work prior of an earlier run (``--plan-from RUN``, :mod:`teamrl.plan.prior`): its metrics.jsonl against the
    plan of its config.yaml. A folder that holds no run raises ValueError naming what is missing."""
    from teamrl.config.schema import load_config
    from teamrl.plan.timing import measure

    run = Path(run_dir)
    cfg_file, metrics = run / "config.yaml", run / "metrics.jsonl"
    for f in (cfg_file, metrics):
        if not f.is_file():
            raise ValueError(f"--plan-from {run_dir}: no {f.name} there (a run folder of teamrl train)")
    rows = []
    for line in metrics.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a torn last line of a killed run
    steps = sum("perf/rollout/s" in r for r in rows)
    return measure(load_config(cfg_file), rows, f"the run {run_dir} ({steps} steps)")


def allocator_of(argv: list[str]) -> str:
    """The ``--allocator`` of a ``teamrl train/eval/ablate`` command line, read before argparse runs (it decides
    whether the process restarts itself): ``tcmalloc`` unless the line says ``system``.

    >>> allocator_of(["train", "c.yaml", "--allocator", "system"]), allocator_of(["eval", "--allocator=system"])
    ('system', 'system')
    >>> allocator_of(["train", "c.yaml"])
    'tcmalloc'
    """
    for i, arg in enumerate(argv):
        if arg == "--allocator" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--allocator="):
            return arg.split("=", 1)[1]
    return "tcmalloc"


def _reexec_with_tcmalloc() -> None:
    """Restart the process with tcmalloc preloaded when it is installed (training ~1.35x faster on CPU).

    glibc's allocator returns and re-requests the large activation buffers of every training
    step; tcmalloc keeps them. ``--allocator system`` keeps glibc's malloc.
    """
    if allocator_of(sys.argv[1:]) != "tcmalloc" or "tcmalloc" in os.environ.get("LD_PRELOAD", ""):
        return
    lib = next((p for p in _TCMALLOC if os.path.exists(p)), None)
    if lib is None:
        return
    env = dict(os.environ, LD_PRELOAD=" ".join(filter(None, [lib, os.environ.get("LD_PRELOAD", "")])))
    os.execve(sys.executable, [sys.executable, "-m", "teamrl.cli", *sys.argv[1:]], env)


def _add_allocator(parser: argparse.ArgumentParser) -> None:
    """``--allocator``, which :func:`allocator_of` reads before argparse does (train, eval and ablate)."""
    parser.add_argument("--allocator", choices=["tcmalloc", "system"], default="tcmalloc",
                        help="memory allocator of the process: tcmalloc (default; preloaded when installed, training "
                             "~1.35x faster on CPU) or system (glibc's malloc)")




def next_steps(run_dir: str) -> str:
    """What to do with a finished run: its TensorBoard, ``report``, ``eval``, ``export`` and a team of one's own.

    >>> print(next_steps("runs/quickstart").splitlines()[1])
      tensorboard --logdir runs/quickstart/tensorboard     # curves: reward, per-agent grad norms, accuracy
    """
    return "\n".join([
        "next steps:",
        f"  tensorboard --logdir {run_dir}/tensorboard     # curves: reward, per-agent grad norms, accuracy",
        f"  teamrl report {run_dir}                        # report.html with plots and tables",
        f"  teamrl eval --checkpoint {run_dir}             # evaluate again, with the run's own settings",
        f"  teamrl export {run_dir} --out exported         # Hugging Face folders of the trained models",
        "  your own data and reward: docs/own-task.md; your own team: docs/custom-teams.md",
    ])


def flag_hint(rest: list[str]) -> str:
    """A hint for options written as another trainer's flags (``--learning_rate 1e-5``, ``--train.steps=1``): teamrl
    takes settings as ``key=value``.

    >>> flag_hint(["--train.steps=1"])
    '; settings are key=value: write train.steps=1 (every key: teamrl train --help-config)'
    >>> flag_hint(["--learning_rate", "1e-5"])
    '; settings are key=value, e.g. models.<m>.optim.lr=1e-5 (every key: teamrl train --help-config)'
    >>> flag_hint(["--frobnicate"])
    ''
    """
    for i, arg in enumerate(rest):
        if not arg.startswith("--"):
            continue
        key, sep, value = arg[2:].partition("=")
        if not sep and i + 1 < len(rest) and not rest[i + 1].startswith("-"):
            value = rest[i + 1]
        if "." in key:
            return f"; settings are key=value: write {key}={value or '...'} (every key: teamrl train --help-config)"
        if key.replace("-", "_") in _TRAINER_FLAGS:
            example = _TRAINER_FLAGS[key.replace("-", "_")]
            return f"; settings are key=value, e.g. {example}={value or '...'} (every key: teamrl train --help-config)"
    return ""


_TRAINER_FLAGS = {"learning_rate": "models.<m>.optim.lr", "lr": "models.<m>.optim.lr", "max_steps": "train.steps",
                  "num_train_epochs": "train.steps", "seed": "train.seed", "output_dir": "run_dir",
                  "num_generations": "rollout.group_size", "per_device_train_batch_size": "rollout.batch_size",
                  "max_completion_length": "agents.<a>.max_new_tokens", "temperature": "agents.<a>.temperature",
                  "beta": "loss.kl_coef", "warmup_steps": "models.<m>.optim.warmup_steps",
                  "model_name_or_path": "models.<m>.path", "steps": "train.steps"}
"""Flags of other trainers' command lines and the teamrl key each one means."""


def remove_new_run_dir(run_dir: Path, existed: bool) -> None:
    """Remove a run folder this command created when the command failed before writing any record (no metrics,
    no checkpoint): a failed ``train`` or ``eval`` leaves no stray folder behind."""
    from teamrl.train.rundir import used_records

    if not existed and run_dir.is_dir() and not used_records(run_dir):
        shutil.rmtree(run_dir, ignore_errors=True)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("teamrl")
    except PackageNotFoundError:  # a source tree on PYTHONPATH, not installed
        return "(not installed)"
