"""Small statistics for reports: Student-t confidence intervals of a mean and of paired differences.

Pure functions on plain floats, with no dependency beyond the standard library (the t quantile is
computed from the regularized incomplete beta function).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b) for a, b > 0 and 0 <= x <= 1.

    >>> round(betainc(2.0, 3.0, 0.5), 12)  # 11/16
    0.6875
    """
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom.

    >>> t_cdf(0.0, 3.0), round(t_cdf(1.0, 1.0), 12)  # Cauchy: 1/2 + atan(1)/pi
    (0.5, 0.75)
    """
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` > 0 degrees of freedom (0 < p < 1).

    >>> round(t_quantile(0.975, 2), 6)  # (2p - 1) / sqrt(2p(1 - p)) for df = 2
    4.302653
    """
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):  # bisection to the resolution of a double
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return 0.5 * (lo + hi)


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
