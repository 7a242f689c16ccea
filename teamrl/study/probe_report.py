"""The report of ``teamrl probe``: paired intervals, the 2×2 effects and measured vs predicted amplification.

Every comparison is paired by (seed, batch): the presets' gradients of one sample were computed on
the same rows at the same model state. Squared gradient norms are compared on the log scale, so
an effect of ``x`` reads as a factor ``exp(x)`` and a 10% difference is ``log 1.1 ≈ 0.095``.

* ratios: per agent and preset, ``exp(mean log(‖g_preset‖² / ‖g_baseline‖²))`` with its 95% t
  interval over samples; "resolves 10%" when the interval's half-width is below ``log 1.1``.
* 2×2 effects (:func:`teamrl.study.effects.grid_contrasts` on ``log ‖g‖²``): per-agent statistics,
  per-call counting and their interaction. Their two main effects add up exactly to
  ``log ‖g_drmas‖² − log ‖g_grpo‖²``, which splits the grpo → drmas difference between the two
  mechanisms.
* amplification (Lemma 4.2): measured ``‖g_grpo_step,k‖² / ‖g_drmas,k‖²`` against the predicted
  ``F_k = (σ_k² + (μ_k − μ)²) / σ²``; least-squares slope of log measured on log predicted with a
  bootstrap interval over samples (1 = the second moment grows as the lemma says).
* sweep (Proposition 4.3): the traced agent's measured amplification per reward transform and preset,
  and its log-log slope on the predicted ``F_k`` over all transforms (bootstrap over batches).

Left out: anything that needs the gradients themselves (the rows hold norms and cosines only).
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from teamrl.study.effects import EFFECTS, GRID, grid_contrasts
from teamrl.study.stats import Interval, mean_ci

TEN_PERCENT = math.log(1.1)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The JSON rows of a probe file (none when it is missing or empty)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def log_sq(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[tuple[int, int], float]]:
    """``(agent, preset) -> {(seed, batch): log ‖g‖²}``; zero norms are left out."""
    out: dict[tuple[str, str], dict[tuple[int, int], float]] = {}
    for r in rows:
        if r["grad_sq"] > 0:
            out.setdefault((r["agent"], r["preset"]), {})[(r["seed"], r["batch"])] = math.log(r["grad_sq"])
    return out


def paired_log_ratio(a: dict[tuple[int, int], float], b: dict[tuple[int, int], float]) -> Interval:
    """Mean of ``a − b`` over the samples present in both, with its 95% t interval.

    >>> paired_log_ratio({(0, 0): 1.0, (0, 1): 2.0}, {(0, 0): 0.5, (0, 1): 1.5, (1, 0): 9.0}).mean
    0.5
    """
    keys = sorted(set(a) & set(b))
    return mean_ci([a[k] - b[k] for k in keys])


def ratio_rows(rows: Sequence[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """Per agent and preset other than ``baseline``: the paired log ratio of squared norms."""
    ls = log_sq(rows)
    agents = sorted({r["agent"] for r in rows})
    presets = list(dict.fromkeys(r["preset"] for r in rows))
    out = []
    for agent in agents:
        for p in presets:
            if p == baseline or (agent, p) not in ls or (agent, baseline) not in ls:
                continue
            iv = paired_log_ratio(ls[(agent, p)], ls[(agent, baseline)])
            out.append({"agent": agent, "preset": p, "log_ratio": iv,
                        "resolves_10pct": bool(iv.n >= 2 and iv.half < TEN_PERCENT)})
    return out


def effect_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per agent with all four grid presets: each 2×2 effect on ``log ‖g‖²`` over the samples, and the
    share of ``drmas − grpo`` each main effect accounts for."""
    ls = log_sq(rows)
    out = []
    for agent in sorted({r["agent"] for r in rows}):
        if not all((agent, p) in ls for p in GRID):
            continue
        keys = sorted(set.intersection(*(set(ls[(agent, p)]) for p in GRID)))
        contrasts = [grid_contrasts({p: ls[(agent, p)][k] for p in GRID}) for k in keys]
        entry: dict[str, Any] = {"agent": agent, "samples": len(keys)}
        for e in EFFECTS:
            entry[e] = mean_ci([c[e] for c in contrasts])
        total = entry["per-agent statistics"].mean + entry["per-call counting"].mean  # = drmas − grpo
        entry["drmas_minus_grpo"] = mean_ci([ls[(agent, "drmas")][k] - ls[(agent, "grpo")][k] for k in keys])
        for e in EFFECTS[:2]:
            entry[f"share {e}"] = entry[e].mean / total if total != 0 else math.nan
        out.append(entry)
    return out


