"""``teamrl ablate``: train one config under several estimator presets and seeds, then compare.

Each run (cell) lives in ``<out>/<preset>_seed<k>``. The grid is resumable: a run with
``summary.json`` is finished and skipped, a run with a checkpoint resumes from it, any other starts
afresh (dropping the rows a run killed before its first checkpoint had logged). With ``jobs`` = 1
the runs go one after another in this process; with ``jobs`` > 1 up to that many run at once, each
as its own ``teamrl train`` process logging to ``<run_dir>/train.log``. With benchmarks, every
finished run is then scored on them (``teamrl eval``) into ``<run_dir>/benchmarks/``.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from teamrl.algos.advantages import get_estimator
from teamrl.learner import checkpoint

log = logging.getLogger(__name__)


class CellsFailed(RuntimeError):
    """Some runs of a grid run in separate processes failed; the others finished and were reported."""


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


def parse_seeds(text: str) -> list[int]:
    """``--seeds``: one number N (seeds 0 .. N-1), or a comma-separated list of seeds and ``A-B`` ranges.

    >>> parse_seeds("3"), parse_seeds("3-5"), parse_seeds("0,2,7-8")
    ([0, 1, 2], [3, 4, 5], [0, 2, 7, 8])
    """
    fix = "write N for seeds 0..N-1, A-B for a range or a list such as 0,3,5-7"
    items = [x.strip() for x in text.split(",")]
    try:
        if len(items) == 1 and "-" not in items[0]:
            n = int(items[0])
            if n < 1:
                raise ValueError(f"--seeds {n} must be >= 1 (runs use train.seed = 0 .. seeds-1)")
            return list(range(n))
        seeds: list[int] = []
        for item in items:
            lo, sep, hi = item.partition("-")
            a, b = (int(lo), int(hi)) if sep else (int(item), int(item))
            if a < 0 or b < a:
                raise ValueError(f"--seeds {text!r}: {item!r} is not a seed or an increasing range A-B; {fix}")
            seeds += [s for s in range(a, b + 1) if s not in seeds]
    except ValueError as exc:
        if str(exc).startswith("--seeds"):
            raise
        raise ValueError(f"--seeds {text!r} is not a number of seeds or a list of them; {fix}") from None
    return seeds


def grid(presets: Sequence[str], seeds: int | Sequence[int], out: Path) -> list[tuple[str, int, Path]]:
    """(preset, seed, run directory) of every run, presets outer, seeds inner; ``seeds``: a count (seeds
    0 .. N-1) or the seeds themselves.

    >>> [(p, s, d.name) for p, s, d in grid(["grpo", "drmas"], 2, Path("o"))][:3]
    [('grpo', 0, 'grpo_seed0'), ('grpo', 1, 'grpo_seed1'), ('drmas', 0, 'drmas_seed0')]
    """
    if isinstance(seeds, int):
        if seeds < 1:
            raise ValueError(f"--seeds {seeds} must be >= 1 (runs use train.seed = 0 .. seeds-1)")
        seeds = range(seeds)
    return [(p, s, out / f"{p}_seed{s}") for p in presets for s in seeds]


def run_state(run_dir: Path) -> str:
    """'done' (summary.json written), 'resume' (a checkpoint exists) or 'new'."""
    if (run_dir / "summary.json").is_file():
        return "done"
    return "resume" if checkpoint.latest(run_dir / "checkpoints") is not None else "new"


def train_command(config: str | None, overrides: Sequence[str], *, resume: bool,
                  imports: Sequence[str] = (), allocator: str = "tcmalloc") -> list[str]:
    """The ``teamrl train`` command line of one run (this Python, ``-m teamrl.cli``).

    >>> train_command("c.yaml", ["train.steps=2", "run_dir=o/grpo_seed0"], resume=True, imports=["t.py"])[1:]
    ['-m', 'teamrl.cli', 'train', '--import', 't.py', 'c.yaml', 'train.steps=2', 'run_dir=o/grpo_seed0', '--resume']
    >>> train_command("c.yaml", [], resume=False, allocator="system")[1:]
    ['-m', 'teamrl.cli', 'train', '--allocator', 'system', 'c.yaml']
    """
    cmd = [sys.executable, "-m", "teamrl.cli", "train", *_allocator_args(allocator)]
    for path in imports:
        cmd += ["--import", path]
    cmd += [*([config] if config is not None else []), *overrides]
    return cmd + (["--resume"] if resume else [])


def _allocator_args(allocator: str) -> list[str]:
    """A child's ``--allocator``: ``tcmalloc`` is its default, so only ``system`` is passed on."""
    return [] if allocator == "tcmalloc" else ["--allocator", allocator]


@dataclass
class Job:
    """One command of :func:`run_jobs`: its name, its argument list and the file its output goes to."""

    name: str
    argv: list[str]
    log: Path


