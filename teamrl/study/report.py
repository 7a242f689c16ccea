"""Compare runs: tables (markdown + csv), PNG plots and one ``report.html``.

Runs are grouped by label: the run directory's name without a trailing ``_seed<k>`` (so
``drmas_seed0`` and ``drmas_seed1`` form the group ``drmas``), wherever the directories lie: runs
of one label from several folders (grids run on several machines) are more seeds of one group.
A run's seed is its config's ``train.seed`` (else the ``_seed<k>`` of its name); two runs of one
(label, seed) are one run given twice: the report keeps one (the finished one, else the one with
more logged steps, else the first given) and lists the other.

Each table cell is the mean over the group's runs ± the half-width of its 95% Student-t
confidence interval (n − 1 degrees of freedom; one run has no interval). The paired comparison
pairs each group's runs with the baseline group's runs of the same seed and gives the mean
difference with its 95% t interval. Plots draw the mean over the group at each step with a 95%
band. Definitions: ``docs/diagnostics.md``.
"""

from __future__ import annotations

import csv
import html
import math
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from teamrl.study.effects import EFFECTS_TEXT, effects_markdown, factorial_effects, power_lines, write_effects_csv
from teamrl.study.runs import RunData, agents_of, benchmark_scores, dedupe, held_out_scores, labels_of, load_run
from teamrl.study.stats import Interval, format_difference, format_interval, mean_ci, paired_ci


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error (sample std / √n; 0 for a single value) of the finite values.

    >>> mean_se([1.0, 2.0, 3.0])
    (2.0, 0.5773502691896258)
    """
    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return math.nan, math.nan
    return statistics.fmean(vals), (statistics.stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else 0.0)


def run_row(run: RunData, agents: Sequence[str], multi_call: Sequence[str] = (),
            benchmarks: Sequence[str] = (), held_out: Sequence[str] = (), mismatch: Sequence[str] = ()) -> dict[str, float]:
    """One run's table entries: final held-out accuracy and the held-out scores named in ``held_out``
    (:func:`held_out_scores`), the benchmark scores named in ``benchmarks``, grad-norm max/median and
    spikes per agent, the mean share of episodes in which an agent acted more than once (agents in
    ``multi_call``), the mean sampler-learner KL (k3) and largest importance ratio of each agent in
    ``mismatch`` (docs/off-policy.md), wall time."""
    after = run.summary.get("after", {})
    spikes = run.summary.get("grad_spikes", {}).get("agents", {})
    row = {"final_accuracy": after.get("accuracy", math.nan)}
    extra = held_out_scores(run)
    row |= {c: extra.get(c, math.nan) for c in held_out}
    scores = benchmark_scores(run)
    row |= {c: scores.get(c, math.nan) for c in benchmarks}
    for a in agents:
        norms = [m[f"agent/{a}/grad_norm"] for m in run.metrics if m.get(f"agent/{a}/grad_norm") is not None]
        row[f"grad_norm_max/{a}"] = max(norms) if norms else math.nan
        row[f"grad_norm_median/{a}"] = statistics.median(norms) if norms else math.nan
        last = run.metrics[-1].get(f"agent/{a}/grad_spikes", math.nan) if run.metrics else math.nan
        row[f"spikes/{a}"] = float(spikes.get(a, last))
    for a in multi_call:
        rates = [m[f"agent/{a}/multi_call_rate"] for m in run.metrics if m.get(f"agent/{a}/multi_call_rate") is not None]
        row[f"multi_call_rate/{a}"] = statistics.fmean(rates) if rates else math.nan
    for a in mismatch:
        kl = [m[f"mismatch/{a}/kl_k3"] for m in run.metrics if m.get(f"mismatch/{a}/kl_k3") is not None]
        ratio = [m[f"mismatch/{a}/ratio_max"] for m in run.metrics if m.get(f"mismatch/{a}/ratio_max") is not None]
        row[f"mismatch_kl_k3/{a}"] = statistics.fmean(kl) if kl else math.nan
        row[f"mismatch_ratio_max/{a}"] = max(ratio) if ratio else math.nan
    row["wall_s"] = sum(m.get("perf/step_s") or 0.0 for m in run.metrics)
    return row


def mismatch_agents(runs: Sequence[RunData]) -> list[str]:
    """The agents with a ``mismatch/<a>/kl_k3`` entry in some run, sorted (``mismatch/model/...`` is not an agent)."""
    return sorted({k.split("/")[1] for r in runs for m in r.metrics for k in m
                   if k.startswith("mismatch/") and k.endswith("/kl_k3") and k.count("/") == 2})


def run_rows(runs: Sequence[RunData]) -> tuple[list[str], dict[int, dict[str, float]]]:
    """Table columns and each run's entries (keyed by ``id(run)``)."""
    agents, multi = agents_of(runs), agents_of(runs, "multi_call_rate")
    benchmarks = list(dict.fromkeys(c for r in runs for c in benchmark_scores(r)))
    held_out = list(dict.fromkeys(c for r in runs for c in held_out_scores(r)))
    rows = {id(r): run_row(r, agents, multi, benchmarks, held_out, mismatch_agents(runs)) for r in runs}
    return (list(next(iter(rows.values())).keys()) if rows else []), rows


