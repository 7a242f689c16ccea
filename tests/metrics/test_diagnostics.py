"""Diagnostics checked against hand-computed values (definitions: docs/diagnostics.md)."""

from __future__ import annotations

import math

import pytest

from teamrl.metrics.diagnostics import SpikeCounter, amplification_factors, eval_scores, pass_at_k


def test_amplification_factor_by_hand():
    # group 0: rows A=1, A=1, B=0, B=0, B=1 -> mu = 3/5, sigma^2 = 6/25
    #   A: sigma_A^2 = 0, mu_A = 1 -> (0 + (2/5)^2) / (6/25) = 2/3
    #   B: mu_B = 1/3, sigma_B^2 = 2/9 -> (2/9 + (4/15)^2) / (6/25) = (50/225 + 16/225) * 25/6 = 11/9
    # group 1: rows all 1 -> sigma^2 = 0, left out
    # group 2: A=1, B=0 -> mu = 1/2, sigma^2 = 1/4; A: (0 + 1/4)/(1/4) = 1; B: 1
    rewards = [1, 1, 0, 0, 1, 1, 1, 1, 0]
    groups = [0, 0, 0, 0, 0, 1, 1, 2, 2]
    agents = ["A", "A", "B", "B", "B", "A", "B", "A", "B"]
    f = amplification_factors(rewards, groups, agents)
    assert f["A"] == pytest.approx((2 / 3 + 1) / 2)
    assert f["B"] == pytest.approx((11 / 9 + 1) / 2)


def test_amplification_factors_average_to_one_weighted_by_row_share():
    # law of total variance: sum_k n_k/n * F_k,g = 1 in every group
    rewards = [0.3, 1.0, 0.0, 0.7, 0.2, 0.9, 0.4]
    agents = ["A", "B", "C", "A", "B", "B", "C"]
    f = amplification_factors(rewards, [0] * 7, agents)
    assert sum(agents.count(a) / 7 * f[a] for a in f) == pytest.approx(1.0)


def test_amplification_is_one_when_agents_are_identically_distributed():
    f = amplification_factors([1, 1, 0, 0], [0, 0, 0, 0], ["A", "B", "A", "B"])
    assert f == {"A": pytest.approx(1.0), "B": pytest.approx(1.0)}
    assert amplification_factors([1, 1], [0, 0], ["A", "B"]) == {}  # no group with sigma^2 > 0


def test_pass_at_k_unbiased_estimator_by_hand():
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 2, 1) == pytest.approx(2 / 5)
    assert pass_at_k(5, 2, 4) == 1.0  # fewer than 4 wrong samples: every draw of 4 has a correct one
    assert pass_at_k(4, 0, 3) == 0.0
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(2, 1, 3)


def test_eval_scores_with_more_samples_than_k():
    # problem 1: 1 of 4 correct; problem 2: 2 of 4 correct
    s = eval_scores([[1, 0, 0, 0], [0, 1, 0, 1]])
    assert s["accuracy"] == pytest.approx(3 / 8)
    assert s["pass@1"] == pytest.approx((1 / 4 + 2 / 4) / 2)
    assert s["pass@2"] == pytest.approx(((1 - 3 / 6) + (1 - 1 / 6)) / 2)
    assert s["pass@4"] == 1.0
    # n == k: the estimator is "any correct"
    assert eval_scores([[0, 0], [0, 1]])["pass@2"] == 0.5


def test_spike_counter_uses_the_median_of_the_window():
    sc = SpikeCounter(factor=3.0, window=3, min_history=3)
    seen = [sc.observe("agent/a/grad_norm", v) for v in (1.0, 1.0, 100.0, 1.0, 1.0, 2.0, 3.1, 9.0, 0.0, math.nan)]
    # 100.0 has only 2 earlier values, so it is not judged (but enters the window);
    # 3.1: window (1, 1, 2) -> median 1, 3.1 > 3; 9.0: window (1, 2, 3.1) -> median 2, 9 > 6;
    # zero and NaN are ignored
    assert seen == [False, False, False, False, False, False, True, True, False, False]
    assert sc.counts == {"agent/a/grad_norm": 2}
    assert sc.history["agent/a/grad_norm"] == [2.0, 3.1, 9.0]


def test_spike_counter_metrics_summary_and_state():
    sc = SpikeCounter(factor=2.0, window=5, min_history=1)
    sc.metrics({"agent/a/grad_norm": 1.0, "loss/main/grad_norm": 1.0, "agent/a/reward_mean": 5.0})
    m = sc.metrics({"agent/a/grad_norm": 3.0, "loss/main/grad_norm": 1.5})
    assert m == {"agent/a/grad_spike": 1.0, "agent/a/grad_spikes": 1.0,
                 "loss/main/grad_spike": 0.0, "loss/main/grad_spikes": 0.0}
    assert sc.summary() == {"agents": {"a": 1}, "models": {"main": 0}}
    other = SpikeCounter(factor=2.0, window=5, min_history=1)
    other.load_state_dict(sc.state_dict())
    assert other.observe("agent/a/grad_norm", 10.0) and other.counts["agent/a/grad_norm"] == 2
    with pytest.raises(ValueError, match="factor"):
        SpikeCounter(factor=1.0)


def test_amplification_factors_are_scale_free_up_to_the_float_maximum() -> None:
    # Hand values for [1, -1, 1, 1] (a: rows 0, 2; b: rows 1, 3): mu = 0.5, var = (0.25 + 2.25 + 0.25 + 0.25) / 4
    # = 0.75; F_a = 0.25 / 0.75 = 1/3, F_b = (2.25 + 0.25) / 2 / 0.75 = 5/3. Scaling by 1e308 changes nothing
    # (the old code raised OverflowError in fmean).
    agents = ["a", "b", "a", "b"]
    for scale in (1.0, 1e6, 1e300, 1.7e308):
        got = amplification_factors([scale, -scale, scale, scale], [0, 0, 0, 0], agents)
        assert got == pytest.approx({"a": 1 / 3, "b": 5 / 3}, rel=1e-12), scale
    mixed = amplification_factors([1e308, -1e308, 1e-300, 0.0, 1.0, 2.0], [0, 0, 1, 1, 2, 2], ["a", "b"] * 3)
    assert mixed == pytest.approx({"a": 1.0, "b": 1.0})  # two rows per group: each row's deviation is sigma


def test_amplification_factors_leave_out_groups_with_non_finite_rewards() -> None:
    got = amplification_factors([math.nan, 1.0, math.inf, 0.0, 1.0, 0.0], [0, 0, 1, 1, 2, 2], ["a", "b"] * 3)
    assert got == {"a": 1.0, "b": 1.0}  # only group 2 counts