def fit_slope(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = intercept + slope · x``; returns (slope, intercept).

    >>> fit_slope([0.0, 1.0, 2.0], [1.0, 3.0, 5.0])
    (2.0, 1.0)
    """
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return math.nan, math.nan
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return slope, my - slope * mx


def amplification_points(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per sample and agent: predicted ``F_k`` and measured ``‖g_grpo_step‖² / ‖g_drmas‖²``."""
    sq = {(r["agent"], r["preset"], r["seed"], r["batch"]): r for r in rows}
    out = []
    for (agent, preset, seed, batch), r in sq.items():
        d = sq.get((agent, "drmas", seed, batch))
        if preset != "grpo_step" or d is None or not d["grad_sq"] > 0 or not r["grad_sq"] > 0:
            continue
        if not (r["F_pred"] and math.isfinite(r["F_pred"]) and r["F_pred"] > 0):
            continue
        out.append({"agent": agent, "seed": seed, "batch": batch, "predicted": r["F_pred"],
                    "measured": r["grad_sq"] / d["grad_sq"]})
    return out


def slope_interval(points: Sequence[dict[str, Any]], *, reps: int = 2000, seed: int = 0,
                   by_batch: bool = False) -> dict[str, float]:
    """Log-log slope of measured on predicted amplification, with a 95% bootstrap interval.

    The bootstrap resamples points, or with ``by_batch`` whole (seed, batch) samples: the sweep's
    transforms of one batch share its rows, so they are resampled together.
    """
    xs = [math.log(p["predicted"]) for p in points]
    ys = [math.log(p["measured"]) for p in points]
    if len(points) < 3:
        return {"slope": math.nan, "intercept": math.nan, "low": math.nan, "high": math.nan, "n": len(points)}
    slope, intercept = fit_slope(xs, ys)
    if by_batch:
        groups: dict[tuple[Any, Any], list[int]] = {}
        for i, p in enumerate(points):
            groups.setdefault((p.get("seed"), p.get("batch")), []).append(i)
        clusters = list(groups.values())
    else:
        clusters = [[i] for i in range(len(points))]
    rng = random.Random(seed)
    boot = []
    for _ in range(reps):
        idx = [i for _ in clusters for i in clusters[rng.randrange(len(clusters))]]
        s, _ = fit_slope([xs[i] for i in idx], [ys[i] for i in idx])
        if math.isfinite(s):
            boot.append(s)
    boot.sort()
    low, high = (boot[int(0.025 * len(boot))], boot[int(0.975 * len(boot)) - 1]) if boot else (math.nan, math.nan)
    return {"slope": slope, "intercept": intercept, "low": low, "high": high, "n": len(points)}


def sweep_slopes(sweep: Sequence[dict[str, Any]], *, reps: int = 2000) -> list[dict[str, Any]]:
    """Per (agent, preset) whose predicted amplification varies over the sweep: the log-log slope of
    measured on predicted over every (batch, transform) point, bootstrapped by batch.
    Proposition 4.3's "at least linear growth" reads as a slope of at least 1."""
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in sweep:
        if r.get("measured") and r["measured"] > 0 and r.get("predicted") and r["predicted"] > 0:
            cells.setdefault((r["agent"], r["preset"]), []).append(r)
    out = []
    for (agent, preset), rs in sorted(cells.items()):
        xs = [math.log(r["predicted"]) for r in rs]
        if max(xs) - min(xs) < 1e-9:
            continue
        out.append({"agent": agent, "preset": preset,
                    "predicted_min": math.exp(min(xs)), "predicted_max": math.exp(max(xs)),
                    **slope_interval(rs, reps=reps, by_batch=True)})
    return out


def sweep_table(sweep: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (agent, preset, scale, shift): mean predicted and the geometric mean of measured amplification."""
    cells: dict[tuple[str, str, float, float], list[dict[str, Any]]] = {}
    for r in sweep:
        cells.setdefault((r["agent"], r["preset"], r["scale"], r["shift"]), []).append(r)
    out = []
    for (agent, preset, scale, shift), rs in sorted(cells.items()):
        logs = mean_ci([math.log(r["measured"]) for r in rs if r["measured"] and r["measured"] > 0])
        out.append({"agent": agent, "preset": preset, "scale": scale, "shift": shift, "samples": len(rs),
                    "predicted": statistics.fmean(r["predicted"] for r in rs), "log_measured": logs})
    return out


def _factor(iv: Interval) -> str:
    if iv.n == 0 or math.isnan(iv.mean):
        return "n/a"
    if iv.n < 2 or math.isnan(iv.half):
        return f"×{math.exp(iv.mean):.3f} (n={iv.n})"
    return f"×{math.exp(iv.mean):.3f} [{math.exp(iv.low):.3f}, {math.exp(iv.high):.3f}] (n={iv.n})"


def _plot(points: Sequence[dict[str, Any]], fit: dict[str, float], table: Sequence[dict[str, Any]], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    if points:
        fig, ax = plt.subplots(figsize=(5, 4.2))
        for agent in sorted({p["agent"] for p in points}):
            mine = [p for p in points if p["agent"] == agent]
            ax.scatter([p["predicted"] for p in mine], [p["measured"] for p in mine], s=14, label=agent)
        lo = min(min(p["predicted"], p["measured"]) for p in points)
        hi = max(max(p["predicted"], p["measured"]) for p in points)
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="measured = predicted")
        if math.isfinite(fit["slope"]):
            xs = [lo, hi]
            ax.plot(xs, [math.exp(fit["intercept"]) * x ** fit["slope"] for x in xs], "r-", lw=1,
                    label=f"fit: slope {fit['slope']:.2f} [{fit['low']:.2f}, {fit['high']:.2f}]")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("predicted F_k (Lemma 4.2)")
        ax.set_ylabel("measured ‖g grpo_step‖² / ‖g drmas‖²")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "amplification.png", dpi=120)
        plt.close(fig)
        made.append("amplification.png")
    if table:
        fig, ax = plt.subplots(figsize=(5, 4.2))
        for preset in sorted({r["preset"] for r in table}):
            mine = sorted((r for r in table if r["preset"] == preset), key=lambda r: r["predicted"] if preset != "drmas"
                          else r["shift"] + 10 * r["scale"])
            f_of = {(r["scale"], r["shift"]): r["predicted"] for r in table if r["preset"] != "drmas"}
            xs = [f_of.get((r["scale"], r["shift"]), r["predicted"]) for r in mine]
            ax.plot(xs, [math.exp(r["log_measured"].mean) for r in mine], "o-", label=preset)
        ax.set_xlabel("F_k of the transformed rewards")
        ax.set_ylabel("‖g_k‖² / ‖g_k drmas, untransformed‖²")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "sweep.png", dpi=120)
        plt.close(fig)
        made.append("sweep.png")
    return made


def write_probe_report(out: str | Path, baseline: str = "grpo") -> Path:
    """Write ``probe_report.md`` (and its plots) from the rows in ``out``; returns its path."""
    out = Path(out)
    rows, sweep = read_rows(out / "probe_rows.jsonl"), read_rows(out / "sweep_rows.jsonl")
    meta = json.loads((out / "probe.json").read_text()) if (out / "probe.json").is_file() else {}
    presets = list(dict.fromkeys(r["preset"] for r in rows))
    base = baseline if baseline in presets else (presets[0] if presets else baseline)
    lines = ["# teamrl probe", ""]
    if meta:
        lines += [f"config `{meta.get('config')}` {' '.join(meta.get('overrides', []))}; presets "
                  f"{', '.join(meta['presets'])}; {meta['batches']} batches × seeds {meta['seeds']}; model state: "
                  f"{meta.get('checkpoint') or 'untrained'}; {meta['seconds']:.0f} s", ""]
    lines += [f"## Squared gradient norm per agent, relative to {base} (paired by batch)", "",
              "| agent | preset | factor [95% CI] | resolves 10% |", "| --- | --- | --- | --- |"]
    for r in ratio_rows(rows, base):
        lines.append(f"| {r['agent']} | {r['preset']} | {_factor(r['log_ratio'])} | {'yes' if r['resolves_10pct'] else 'no'} |")
    effects = effect_rows(rows)
    if effects:
        lines += ["", "## 2×2 effects on log ‖g_k‖² (factors, 95% CI over batches)", "",
                  "| agent | batches | per-agent statistics | per-call counting | interaction | drmas / grpo | "
                  "share: statistics | share: counting |", "|" + " --- |" * 8]
        for e in effects:
            lines.append(f"| {e['agent']} | {e['samples']} | " + " | ".join(_factor(e[k]) for k in EFFECTS)
                         + f" | {_factor(e['drmas_minus_grpo'])} | {e['share per-agent statistics']:.2f} | "
                           f"{e['share per-call counting']:.2f} |")
    points = amplification_points(rows)
    fit = slope_interval(points)
    if points:
        lines += ["", "## Lemma 4.2: measured vs predicted amplification", "",
                  f"{fit['n']} (batch, agent) points; log-log slope {fit['slope']:.3f} "
                  f"[{fit['low']:.3f}, {fit['high']:.3f}] (95% bootstrap), intercept {fit['intercept']:.3f}."]
        for agent in sorted({p["agent"] for p in points}):
            mine = [p for p in points if p["agent"] == agent]
            lines.append(f"- {agent}: predicted F_k mean {statistics.fmean(p['predicted'] for p in mine):.3f}, "
                         f"measured mean {statistics.fmean(p['measured'] for p in mine):.3f} ({len(mine)} batches)")
    table = sweep_table(sweep)
    if table:
        lines += ["", "## Heterogeneity sweep (Proposition 4.3)", "",
                  "| agent | preset | scale | shift | predicted | measured [95% CI] |", "|" + " --- |" * 6]
        for r in table:
            lines.append(f"| {r['agent']} | {r['preset']} | {r['scale']:g} | {r['shift']:g} | {r['predicted']:.3f} | "
                         f"{_factor(r['log_measured'])} |")
        for f in sweep_slopes(sweep):
            lines += ["", f"{f['agent']} under {f['preset']}: predicted F_k from {f['predicted_min']:.3f} to "
                          f"{f['predicted_max']:.3f}; log-log slope of measured on predicted over {f['n']} points "
                          f"{f['slope']:.3f} [{f['low']:.3f}, {f['high']:.3f}] (95% bootstrap over batches; "
                          "at least linear growth is a slope of at least 1)."]
    for name in _plot(points, fit, table, out):
        lines += ["", f"![{name}]({name})"]
    path = out / "probe_report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