def comparison(runs: Sequence[RunData]) -> tuple[list[str], list[dict[str, Any]]]:
    """Columns and one row per label: ``label``, ``runs``, and for each column ``c`` its mean (``c``),
    standard error (``c:se``) and 95% t interval (``c:ci``, an :class:`~teamrl.study.stats.Interval`)."""
    columns, rows = run_rows(runs)
    out = []
    for label in labels_of(runs):
        mine = [rows[id(r)] for r in runs if r.label == label]
        entry: dict[str, Any] = {"label": label, "runs": len(mine)}
        for c in columns:
            entry[c], entry[c + ":se"] = mean_se([m[c] for m in mine])
            entry[c + ":ci"] = mean_ci([m[c] for m in mine])
        out.append(entry)
    return columns, out


def paired_comparison(runs: Sequence[RunData], baseline: str) -> tuple[list[str], list[dict[str, Any]]]:
    """Each label other than ``baseline`` against it, runs paired by seed: columns and one row per label with
    ``label``, ``pairs`` (the paired seeds), ``no_baseline`` (its seeds without a baseline run),
    ``baseline_only`` (baseline seeds without its run), ``no_seed`` (its runs without a seed) and for each
    column a :class:`~teamrl.study.stats.Interval` of the differences run − baseline."""
    columns, rows = run_rows(runs)
    base = {r.seed: rows[id(r)] for r in runs if r.label == baseline and r.seed is not None}
    out = []
    for label in labels_of(runs):
        if label == baseline:
            continue
        mine = {r.seed: rows[id(r)] for r in runs if r.label == label and r.seed is not None}
        entry: dict[str, Any] = {"label": label, "no_seed": sum(r.seed is None for r in runs if r.label == label),
                                 "pairs": sorted(set(mine) & set(base)), "no_baseline": sorted(set(mine) - set(base)),
                                 "baseline_only": sorted(set(base) - set(mine))}
        for c in columns:
            entry[c] = paired_ci({s: v[c] for s, v in mine.items()}, {s: v[c] for s, v in base.items()}).diff
        out.append(entry)
    return columns, out


def _cell(iv: Interval, runs: int) -> str:
    text = format_interval(iv)
    return text + (f" (n={iv.n})" if 0 < iv.n < runs and iv.n > 1 else "")


def table_markdown(columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> str:
    head = ["run", "seeds", *columns]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([r["label"], str(r["runs"]), *(_cell(r[c + ":ci"], r["runs"]) for c in columns)]) + " |")
    return "\n".join(lines) + "\n"


def _missing(entry: dict[str, Any], baseline: str) -> str:
    parts = []
    for seeds, what in ((entry["no_baseline"], baseline), (entry["baseline_only"], entry["label"])):
        if seeds:
            parts.append(f"no {what} run for seed{'s' if len(seeds) > 1 else ''} {_seeds(seeds)}")
    if entry["no_seed"]:
        parts.append(f"{entry['no_seed']} run(s) without a seed")
    return "; ".join(parts) or "none"


def _seeds(seeds: Sequence[int]) -> str:
    return ",".join(map(str, seeds))


def paired_markdown(columns: Sequence[str], rows: Sequence[dict[str, Any]], baseline: str) -> str:
    head = ["run", "pairs", "missing pairs", *columns]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([f"{r['label']} − {baseline}", str(len(r["pairs"])), _missing(r, baseline),
                                        *(format_difference(r[c]) for c in columns)]) + " |")
    return "\n".join(lines) + "\n"


def write_csv(path: Path, columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> None:
    """One row per label: each column's mean, standard error and 95% interval (empty for one run)."""
    def ci(iv: Interval) -> list[Any]:
        return ["", ""] if math.isnan(iv.half) else [iv.low, iv.high]

    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "seeds", *(x for c in columns for x in (c, c + "_se", c + "_ci95_low", c + "_ci95_high"))])
        for r in rows:
            w.writerow([r["label"], r["runs"], *(x for c in columns for x in (r[c], r[c + ":se"], *ci(r[c + ":ci"])))])


