"""The 2×2 estimator grid in a report: each factor's main effect and the interaction per seed, and how many
seeds a difference would need (used by :mod:`teamrl.study.report`)."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from teamrl.study.stats import Interval, format_difference, mean_ci, seeds_needed, t_quantile

if TYPE_CHECKING:
    from teamrl.study.runs import RunData


def _seeds(seeds: Sequence[int]) -> str:
    return ",".join(map(str, seeds))


def power_lines(paired: Sequence[dict[str, Any]], baseline: str, metric: str = "final_accuracy",
                effect: float = 0.05, power: float = 0.8) -> list[str]:
    """For each label with at least two pairs: how many seeds the paired t test would need to detect a true
    difference of ``effect`` in ``metric`` with probability ``power``, taking the standard deviation of the
    observed per-seed differences as the truth (:func:`teamrl.study.stats.seeds_needed`).

    >>> iv = Interval(0.01, t_quantile(0.975, 2) * 0.05 / math.sqrt(3), 3)  # 3 pairs, differences' sd 0.05
    >>> power_lines([{"label": "drmas", "final_accuracy": iv}], "grpo")[0]
    'drmas − grpo: the per-seed differences in final_accuracy have sd 0.050; detecting a true difference of 0.05 with 80% power (95% paired t test) needs 10 seeds'
    """
    out = []
    for r in paired:
        iv = r.get(metric)
        if not isinstance(iv, Interval) or iv.n < 2 or not math.isfinite(iv.half):
            continue
        sd = iv.half * math.sqrt(iv.n) / t_quantile(0.975, iv.n - 1)
        if sd <= 0:
            out.append(f"{r['label']} − {baseline}: the {iv.n} per-seed differences in {metric} are all equal "
                       f"({iv.mean:+.3f}); their spread, and the seeds a test would need, cannot be estimated")
            continue
        out.append(f"{r['label']} − {baseline}: the per-seed differences in {metric} have sd {sd:.3f}; detecting a "
                   f"true difference of {effect:g} with {power:.0%} power (95% paired t test) needs "
                   f"{seeds_needed(effect, sd, power)} seeds")
    return out


GRID = {"grpo": (0, 0), "grpo_step": (0, 1), "agent_episode": (1, 0), "drmas": (1, 1)}
"""The 2×2 grid: preset → (per-agent statistics, samples = LLM calls)."""
EFFECTS = ("per-agent statistics", "per-call counting", "interaction")


def grid_contrasts(cells: dict[str, float]) -> dict[str, float]:
    """The 2×2 factorial contrasts of one seed's four cells (``grpo``, ``grpo_step``, ``agent_episode``,
    ``drmas``): each factor's main effect (the mean of its two simple effects) and the interaction.

    >>> grid_contrasts({"grpo": 0.20, "grpo_step": 0.30, "agent_episode": 0.25, "drmas": 0.45})
    {'per-agent statistics': 0.1, 'per-call counting': 0.15, 'interaction': 0.1}
    """
    g, s, a, d = (cells[k] for k in GRID)
    return {"per-agent statistics": round(((a - g) + (d - s)) / 2, 12),
            "per-call counting": round(((s - g) + (d - a)) / 2, 12),
            "interaction": round((d - s) - (a - g), 12)}


def factorial_effects(runs: Sequence[RunData], columns: Sequence[str],
                      rows: dict[int, dict[str, float]]) -> tuple[list[dict[str, Any]], list[int]]:
    """The 2×2 effects over the seeds run under all four presets, from each run's table entries ``rows`` (keyed by
    ``id(run)``, as :func:`teamrl.study.report.run_rows` gives them): one row per effect (``effect`` and an
    :class:`~teamrl.study.stats.Interval` over seeds per column), and those seeds. Empty without the grid."""
    if not set(GRID) <= {r.label for r in runs}:
        return [], []
    by_seed: dict[int, dict[str, dict[str, float]]] = {}
    for r in runs:
        if r.label in GRID and r.seed is not None:
            by_seed.setdefault(r.seed, {})[r.label] = rows[id(r)]
    seeds = sorted(s for s, cells in by_seed.items() if set(cells) == set(GRID))
    out = []
    for effect in EFFECTS:
        entry: dict[str, Any] = {"effect": effect}
        for c in columns:
            vals = [grid_contrasts({k: by_seed[s][k][c] for k in GRID})[effect] for s in seeds]
            entry[c] = mean_ci(vals)
        out.append(entry)
    return out, seeds


def effects_markdown(columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> str:
    head = ["effect", *columns]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([r["effect"], *(format_difference(r[c]) for c in columns)]) + " |")
    return "\n".join(lines) + "\n"


EFFECTS_TEXT = ("Per seed run under all four presets: per-agent statistics = ((agent_episode − grpo) + (drmas − "
                "grpo_step)) / 2, per-call counting = ((grpo_step − grpo) + (drmas − agent_episode)) / 2, interaction "
                "= (drmas − grpo_step) − (agent_episode − grpo); each cell: mean over those seeds [95% t interval].")


def write_effects_csv(path: Path, columns: Sequence[str], rows: Sequence[dict[str, Any]], seeds: Sequence[int]) -> None:
    """One row per (effect, column): the seeds it is computed over, mean and 95% interval."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["effect", "metric", "seeds", "mean", "ci95_low", "ci95_high"])
        for r in rows:
            for c in columns:
                iv = r[c]
                lo, hi = ("", "") if math.isnan(iv.half) else (iv.low, iv.high)
                w.writerow([r["effect"], c, _seeds(seeds), "" if math.isnan(iv.mean) else iv.mean, lo, hi])
