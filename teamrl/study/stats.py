"""Small statistics for reports: Student-t confidence intervals of a mean and of paired differences.

Pure functions on plain floats; the t quantile is SciPy's.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import scipy.stats


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` > 0 degrees of freedom (0 < p < 1), from SciPy.

    >>> round(t_quantile(0.975, 2), 6)  # (2p - 1) / sqrt(2p(1 - p)) for df = 2
    4.302653
    """
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    return float(scipy.stats.t.ppf(p, df))


@dataclass(frozen=True)
class Interval:
    """A mean with the half-width of its confidence interval over ``n`` values (nan when n < 2)."""

    mean: float
    half: float
    n: int

    @property
    def low(self) -> float:
        return self.mean - self.half

    @property
    def high(self) -> float:
        return self.mean + self.half


def finite(values: Iterable[float | None]) -> list[float]:
    """The values that are numbers and finite, as floats (None, nan and inf dropped)."""
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def mean_ci(values: Iterable[float | None], level: float = 0.95) -> Interval:
    """Mean of the finite values and the half-width of its ``level`` Student-t interval.

    half = t_{(1+level)/2, n-1} × s / √n with s the sample standard deviation; nan for fewer
    than two values (no interval), and the mean is nan for none.

    >>> mean_ci([1.0, 2.0, 3.0]).half == t_quantile(0.975, 2) / math.sqrt(3)
    True
    """
    vals = finite(values)
    if not vals:
        return Interval(math.nan, math.nan, 0)
    mean = statistics.fmean(vals)
    if len(vals) < 2:
        return Interval(mean, math.nan, len(vals))
    sd = statistics.stdev(vals)
    return Interval(mean, t_quantile((1.0 + level) / 2.0, len(vals) - 1) * sd / math.sqrt(len(vals)), len(vals))


@dataclass(frozen=True)
class Paired:
    """Differences ``treatment - baseline`` of the keys (seeds) present in both, and the keys of one side only."""

    diff: Interval
    keys: list[int]
    only_treatment: list[int]
    """Keys with a treatment value but no baseline value (no pair)."""
    only_baseline: list[int]
    """Keys with a baseline value but no treatment value."""


def paired_ci(treatment: Mapping[int, float], baseline: Mapping[int, float], level: float = 0.95) -> Paired:
    """Mean difference over keys present (with a finite value) on both sides, with its t interval.

    >>> p = paired_ci({0: 3.0, 1: 5.0, 2: 1.0}, {0: 1.0, 1: 2.0, 3: 0.0})
    >>> p.diff.mean, p.keys, p.only_treatment, p.only_baseline
    (2.5, [0, 1], [2], [3])
    """
    t = {k: v for k, v in treatment.items() if finite([v])}
    b = {k: v for k, v in baseline.items() if finite([v])}
    keys = sorted(set(t) & set(b))
    return Paired(mean_ci([t[k] - b[k] for k in keys], level), keys, sorted(set(t) - set(b)), sorted(set(b) - set(t)))


def format_interval(iv: Interval, digits: int = 3) -> str:
    """``mean ± half``; ``mean (n=1: no interval)`` for one value; ``n/a`` for none.

    >>> format_interval(Interval(0.5, 0.1, 3)), format_interval(Interval(0.25, math.nan, 1))
    ('0.500 ± 0.100', '0.250 (n=1: no interval)')
    """
    if iv.n == 0 or math.isnan(iv.mean):
        return "n/a"
    digits = digits if abs(iv.mean) < 100 else 0
    if iv.n < 2:
        return f"{iv.mean:.{digits}f} (n=1: no interval)"
    return f"{iv.mean:.{digits}f} ± {iv.half:.{digits}f}"


def format_difference(iv: Interval, digits: int = 3) -> str:
    """A signed mean difference with its interval: ``+0.100 [-0.050, +0.250]``.

    >>> format_difference(Interval(0.1, 0.15, 4)), format_difference(Interval(-2.0, math.nan, 1))
    ('+0.100 [-0.050, +0.250]', '-2.000 (n=1: no interval)')
    """
    if iv.n == 0 or math.isnan(iv.mean):
        return "n/a"
    digits = digits if abs(iv.mean) < 100 else 0
    if iv.n < 2:
        return f"{iv.mean:+.{digits}f} (n=1: no interval)"
    return f"{iv.mean:+.{digits}f} [{iv.low:+.{digits}f}, {iv.high:+.{digits}f}]"


def median(values: Sequence[float]) -> float:
    """Median of the finite values (nan for none)."""
    vals = finite(values)
    return statistics.median(vals) if vals else math.nan


def paired_t_power(n: int, effect: float, sd: float, level: float = 0.95) -> float:
    """Power of the two-sided paired t test over ``n`` pairs to detect a true mean difference ``effect`` when the
    differences have standard deviation ``sd``: P(|T| > t_crit) with T noncentral t (n − 1 df, noncentrality
    effect / sd × √n), from SciPy.

    >>> round(paired_t_power(34, 0.5, 1.0), 3)  # Cohen's d_z = 0.5 needs 34 pairs for 80%
    0.808
    """
    if n < 2:
        raise ValueError(f"paired_t_power needs n >= 2 pairs, got {n}")
    if not sd > 0:
        raise ValueError(f"paired_t_power needs sd > 0, got {sd}")
    df, nc = n - 1, abs(effect) / sd * math.sqrt(n)
    crit = t_quantile((1.0 + level) / 2.0, df)
    return float(scipy.stats.nct.sf(crit, df, nc) + scipy.stats.nct.cdf(-crit, df, nc))


def seeds_needed(effect: float, sd: float, power: float = 0.8, level: float = 0.95, limit: int = 100_000) -> int:
    """The fewest pairs (seeds run under both presets) for which the paired t test at ``level`` detects a true mean
    difference ``effect`` with probability ≥ ``power``, when the per-seed differences have standard deviation
    ``sd`` (estimated from a pilot grid). Raises when ``limit`` pairs do not suffice.

    >>> seeds_needed(0.5, 1.0)  # G*Power, paired t, d_z = 0.5, alpha 0.05, power 0.8: 34
    34
    """
    if not 0.0 < power < 1.0:
        raise ValueError(f"seeds_needed: power {power} must be in (0, 1)")
    if effect == 0:
        raise ValueError("seeds_needed: a zero effect cannot be detected; pass the smallest difference that matters")
    n = 2
    while paired_t_power(n, effect, sd, level) < power:
        n += 1
        if n > limit:
            raise ValueError(f"seeds_needed: more than {limit} pairs for effect {effect} with sd {sd}")
    return n