def write_paired_csv(path: Path, columns: Sequence[str], rows: Sequence[dict[str, Any]], baseline: str) -> None:
    """One row per (label, column): pairs, mean difference and its 95% interval, the seeds without a pair."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "baseline", "metric", "pairs", "mean_diff", "ci95_low", "ci95_high",
                    "seeds_without_baseline", "baseline_seeds_without_run"])
        for r in rows:
            for c in columns:
                iv = r[c]
                lo, hi = ("", "") if math.isnan(iv.half) else (iv.low, iv.high)
                w.writerow([r["label"], baseline, c, len(r["pairs"]), "" if math.isnan(iv.mean) else iv.mean, lo, hi,
                            _seeds(r["no_baseline"]), _seeds(r["baseline_only"])])


def curve(runs: Sequence[RunData], key: str) -> tuple[list[int], list[float], list[float]]:
    """Steps, mean over runs and the half-width of the 95% t interval (nan where fewer than two runs
    logged it) of metric ``key`` (steps where some run logged it)."""
    per_step: dict[int, list[float]] = {}
    for r in runs:
        for m in r.metrics:
            if m.get(key) is not None:
                per_step.setdefault(m["step"], []).append(m[key])
    steps = sorted(per_step)
    stats = [mean_ci(per_step[s]) for s in steps]
    return steps, [iv.mean for iv in stats], [iv.half for iv in stats]


def plot(runs: Sequence[RunData], panels: Sequence[tuple[str, str]], path: Path, ylabel: str) -> Path:
    """One panel per (title, metric key): a line per label (mean over its runs) with a 95% band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (title, key) in zip(axes[0], panels):
        for label in labels_of(runs):
            steps, mean, half = curve([r for r in runs if r.label == label], key)
            if not steps:
                continue
            line, = ax.plot(steps, mean, marker="o" if len(steps) < 30 else None, label=label)
            ax.fill_between(steps, [m - h for m, h in zip(mean, half)], [m + h for m, h in zip(mean, half)],
                            color=line.get_color(), alpha=0.2)  # nan where one run: no band there
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


def eval_panels(runs: Sequence[RunData]) -> list[tuple[str, str]]:
    """The held-out curves to draw: ``eval/accuracy`` and the pass@k of the largest k logged.

    >>> r = RunData(Path("x"), "x", {}, [{"step": 0, "eval/accuracy": 0.1, "eval/pass@2": 0.2, "eval/pass@10": 0.3}], {})
    >>> eval_panels([r])
    [('held-out accuracy (avg@n)', 'eval/accuracy'), ('held-out pass@10', 'eval/pass@10')]
    """
    keys = {k for r in runs for m in r.metrics for k in m if k.startswith("eval/")}
    if "eval/accuracy" not in keys:
        return []
    passes = [k for k in keys if re.fullmatch(r"eval/pass@\d+( \(.*\))?", k)]
    panels = [("held-out accuracy (avg@n)", "eval/accuracy")]
    if passes:
        best = max(passes, key=lambda k: int(k.split("@")[1].split()[0]))
        panels.append((f"held-out {best.removeprefix('eval/')}", best))
    return panels


def write_report(run_dirs: Sequence[str | Path], out: str | Path, title: str = "teamrl report",
                 baseline: str = "grpo", require_baseline: bool = False) -> Path:
    """Write comparison.md, comparison.csv, paired.csv, the PNG plots and report.html to ``out``.

    ``baseline``: the label every other label is compared with, paired by seed; when no run has it
    the paired comparison is left out with a note, or, with ``require_baseline``, it is an error.
    """
    loaded = [load_run(p) for p in run_dirs]
    if not loaded:
        raise ValueError("no runs to report on; pass one or more run directories")
    runs, duplicates = dedupe(loaded)
    labels = labels_of(runs)
    if require_baseline and baseline not in labels:
        raise ValueError(f"--baseline {baseline!r}: no run is labelled so (labels: {', '.join(labels)}); "
                         f"pass one of them")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    columns, rows = comparison(runs)
    notes = [f"duplicate (label, seed) ({d.label}, {d.seed}): {d.path} left out, {k.path} kept" for d, k in duplicates]
    md = [f"# {title}\n", ("Each cell: mean ± half-width of the 95% confidence interval over seeds (Student t); "
                           "one seed has no interval.\n"), table_markdown(columns, rows)]
    paired: list[dict[str, Any]] = []
    if baseline in labels and len(labels) > 1:
        _, paired = paired_comparison(runs, baseline)
        md += [f"## Paired differences against {baseline}\n",
               f"Runs paired by seed; each cell: mean of (run − {baseline}) over the pairs [95% t interval].\n",
               paired_markdown(columns, paired, baseline)]
        write_paired_csv(out / "paired.csv", columns, paired, baseline)
        notes += power_lines(paired, baseline)  # under Notes, in comparison.md and report.html
    elif baseline not in labels:
        notes.append(f"no paired comparison: no run is labelled {baseline!r} (labels: {', '.join(labels)}); "
                     f"choose another with --baseline")
    effects, effect_seeds = factorial_effects(runs, *run_rows(runs))
    effects_title = f"The 2×2 grid: main effects and interaction ({len(effect_seeds)} seeds: {_seeds(effect_seeds)})"
    if effects:
        md += [f"## {effects_title}\n", EFFECTS_TEXT + "\n", effects_markdown(columns, effects)]
        write_effects_csv(out / "effects.csv", columns, effects, effect_seeds)
    if notes:
        md += ["## Notes\n", "".join(f"- {n}\n" for n in notes)]
    (out / "comparison.md").write_text("\n".join(md))
    write_csv(out / "comparison.csv", columns, rows)
    agents = agents_of(runs)
    figures = [plot(runs, [("reward (rollout mean)", "rollout/reward_mean")], out / "reward.png", "reward")]
    if eval_panels(runs):
        figures.append(plot(runs, eval_panels(runs), out / "eval.png", "held-out score"))
    if agents:
        figures.append(plot(runs, [(f"{a}: gradient norm", f"agent/{a}/grad_norm") for a in agents],
                            out / "grad_norm.png", "gradient norm"))
        figures.append(plot(runs, [(f"{a}: amplification factor", f"agent/{a}/amplification") for a in agents],
                            out / "amplification.png", "(σ_k² + (μ_k − μ)²) / σ²"))
    mismatch = mismatch_agents(runs)
    if mismatch:
        figures.append(plot(runs, [(f"{a}: KL(sampler ‖ learner), k3", f"mismatch/{a}/kl_k3") for a in mismatch],
                            out / "mismatch.png", "KL per token (k3)"))
    multi = agents_of(runs, "multi_call_rate")
    if multi:
        figures.append(plot(runs, [(f"{a}: episodes with > 1 call", f"agent/{a}/multi_call_rate") for a in multi],
                            out / "multi_call.png", "share of episodes"))
    (out / "report.html").write_text(_html(title, columns, rows, paired, baseline, notes,
                                           [f.name for f in figures], runs, effects=effects,
                                           effects_title=effects_title))
    return out / "report.html"


