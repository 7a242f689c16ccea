from __future__ import annotations

import math

import pytest
import torch

from teamrl.algos.correction import MODES, correction_weights, merge_sums, mismatch_means, mismatch_sums, parse_mode

# One reply of three tokens: learner probs 0.5, 0.9, 0.1 against sampler probs 0.2, 0.6, 0.4
#   rho = 0.5/0.2 = 2.5, 0.9/0.6 = 1.5, 0.1/0.4 = 0.25
LEARNER = torch.log(torch.tensor([[0.5, 0.9, 0.1]]))
SAMPLER = torch.log(torch.tensor([[0.2, 0.6, 0.4]]))
ONES = torch.ones(1, 3)
# geometric mean over the reply: (2.5 * 1.5 * 0.25) ** (1/3) = 0.9375 ** (1/3) = 0.978717...
GEO = 0.9375 ** (1 / 3)


def approx(x: float):
    """Inputs are float32 log-probs: agreement to 1e-5 relative."""
    return pytest.approx(x, rel=1e-5, abs=1e-7)


def test_token_tis_truncates_above_the_threshold():
    w, keep = correction_weights(LEARNER, SAMPLER, ONES, "token-tis", threshold=2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.5, 0.25]]))  # min(2.5, 2) = 2
    assert keep.all()


def test_token_mis_masks_outside_the_range():
    w, keep = correction_weights(LEARNER, SAMPLER, ONES, "token-mis", threshold=2.0)  # range [1/2, 2]
    torch.testing.assert_close(w, torch.tensor([[0.0, 1.5, 0.0]]))  # 2.5 > 2 and 0.25 < 0.5 are dropped
    assert keep.tolist() == [[False, True, False]]
    w, keep = correction_weights(LEARNER, SAMPLER, ONES, "token-mis", threshold=3.0, lower=0.2)  # [0.2, 3]: all in
    torch.testing.assert_close(w, torch.tensor([[2.5, 1.5, 0.25]]))
    assert keep.all()


def test_sequence_modes_use_the_geometric_mean():
    w, keep = correction_weights(LEARNER, SAMPLER, ONES, "seq-tis", threshold=2.0)
    torch.testing.assert_close(w, torch.full((1, 3), GEO))
    w, keep = correction_weights(LEARNER, SAMPLER, ONES, "seq-mis", threshold=2.0)  # 0.9787 in [0.5, 2]
    torch.testing.assert_close(w, torch.full((1, 3), GEO))
    assert keep.all()
    # a reply with rho = 3, 3 has geometric mean 3 > 2: seq-tis gives 2 everywhere, seq-mis drops the reply
    lp, sp = torch.log(torch.tensor([[0.9, 0.9]])), torch.log(torch.tensor([[0.3, 0.3]]))
    torch.testing.assert_close(correction_weights(lp, sp, torch.ones(1, 2), "seq-tis")[0], torch.full((1, 2), 2.0))
    w, keep = correction_weights(lp, sp, torch.ones(1, 2), "seq-mis")
    assert not keep.any() and not w.any()


def test_padding_is_ignored_and_gets_weight_zero():
    lp = torch.tensor([[math.log(0.5), -float("inf")]])  # padding may hold anything
    sp = torch.tensor([[math.log(0.25), 0.0]])
    mask = torch.tensor([[1, 0]])
    for mode in MODES[1:]:
        w, keep = correction_weights(lp, sp, mask, mode, threshold=3.0)
        assert w.tolist() == [[2.0, 0.0]] and keep.tolist() == [[True, False]], mode  # rho = 2, geo of one = 2


@pytest.mark.parametrize("mode", MODES)
def test_identical_logprobs_give_weights_of_exactly_one(mode):
    lp = torch.log_softmax(torch.randn(4, 7, generator=torch.Generator().manual_seed(0)), dim=-1)
    mask = torch.ones(4, 7)
    mask[1, 5:] = 0
    w, keep = correction_weights(lp, lp.clone(), mask, mode)
    assert torch.equal(w, mask) and torch.equal(keep, mask.bool())


