"""Compare runs: a table (markdown + csv), PNG plots and one ``report.html``.

Runs are grouped by label: the run directory's name without a trailing ``_seed<k>`` (so
``drmas_seed0`` and ``drmas_seed1`` form the group ``drmas``). Each table cell is the mean over the
group's runs ± its standard error (sample std / √n; 0 for one run). Plots draw the mean over the
group at each step with a ±1 standard-error band. Definitions: ``docs/diagnostics.md``.
"""

from __future__ import annotations

import csv
import html
import json
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


@dataclass
class RunData:
    """What a report reads from one run directory."""

    path: Path
    label: str
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    """One entry per step, sorted by step (for a step logged twice, e.g. after a resume, the last)."""
    summary: dict[str, Any]


def run_label(path: Path) -> str:
    """The group a run belongs to: its directory name without ``_seed<k>``.

    >>> run_label(Path("runs/ablate/drmas_seed3"))
    'drmas'
    """
    return re.sub(r"_seed\d+$", "", path.name)


def load_run(path: str | Path) -> RunData:
    path = Path(path)
    if not (path / "metrics.jsonl").is_file():
        raise FileNotFoundError(f"{path} is not a run directory (no metrics.jsonl); pass directories written by teamrl train")
    by_step: dict[int, dict[str, Any]] = {}
    for line in (path / "metrics.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            by_step[row["step"]] = row
    config = yaml.safe_load((path / "config.yaml").read_text()) if (path / "config.yaml").is_file() else {}
    summary = json.loads((path / "summary.json").read_text()) if (path / "summary.json").is_file() else {}
    return RunData(path, run_label(path), config or {}, [by_step[s] for s in sorted(by_step)], summary)


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error (sample std / √n; 0 for a single value) of the finite values.

    >>> mean_se([1.0, 2.0, 3.0])
    (2.0, 0.5773502691896258)
    """
    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return math.nan, math.nan
    return statistics.fmean(vals), (statistics.stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else 0.0)


def agents_of(runs: Sequence[RunData]) -> list[str]:
    names = {k.split("/")[1] for r in runs for m in r.metrics for k in m if k.startswith("agent/") and k.endswith("/grad_norm")}
    return sorted(names)


def run_row(run: RunData, agents: Sequence[str]) -> dict[str, float]:
    """One run's table entries: final held-out accuracy, grad-norm max/median and spikes per agent, wall time."""
    after = run.summary.get("after", {})
    spikes = run.summary.get("grad_spikes", {}).get("agents", {})
    row = {"final_accuracy": after.get("accuracy", math.nan)}
    for a in agents:
        norms = [m[f"agent/{a}/grad_norm"] for m in run.metrics if m.get(f"agent/{a}/grad_norm") is not None]
        row[f"grad_norm_max/{a}"] = max(norms) if norms else math.nan
        row[f"grad_norm_median/{a}"] = statistics.median(norms) if norms else math.nan
        last = run.metrics[-1].get(f"agent/{a}/grad_spikes", math.nan) if run.metrics else math.nan
        row[f"spikes/{a}"] = float(spikes.get(a, last))
    row["wall_s"] = sum(m.get("perf/step_s") or 0.0 for m in run.metrics)
    return row


def comparison(runs: Sequence[RunData]) -> tuple[list[str], list[dict[str, Any]]]:
    """Columns and one row per label: ``label``, ``runs``, and for each column its mean and standard error."""
    agents = agents_of(runs)
    rows = {id(r): run_row(r, agents) for r in runs}
    columns = list(next(iter(rows.values())).keys()) if rows else []
    out = []
    for label in dict.fromkeys(r.label for r in runs):
        mine = [rows[id(r)] for r in runs if r.label == label]
        entry: dict[str, Any] = {"label": label, "runs": len(mine)}
        for c in columns:
            entry[c], entry[c + ":se"] = mean_se([m[c] for m in mine])
        out.append(entry)
    return columns, out


def _fmt(mean: float, se: float) -> str:
    if math.isnan(mean):
        return "n/a"
    digits = 3 if abs(mean) < 100 else 0
    return f"{mean:.{digits}f} ± {se:.{digits}f}"


def table_markdown(columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> str:
    head = ["run", "seeds", *columns]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([r["label"], str(r["runs"]), *(_fmt(r[c], r[c + ":se"]) for c in columns)]) + " |")
    return "\n".join(lines) + "\n"


def write_csv(path: Path, columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "seeds", *(x for c in columns for x in (c, c + "_se"))])
        for r in rows:
            w.writerow([r["label"], r["runs"], *(x for c in columns for x in (r[c], r[c + ":se"]))])