def _html(title: str, columns: Sequence[str], rows: Sequence[dict[str, Any]], paired: Sequence[dict[str, Any]],
          baseline: str, notes: Sequence[str], images: Sequence[str], runs: Sequence[RunData], *,
          effects: Sequence[dict[str, Any]] = (), effects_title: str = "") -> str:
    e = html.escape
    head = "".join(f"<th>{e(c)}</th>" for c in ["run", "seeds", *columns])
    body = "".join("<tr>" + f"<td>{e(r['label'])}</td><td>{r['runs']}</td>"
                   + "".join(f"<td>{e(_cell(r[c + ':ci'], r['runs']))}</td>" for c in columns) + "</tr>" for r in rows)
    table = f"<table><tr>{head}</tr>{body}</table>"
    if paired:
        phead = "".join(f"<th>{e(c)}</th>" for c in ["run", "pairs", "missing pairs", *columns])
        pbody = "".join("<tr>" + f"<td>{e(r['label'])} − {e(baseline)}</td><td>{len(r['pairs'])}</td>"
                        f"<td>{e(_missing(r, baseline))}</td>"
                        + "".join(f"<td>{e(format_difference(r[c]))}</td>" for c in columns) + "</tr>" for r in paired)
        table += (f"<h2>Paired differences against {e(baseline)}</h2><p>Runs paired by seed; each cell: mean of "
                  f"(run − {e(baseline)}) over the pairs [95% t interval].</p><table><tr>{phead}</tr>{pbody}</table>")
    if effects:
        ehead = "".join(f"<th>{e(c)}</th>" for c in ["effect", *columns])
        ebody = "".join("<tr>" + f"<td>{e(r['effect'])}</td>"
                        + "".join(f"<td>{e(format_difference(r[c]))}</td>" for c in columns) + "</tr>" for r in effects)
        table += (f"<h2>{e(effects_title)}</h2><p>{e(EFFECTS_TEXT)}</p><table><tr>{ehead}</tr>{ebody}</table>")
    if notes:
        table += "<h2>Notes</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>"
    imgs = "".join(f'<p><img src="{e(i)}" alt="{e(i)}" style="max-width:100%"></p>' for i in images)
    listing = "".join(f"<li>{e(str(r.path))} ({e(r.label)}, seed {r.seed if r.seed is not None else '?'}, "
                      f"{'finished' if r.finished else 'unfinished'}, {r.trained_steps} steps trained)</li>" for r in runs)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>"
            "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}</style></head><body>"
            f"<h1>{e(title)}</h1><p>Each cell: mean ± half-width of the 95% confidence interval over the runs of a "
            "row (seeds; Student t, n − 1 degrees of freedom); one run has no interval. "
            "Plots: mean over seeds, band: 95% t interval.</p>"
            f"{table}{imgs}<h2>Runs</h2><ul>{listing}</ul></body></html>\n")
