"""Confidence intervals of the reports: hand-computed cases and properties."""

from __future__ import annotations

import math

import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from teamrl.study.stats import (
    Interval,
    format_difference,
    format_interval,
    mean_ci,
    paired_ci,
    t_quantile,
)

# 97.5% quantiles of Student's t (published tables, 10+ digits)
T975 = {1: 12.7062047362, 2: 4.3026527297, 3: 3.1824463053, 4: 2.7764451052, 5: 2.5705818366, 9: 2.2621571628,
        29: 2.0452296421, 1000: 1.9623390808}


@pytest.mark.parametrize("df", sorted(T975))
def test_t_quantile_matches_the_tables(df):
    assert t_quantile(0.975, df) == pytest.approx(T975[df], abs=1e-9)


def test_t_quantile_closed_forms():
    for p in (0.6, 0.9, 0.975, 0.999):
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)  # Cauchy
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-10)
    assert t_quantile(0.975, 1e9) == pytest.approx(1.959963984540, abs=1e-6)  # the normal's
    with pytest.raises(ValueError, match="0 < p < 1"):
        t_quantile(1.0, 3)


def test_interval_of_one_two_three_by_hand():
    iv = mean_ci([1.0, 2.0, 3.0])
    t = 0.95 / math.sqrt(2 * 0.975 * 0.025)  # t_{0.975, 2} = (2p - 1) / sqrt(2p(1 - p)) = 4.3027
    assert (iv.mean, iv.n) == (2.0, 3)
    assert iv.half == pytest.approx(t * 1.0 / math.sqrt(3), rel=1e-12)  # s = 1
    assert (iv.low, iv.high) == pytest.approx((2 - t / math.sqrt(3), 2 + t / math.sqrt(3)))


def test_interval_edge_cases():
    one = mean_ci([0.25])
    assert (one.mean, one.n) == (0.25, 1) and math.isnan(one.half)
    assert format_interval(one) == "0.250 (n=1: no interval)"
    assert mean_ci([math.nan, None, 2.0, 4.0]).n == 2  # missing values are left out
    none = mean_ci([])
    assert none.n == 0 and format_interval(none) == "n/a" and format_difference(none) == "n/a"
    assert format_interval(mean_ci([0.5, 0.5])) == "0.500 ± 0.000"


def test_paired_differences_by_hand():
    # seeds 0..2 of both, seed 3 only on the treatment side, seed 4 only on the baseline side, seed 5 nan
    p = paired_ci({0: 0.5, 1: 0.7, 2: 0.4, 3: 0.9, 5: math.nan}, {0: 0.3, 1: 0.4, 2: 0.4, 4: 0.1, 5: 0.2})
    assert p.keys == [0, 1, 2] and p.only_treatment == [3] and p.only_baseline == [4, 5]
    diffs = [0.2, 0.3, 0.0]
    mean = sum(diffs) / 3
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2)
    assert p.diff.mean == pytest.approx(mean) and p.diff.half == pytest.approx(T975[2] * sd / math.sqrt(3))
    assert format_difference(Interval(0.1, 0.15, 3)) == "+0.100 [-0.050, +0.250]"


values = st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=2, max_size=12)


@settings(max_examples=60, deadline=None)
@given(values, st.floats(-1e3, 1e3), st.floats(0.01, 100))
def test_interval_moves_with_shift_and_scale(xs, shift, scale):
    iv = mean_ci(xs)
    moved = mean_ci([scale * x + shift for x in xs])
    assert moved.mean == pytest.approx(scale * iv.mean + shift, rel=1e-9, abs=1e-6)
    assert moved.half == pytest.approx(scale * iv.half, rel=1e-6, abs=1e-6)
    assert iv.low <= iv.mean <= iv.high


@settings(max_examples=60, deadline=None)
@given(st.floats(0.51, 0.999), st.integers(1, 200))
def test_t_quantile_inverts_the_cdf_and_exceeds_the_normal(p, df):
    t = t_quantile(p, df)
    assert float(scipy.stats.t.cdf(t, df)) == pytest.approx(p, abs=1e-10)
    assert t_quantile(1 - p, df) == pytest.approx(-t)
    assert t >= t_quantile(p, df + 1) >= t_quantile(p, 1e9) - 1e-9  # heavier tails for fewer degrees of freedom


@settings(max_examples=60, deadline=None)
@given(values)
def test_a_paired_comparison_with_itself_is_zero(xs):
    p = paired_ci(dict(enumerate(xs)), dict(enumerate(xs)))
    assert p.diff.mean == 0 and p.diff.half == 0 and p.keys == list(range(len(xs)))


def test_paired_power_and_seeds_needed_by_hand():
    from teamrl.study.stats import paired_t_power, seeds_needed

    # the normal approximation n ≈ ((z_0.975 + z_0.8) / d)^2 = 31.4 for d = 0.5; the t test needs a few more pairs
    assert seeds_needed(0.5, 1.0) == 34 and seeds_needed(-0.5, 1.0) == 34
    assert paired_t_power(33, 0.5, 1.0) < 0.8 <= paired_t_power(34, 0.5, 1.0)
    # scale invariance: only effect / sd matters; a larger effect needs fewer seeds
    assert seeds_needed(0.05, 0.1) == 34 and seeds_needed(1.0, 1.0) < 34
    # no effect: the power is the test's size, 5%
    assert abs(paired_t_power(10, 0.0, 1.0) - 0.05) < 1e-9
    with pytest.raises(ValueError, match="zero effect"):
        seeds_needed(0.0, 1.0)
    with pytest.raises(ValueError, match="n >= 2"):
        paired_t_power(1, 0.5, 1.0)
    with pytest.raises(ValueError, match="sd > 0"):
        paired_t_power(5, 0.5, 0.0)