def run_jobs(jobs: Sequence[Job], parallel: int, *, poll_s: float = 0.2,
             env: dict[str, str] | None = None) -> dict[str, int]:
    """Run the commands, at most ``parallel`` at a time, each appending stdout and stderr to its log;
    returns each one's exit status. Interrupted (Ctrl-C), it stops the running ones and re-raises."""
    if parallel < 1:
        raise ValueError(f"--jobs {parallel} must be >= 1")
    pending = list(jobs)
    running: dict[str, tuple[Job, subprocess.Popen[bytes]]] = {}
    done: dict[str, int] = {}
    try:
        while pending or running:
            while pending and len(running) < parallel:
                job = pending.pop(0)
                job.log.parent.mkdir(parents=True, exist_ok=True)
                with job.log.open("a") as f:
                    f.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(job.argv)}\n")
                    f.flush()
                    running[job.name] = (job, subprocess.Popen(job.argv, stdout=f, stderr=subprocess.STDOUT,
                                                               stdin=subprocess.DEVNULL, env=env))
                log.info("started %s (log: %s)", job.name, job.log)
            for name, (_job, proc) in list(running.items()):
                if proc.poll() is not None:
                    done[name] = proc.returncode
                    del running[name]
                    log.info("%s ended with exit status %d", name, proc.returncode)
            time.sleep(poll_s if running else 0)
    finally:
        for _job, proc in running.values():  # interrupted: stop the others (their checkpoints let them resume)
            proc.terminate()
        for _job, proc in running.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    return done


BENCHMARKS_DIR = "benchmarks"
"""A run's folder of held-out benchmark results (``teamrl ablate --benchmarks``): ``<run_dir>/benchmarks/eval.json``."""


def benchmarks_done(run_dir: Path, benchmarks: dict[str, str], k: int) -> bool:
    """Whether ``<run_dir>/benchmarks/eval.json`` holds every benchmark named in ``benchmarks`` at this ``k``."""
    path = run_dir / BENCHMARKS_DIR / "eval.json"
    if not path.is_file():
        return False
    done = json.loads(path.read_text())
    return done.get("k") == k and set(benchmarks) <= set(done.get("benchmarks", {}))


def eval_command(config: str | None, overrides: Sequence[str], run_dir: Path, benchmarks: dict[str, str], k: int,
                 samples: int, imports: Sequence[str] = (), allocator: str = "tcmalloc") -> list[str]:
    """The ``teamrl eval`` command line scoring a finished run's weights on ``benchmarks``.

    >>> eval_command("c.yaml", ["x=1"], Path("o/r"), {"gsm8k": "g.jsonl"}, 4, 8)[3:]
    ['eval', 'c.yaml', 'x=1', '--checkpoint', 'o/r', '--benchmarks', 'gsm8k=g.jsonl', '--k', '4', '--samples', '8', '--out', 'o/r/benchmarks']
    """
    cmd = [sys.executable, "-m", "teamrl.cli", "eval", *_allocator_args(allocator)]
    for path in imports:
        cmd += ["--import", path]
    return cmd + [*([config] if config is not None else []), *overrides, "--checkpoint", str(run_dir),
                  "--benchmarks", ",".join(f"{n}={p}" for n, p in benchmarks.items()), "--k", str(k),
                  "--samples", str(samples), "--out", str(run_dir / BENCHMARKS_DIR)]