def curve(runs: Sequence[RunData], key: str) -> tuple[list[int], list[float], list[float]]:
    """Steps, mean over runs and standard error of metric ``key`` (steps where some run logged it)."""
    per_step: dict[int, list[float]] = {}
    for r in runs:
        for m in r.metrics:
            if m.get(key) is not None:
                per_step.setdefault(m["step"], []).append(m[key])
    steps = sorted(per_step)
    stats = [mean_se(per_step[s]) for s in steps]
    return steps, [m for m, _ in stats], [se for _, se in stats]


def plot(runs: Sequence[RunData], panels: Sequence[tuple[str, str]], path: Path, ylabel: str) -> Path:
    """One panel per (title, metric key): a line per label (mean over its runs) with a ±1 SE band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (title, key) in zip(axes[0], panels):
        for label in dict.fromkeys(r.label for r in runs):
            steps, mean, se = curve([r for r in runs if r.label == label], key)
            if not steps:
                continue
            line, = ax.plot(steps, mean, marker="o" if len(steps) < 30 else None, label=label)
            ax.fill_between(steps, [m - s for m, s in zip(mean, se)], [m + s for m, s in zip(mean, se)],
                            color=line.get_color(), alpha=0.2)
        ax.set_title(title)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(run_dirs: Sequence[str | Path], out: str | Path, title: str = "teamrl report") -> Path:
    """Write comparison.md, comparison.csv, reward.png, grad_norm.png, amplification.png and report.html to ``out``."""
    runs = [load_run(p) for p in run_dirs]
    if not runs:
        raise ValueError("no runs to report on; pass one or more run directories")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    columns, rows = comparison(runs)
    md = table_markdown(columns, rows)
    (out / "comparison.md").write_text(f"# {title}\n\nmean ± standard error over seeds\n\n{md}")
    write_csv(out / "comparison.csv", columns, rows)
    agents = agents_of(runs)
    figures = [plot(runs, [("reward (rollout mean)", "rollout/reward_mean")], out / "reward.png", "reward")]
    if agents:
        figures.append(plot(runs, [(f"{a}: gradient norm", f"agent/{a}/grad_norm") for a in agents],
                            out / "grad_norm.png", "gradient norm"))
        figures.append(plot(runs, [(f"{a}: amplification factor", f"agent/{a}/amplification") for a in agents],
                            out / "amplification.png", "(σ_k² + (μ_k − μ)²) / σ²"))
    (out / "report.html").write_text(_html(title, columns, rows, [f.name for f in figures], runs))
    return out / "report.html"


def _html(title: str, columns: Sequence[str], rows: Sequence[dict[str, Any]], images: Sequence[str],
          runs: Sequence[RunData]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(c)}</th>" for c in ["run", "seeds", *columns])
    body = "".join("<tr>" + f"<td>{e(r['label'])}</td><td>{r['runs']}</td>"
                   + "".join(f"<td>{e(_fmt(r[c], r[c + ':se']))}</td>" for c in columns) + "</tr>" for r in rows)
    imgs = "".join(f'<p><img src="{e(i)}" alt="{e(i)}" style="max-width:100%"></p>' for i in images)
    listing = "".join(f"<li>{e(str(r.path))} ({e(r.label)})</li>" for r in runs)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>"
            "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}</style></head><body>"
            f"<h1>{e(title)}</h1><p>Each cell: mean ± standard error over the runs of a row (seeds). "
            "Plots: mean over seeds, band ±1 standard error.</p>"
            f"<table><tr>{head}</tr>{body}</table>{imgs}<h2>Runs</h2><ul>{listing}</ul></body></html>\n")