def test_bad_modes_and_bounds_are_rejected():
    with pytest.raises(ValueError, match="choose one of"):
        parse_mode("tis")
    with pytest.raises(ValueError, match="must be > 1"):
        correction_weights(LEARNER, SAMPLER, ONES, "token-tis", threshold=1.0)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        correction_weights(LEARNER, SAMPLER, ONES, "token-mis", lower=1.5)
    with pytest.raises(ValueError, match="same"):
        correction_weights(LEARNER, SAMPLER, torch.ones(1, 2), "token-tis")


def test_mismatch_metrics_by_hand():
    # two replies: [rho 2.5, 1.5, 0.25] and [rho 1 (learner = sampler = log 0.5), padding]
    lp = torch.cat([LEARNER, torch.tensor([[math.log(0.5), 0.0, 0.0]])])
    sp = torch.cat([SAMPLER, torch.tensor([[math.log(0.5), 0.0, 0.0]])])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    m = mismatch_means(mismatch_sums(lp, sp, mask, mode="token-tis", threshold=2.0))
    d = [math.log(2.5), math.log(1.5), math.log(0.25), 0.0]  # log rho of the 4 tokens
    assert m["tokens"] == 4
    assert m["kl_k1"] == approx(-sum(d) / 4)  # -(0.9163 + 0.4055 - 1.3863 + 0) / 4 = 0.0161
    assert m["kl_k3"] == approx(sum(math.exp(x) - 1 - x for x in d) / 4)  # (0.6337+0.0945+0.6363+0)/4
    assert m["chi2_token"] == approx((6.25 + 2.25 + 0.0625 + 1) / 4 - 1)  # mean rho^2 - 1 = 1.390625
    assert m["chi2_seq"] == approx((0.9375**2 + 1) / 2 - 1)  # products 0.9375 and 1: 0.43945 - 1 < 0
    # learner minus sampler log-perplexity per reply: -mean(d) = 0.0215 and 0
    assert m["log_ppl_diff"] == approx((-sum(d[:3]) / 3 + 0.0) / 2)
    assert m["ratio_mean"] == approx((2.5 + 1.5 + 0.25 + 1) / 4)
    assert m["ratio_max"] == approx(2.5)
    assert m["truncated_frac"] == approx(1 / 4)  # 2.5 > 2
    assert m["masked_frac"] == approx(2 / 4)  # 2.5 > 2 and 0.25 < 1/2
    seq = mismatch_means(mismatch_sums(lp, sp, mask, mode="seq-mis", threshold=2.0))
    assert seq["weight_mean"] == approx((GEO + 1) / 2) and seq["masked_frac"] == 0.0  # per reply


def test_mismatch_sums_merge_like_one_batch():
    lp = torch.log_softmax(torch.randn(6, 5, generator=torch.Generator().manual_seed(1)), dim=-1)
    sp = lp + 0.3 * torch.randn(6, 5, generator=torch.Generator().manual_seed(2))
    mask = torch.ones(6, 5)
    whole = mismatch_means(mismatch_sums(lp, sp, mask))
    parts = mismatch_means(merge_sums(mismatch_sums(lp[:2], sp[:2], mask[:2]), mismatch_sums(lp[2:], sp[2:], mask[2:])))
    assert parts == pytest.approx(whole)


def test_identical_logprobs_are_on_policy():
    lp = torch.log_softmax(torch.randn(3, 4), dim=-1)
    m = mismatch_means(mismatch_sums(lp, lp, torch.ones(3, 4)))
    assert m["kl_k1"] == 0 and m["kl_k3"] == 0 and m["chi2_token"] == 0 and m["chi2_seq"] == 0
    assert m["ratio_max"] == 1 and m["truncated_frac"] == 0 and m["masked_frac"] == 0


def test_padding_holding_minus_infinity_leaves_the_metrics_finite():
    lp = torch.tensor([[-0.5, -float("inf")]])
    sp = torch.tensor([[-0.7, 0.0]])
    m = mismatch_means(mismatch_sums(lp, sp, torch.tensor([[1, 0]])))
    assert all(math.isfinite(v) for v in m.values())
    assert m["log_ppl_diff"] == approx(-0.2)  # learner log-ppl 0.5 minus sampler log-ppl 0.7