def ablate(config: str | None, presets: Sequence[str], seeds: int | Sequence[int], overrides: Sequence[str],
           out: str | Path, *, progress: bool = True, train: Callable | None = None, jobs: int = 1,
           imports: Sequence[str] = (), baseline: str = "grpo", require_baseline: bool = False,
           benchmarks: dict[str, str] | None = None, k: int = 4, samples: int | None = None,
           allocator: str = "tcmalloc") -> Path:
    """Run the grid, then write the comparison report into ``out``; returns report.html's path.

    ``train(cfg, resume)`` runs one training run in this process (default:
    :class:`teamrl.train.trainer.Trainer`); ``jobs`` > 1 runs up to that many at once as ``teamrl train``
    processes instead (``imports``: their ``--import`` files). ``benchmarks`` (name → GSM8K/MATH-style
    file): each finished run's trained weights are then scored on them (avg@n and pass@k, n = ``samples``,
    default k) into ``<run_dir>/benchmarks/``, as ``teamrl eval`` does. ``allocator``: the processes'
    ``--allocator``. Raises :class:`CellsFailed` after the report when some of those processes failed.
    """
    from teamrl.config.schema import load_config
    from teamrl.study.report import write_report
    from teamrl.train.rundir import drop_rows_from

    if jobs < 1:
        raise ValueError(f"--jobs {jobs} must be >= 1 (1: one run after another in this process)")
    if require_baseline and baseline not in presets:
        raise ValueError(f"--baseline {baseline!r} is not among --presets ({', '.join(presets)}); add it there or "
                         f"pick one of them")
    benchmarks = dict(benchmarks or {})
    samples = samples or k
    if benchmarks and not 1 <= k <= samples:
        raise ValueError(f"--k {k} must be between 1 and --samples {samples} (samples per problem); raise --samples "
                         f"or lower --k")
    out = Path(out)
    runs = grid(presets, seeds, out)
    cell_overrides = [[*overrides, f"algo.estimator={p}", f"train.seed={s}", f"run_dir={d}"] for p, s, d in runs]
    configs = [load_config(config, o) for o in cell_overrides]  # every config is checked before the first run starts
    if benchmarks:
        _check_benchmarks(benchmarks)
    todo = []
    for (preset, seed, run_dir), cfg, cell in zip(runs, configs, cell_overrides):
        state = run_state(run_dir)
        log.info("ablate: %s seed %d -> %s (%s)", preset, seed, run_dir, state)
        if state == "new":  # killed before its first checkpoint: it starts again, without the rows it logged
            for name in ("metrics.jsonl", "episodes.jsonl", "failed_episodes.jsonl"):
                drop_rows_from(run_dir / name, 0)
        if state != "done":
            todo.append((preset, seed, run_dir, cfg, cell, state == "resume"))
    failed = []
    if jobs == 1:
        train = train or _train_one(progress)
        for _, _, _, cfg, _, resume in todo:
            train(cfg, resume)
            gc.collect()
    else:
        work = [Job(f"{p}_seed{s}", train_command(config, cell, resume=resume, imports=imports, allocator=allocator),
                    d / "train.log") for p, s, d, _, cell, resume in todo]
        status = run_jobs(work, jobs, env=_child_env())
        failed = [(job, status[job.name]) for job in work if status.get(job.name) != 0]
    if benchmarks:
        failed += _evaluate_cells(config, runs, cell_overrides, benchmarks, k, samples, jobs=jobs, imports=imports,
                                  progress=progress, allocator=allocator)
    reported = [d for _, _, d in runs if (d / "metrics.jsonl").is_file()]
    report = out / "report.html"
    if reported:
        report = write_report(reported, out, title=f"ablation: {out.name}", baseline=baseline,
                              require_baseline=require_baseline)
    if failed:
        lines = "; ".join(f"{job.name} (exit status {rc}, log {job.log})" for job, rc in failed)
        raise CellsFailed(f"{len(failed)} job(s) of the grid of {len(runs)} runs failed: {lines}; fix the cause and "
                          f"rerun the same command (what finished is skipped)")
    return report


def _check_benchmarks(benchmarks: dict[str, str]) -> None:
    """Read every benchmark's test split now, so a wrong path fails before any training."""
    from teamrl.tasks.base import benchmark_task

    for name, path in benchmarks.items():
        try:
            problems = benchmark_task(path).problems("test")
        except (OSError, ValueError) as exc:
            raise ValueError(f"--benchmarks {name}={path}: cannot be read ({exc}); pass a GSM8K/MATH-style "
                             f"test file") from None
        if not problems:
            raise ValueError(f"--benchmarks {name}={path}: no problems in it; pass a GSM8K/MATH-style test file")


def _evaluate_cells(config: str | None, runs: Sequence[tuple[str, int, Path]], cell_overrides: Sequence[list[str]],
                    benchmarks: dict[str, str], k: int, samples: int, *, jobs: int, imports: Sequence[str],
                    progress: bool, allocator: str = "tcmalloc") -> list[tuple[Job, int]]:
    """Score every finished run without benchmark results on ``benchmarks``; returns the failed evaluations."""
    todo = [(p, s, d, o) for (p, s, d), o in zip(runs, cell_overrides)
            if run_state(d) == "done" and not benchmarks_done(d, benchmarks, k)]
    if jobs == 1:
        from teamrl.config.schema import load_config
        from teamrl.study.evaluate import run_eval

        for _, _, run_dir, cell in todo:
            cfg = load_config(config, [*cell, f"run_dir={run_dir / BENCHMARKS_DIR}", f"eval.samples={samples}",
                                       "train.loggers=[]"])
            run_eval(cfg, checkpoint=str(run_dir), benchmarks=benchmarks, k=k, progress=progress)
            gc.collect()
        return []
    work = [Job(f"{p}_seed{s} (benchmarks)", eval_command(config, cell, d, benchmarks, k, samples, imports, allocator),
                d / "eval.log") for p, s, d, cell in todo]
    status = run_jobs(work, jobs, env=_child_env())
    return [(job, status[job.name]) for job in work if status.get(job.name) != 0]


def _child_env() -> dict[str, str]:
    """The environment of a grid's processes: unbuffered output, progress bars redrawn at most every 30 s."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_MININTERVAL": os.environ.get("TQDM_MININTERVAL", "30")}


def _train_one(progress: bool) -> Callable:
    def run(cfg, resume: bool) -> None:
        from teamrl.train.trainer import Trainer

        Trainer(cfg, resume=resume, progress=progress).train()

    return run
