"""Run directories as a report reads them: metrics, config, summary and benchmark scores of one run,
its label (the group it belongs to) and seed, and the duplicates among several runs."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger(__name__)


@dataclass
class RunData:
    """What a report reads from one run directory."""

    path: Path
    label: str
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    """One entry per step, sorted by step: the rows logged at a step merged (training metrics and
    ``eval/...`` rows); a key logged twice at a step, e.g. after a resume, keeps its last value."""
    summary: dict[str, Any]
    seed: int | None = None
    """``train.seed`` of the run's config, else the ``_seed<k>`` of its name; None when neither says."""
    benchmarks: dict[str, Any] = field(default_factory=dict)
    """``benchmarks/eval.json`` (``teamrl ablate --benchmarks``): the trained weights' scores per benchmark."""

    @property
    def finished(self) -> bool:
        """Whether the run wrote ``summary.json`` (it trained every step and ran its final evaluation)."""
        return bool(self.summary)

    @property
    def trained_steps(self) -> int:
        """How many steps logged training metrics (rows with only ``eval/...`` entries do not count)."""
        return sum(any(k != "step" and not k.startswith("eval/") for k in m) for m in self.metrics)


def run_label(path: Path) -> str:
    """The group a run belongs to: its directory name without ``_seed<k>``.

    >>> run_label(Path("runs/ablate/drmas_seed3"))
    'drmas'
    """
    return re.sub(r"_seed\d+$", "", path.name)


def run_seed(path: Path, config: dict[str, Any]) -> int | None:
    """The run's seed: its config's ``train.seed``, else the ``_seed<k>`` of its directory name.

    >>> run_seed(Path("g/drmas_seed3"), {}), run_seed(Path("g/x"), {"train": {"seed": 7}}), run_seed(Path("x"), {})
    (3, 7, None)
    """
    seed = (config.get("train") or {}).get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool):
        return seed
    m = re.search(r"_seed(\d+)$", path.name)
    return int(m.group(1)) if m else None


def load_run(path: str | Path) -> RunData:
    path = Path(path)
    if not (path / "metrics.jsonl").is_file():
        raise FileNotFoundError(f"{path} is not a run directory (no metrics.jsonl); pass directories written by teamrl train")
    by_step: dict[int, dict[str, Any]] = {}
    lines = (path / "metrics.jsonl").read_text(errors="replace").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if number < len(lines):
                raise ValueError(f"{path / 'metrics.jsonl'} line {number} is not a JSON row ({exc.msg}); "
                                 f"fix or remove that line") from None
            log.warning("%s line %d: left out a torn last line (a run stopped mid-write)", path / "metrics.jsonl", number)
            continue
        by_step.setdefault(row["step"], {}).update(row)
    config = yaml.safe_load((path / "config.yaml").read_text()) if (path / "config.yaml").is_file() else {}
    config = config or {}
    summary = json.loads((path / "summary.json").read_text()) if (path / "summary.json").is_file() else {}
    bench = path / "benchmarks" / "eval.json"
    benchmarks = json.loads(bench.read_text()) if bench.is_file() else {}
    return RunData(path, run_label(path), config, [by_step[s] for s in sorted(by_step)], summary,
                   run_seed(path, config), benchmarks)


def benchmark_scores(run: RunData) -> dict[str, float]:
    """A run's held-out benchmark scores as table entries: ``<benchmark>/avg@n`` and ``<benchmark>/pass@k``.

    >>> r = RunData(Path("x"), "x", {}, [], {}, 0, {"k": 2, "benchmarks": {"gsm8k": {"avg@n": 0.25, "pass@2": 0.5}}})
    >>> benchmark_scores(r)
    {'gsm8k/avg@n': 0.25, 'gsm8k/pass@2': 0.5}
    """
    from teamrl.study.evaluate import pass_key

    out: dict[str, float] = {}
    for name, r in run.benchmarks.get("benchmarks", {}).items():
        key = pass_key(r, run.benchmarks["k"])
        out |= {f"{name}/avg@n": r["avg@n"], f"{name}/{key}": r[key]}
    return out


def dedupe(runs: Sequence[RunData]) -> tuple[list[RunData], list[tuple[RunData, RunData]]]:
    """The runs with one run per (label, seed), and (left out, kept) for each duplicate.

    Of the runs of one (label, seed) the finished one is kept, else the one with more logged
    steps, else the first given. Runs without a seed are all kept.
    """
    best: dict[tuple[str, int], RunData] = {}
    for r in runs:
        if r.seed is None:
            continue
        key = (r.label, r.seed)
        if key not in best or (r.finished, r.trained_steps) > (best[key].finished, best[key].trained_steps):
            best[key] = r
    kept = [r for r in runs if r.seed is None or best[(r.label, r.seed)] is r]
    dropped = [(r, best[(r.label, r.seed)]) for r in runs if r.seed is not None and best[(r.label, r.seed)] is not r]
    return kept, dropped


def agents_of(runs: Sequence[RunData], metric: str = "grad_norm") -> list[str]:
    """The agents with an ``agent/<a>/<metric>`` entry in some run, sorted."""
    names = {k.split("/")[1] for r in runs for m in r.metrics for k in m if k.startswith("agent/") and k.endswith(f"/{metric}")}
    return sorted(names)


def held_out_scores(run: RunData) -> dict[str, float]:
    """A run's final held-out scores beyond accuracy: ``final_pass@k`` of the largest k evaluated (k > 1) and
    each answer metric the task reports (``final_em``, ``final_f1``, ...).

    >>> r = RunData(Path("x"), "x", {}, [], {"after": {"accuracy": 0.2, "pass@1": 0.2, "pass@4": 0.5,
    ...                                                 "metrics": {"em": 0.1, "f1": 0.3}}})
    >>> held_out_scores(r)
    {'final_pass@4': 0.5, 'final_em': 0.1, 'final_f1': 0.3}
    """
    after = run.summary.get("after", {})
    ks = [int(m.group(1)) for key in after if (m := re.fullmatch(r"pass@(\d+)", key)) and int(m.group(1)) > 1]
    out = {f"final_pass@{max(ks)}": float(after[f"pass@{max(ks)}"])} if ks else {}
    return out | {f"final_{name}": float(v) for name, v in after.get("metrics", {}).items()}


def labels_of(runs: Sequence[RunData]) -> list[str]:
    """The runs' labels in order of first appearance."""
    return list(dict.fromkeys(r.label for r in runs))
