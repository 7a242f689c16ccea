from __future__ import annotations

import doctest
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from teamrl.algos import losses as loss_mod
from teamrl.algos.losses import (
    AGG_MODES,
    aggregate,
    clipped_surrogate,
    entropy_from_logits,
    kl_estimate,
    token_logprobs,
)


def logs(*ratios: float) -> torch.Tensor:
    return torch.log(torch.tensor([list(ratios)], dtype=torch.float64))


def surrogate(ratios: list[float], advantage: float, **kw) -> tuple[torch.Tensor, dict]:
    lp = logs(*ratios)
    old = torch.zeros_like(lp)
    mask = torch.ones_like(lp, dtype=torch.bool)
    return clipped_surrogate(lp, old, torch.tensor([advantage], dtype=torch.float64), mask, **kw)


# ---------------------------------------------------------------- clipped surrogate


def test_token_ppo_positive_advantage():
    # A = 1, clip [.8, 1.2]
    # r 1.5: min(1.5, 1.2) = 1.2 -> loss -1.2 (clipped)
    # r 1.1: inside -> -1.1 ; r .5: min(.5, .8) = .5 -> -.5 (not clipped)
    loss, stats = surrogate([1.5, 1.1, 0.5], 1.0)
    torch.testing.assert_close(loss, torch.tensor([[-1.2, -1.1, -0.5]], dtype=torch.float64))
    assert stats["clipped"].tolist() == [[True, False, False]]
    torch.testing.assert_close(stats["ratio"], torch.tensor([[1.5, 1.1, 0.5]], dtype=torch.float64))


def test_token_ppo_negative_advantage():
    # A = -1: surrogate min(-r, -clip(r))
    # r 1.5: min(-1.5, -1.2) = -1.5 -> loss 1.5 (not clipped)
    # r .5: min(-.5, -.8) = -.8 -> loss .8 (clipped) ; r 1.1: loss 1.1
    loss, stats = surrogate([1.5, 0.5, 1.1], -1.0)
    torch.testing.assert_close(loss, torch.tensor([[1.5, 0.8, 1.1]], dtype=torch.float64))
    assert stats["clipped"].tolist() == [[False, True, False]]


def test_asymmetric_clip():
    # clip_low .1, clip_high .3, A = 1: r 1.5 -> min(1.5, 1.3) = 1.3 ; r .5 -> .5
    # A = -1 on r .5: min(-.5, -.9) = -.9 -> loss .9
    loss, _ = surrogate([1.5, 0.5], 1.0, clip_low=0.1, clip_high=0.3)
    torch.testing.assert_close(loss, torch.tensor([[-1.3, -0.5]], dtype=torch.float64))
    loss, _ = surrogate([0.5], -1.0, clip_low=0.1, clip_high=0.3)
    torch.testing.assert_close(loss, torch.tensor([[0.9]], dtype=torch.float64))


def test_dual_clip():
    # A = -2, dual_clip 3: bound -3 * A = 6
    # r 4: PPO loss min-branch = 4 * 2 = 8 > 6 -> 6 (dual clipped)
    # r 1.5: loss 3 < 6 -> 3 ; r .5: loss -min(-1, -1.6) = 1.6 (PPO clipped)
    loss, stats = surrogate([4.0, 1.5, 0.5], -2.0, dual_clip=3.0)
    torch.testing.assert_close(loss, torch.tensor([[6.0, 3.0, 1.6]], dtype=torch.float64))
    assert stats["dual_clipped"].tolist() == [[True, False, False]]
    assert stats["clipped"].tolist() == [[False, False, True]]
    # positive advantages are untouched by the dual clip: r 4, A 2 -> -min(8, 2.4) = -2.4
    loss, stats = surrogate([4.0], 2.0, dual_clip=3.0)
    torch.testing.assert_close(loss, torch.tensor([[-2.4]], dtype=torch.float64))
    assert not stats["dual_clipped"].any()


def test_dual_clip_gradient_is_zero_when_active():
    lp = logs(4.0).requires_grad_()
    loss, _ = clipped_surrogate(lp, torch.zeros_like(lp), torch.tensor([-2.0], dtype=torch.float64),
                                torch.ones_like(lp), dual_clip=3.0)
    loss.sum().backward()
    assert lp.grad.tolist() == [[0.0]]


def test_mask_zeroes_loss_and_survives_inf_padding():
    lp = torch.tensor([[math.log(1.1), -math.inf]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[0.0, -math.inf]], dtype=torch.float64)
    mask = torch.tensor([[True, False]])
    for level in ("token", "sequence"):
        loss, stats = clipped_surrogate(lp, old, torch.tensor([1.0], dtype=torch.float64), mask,
                                        level=level)
        assert loss[0, 1].item() == 0.0 and not stats["clipped"][0, 1]
        (grad,) = torch.autograd.grad(loss.sum(), lp)
        assert torch.isfinite(grad).all() and grad[0, 1].item() == 0.0


def test_gspo_value_is_sequence_ratio():
    # row 0 token ratios 1.2, .8 -> s = exp(mean(log 1.2, log .8)) = sqrt(.96) = .979796
    # row 1 token ratios 2, 1.5, then padding -> s = sqrt(3) = 1.732 > 1.2 -> clipped to 1.2
    lp = torch.log(torch.tensor([[1.2, 0.8, 1.0], [2.0, 1.5, 7.0]], dtype=torch.float64))
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    adv = torch.tensor([1.0, 1.0], dtype=torch.float64)
    loss, stats = clipped_surrogate(lp, torch.zeros_like(lp), adv, mask, level="sequence")
    s0 = math.sqrt(0.96)
    torch.testing.assert_close(stats["seq_ratio"], torch.tensor([s0, math.sqrt(3)], dtype=torch.float64))
    torch.testing.assert_close(loss, torch.tensor([[-s0, -s0, 0.0], [-1.2, -1.2, 0.0]],
                                                  dtype=torch.float64))
    assert stats["clipped"].tolist() == [[False, False, False], [True, True, False]]


def test_gspo_gradient_differs_from_token_ppo():
    # token PPO: d loss / d logp_t = -A * r_t  -> [-1.2, -.8]
    # GSPO:      d loss / d logp_t = -A * s    -> [-.9798, -.9798] (same for every token)
    ratios = torch.tensor([[1.2, 0.8]], dtype=torch.float64)
    adv = torch.tensor([1.0], dtype=torch.float64)
    grads = {}
    for level in ("token", "sequence"):
        lp = torch.log(ratios).requires_grad_()
        loss, _ = clipped_surrogate(lp, torch.zeros_like(lp), adv, torch.ones_like(lp),
                                    level=level)
        (grads[level],) = torch.autograd.grad(loss.sum(), lp)
    torch.testing.assert_close(grads["token"], torch.tensor([[-1.2, -0.8]], dtype=torch.float64))
    s = math.sqrt(0.96)
    torch.testing.assert_close(grads["sequence"], torch.tensor([[-s, -s]], dtype=torch.float64))


def test_extreme_log_ratio_is_clamped():
    lp = torch.tensor([[100.0]])
    loss, stats = clipped_surrogate(lp, torch.zeros_like(lp), torch.tensor([-1.0]),
                                    torch.ones_like(lp))
    assert torch.isfinite(loss).all()
    torch.testing.assert_close(stats["ratio"], torch.tensor([[math.exp(20.0)]]))


def test_surrogate_validation():
    lp = torch.zeros(2, 3)
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match="dual_clip"):
        clipped_surrogate(lp, lp, torch.zeros(2), mask, dual_clip=1.0)
    with pytest.raises(ValueError, match="advantages must have shape"):
        clipped_surrogate(lp, lp, torch.zeros(2, 4), mask)
    with pytest.raises(ValueError, match="advantages must have shape"):  # one per token only at level token
        clipped_surrogate(lp, lp, torch.zeros(2, 3), mask, level="sequence")
    clipped_surrogate(lp, lp, torch.zeros(2, 3), mask)  # [B, T] at level token: on-policy distillation's terms
    with pytest.raises(ValueError, match="level"):
        clipped_surrogate(lp, lp, torch.zeros(2), mask, level="tokens")
    with pytest.raises(ValueError, match="clip_low"):
        clipped_surrogate(lp, lp, torch.zeros(2), mask, clip_low=1.0)
    with pytest.raises(ValueError, match="mask"):
        clipped_surrogate(lp, lp, torch.zeros(2), torch.full((2, 3), 0.5))
    with pytest.raises(ValueError, match="old_logprobs"):
        clipped_surrogate(lp, lp[:, :2], torch.zeros(2), mask)


# ---------------------------------------------------------------- KL, entropy, log-probs


def test_kl_values():
    # logp = log .5, ref = log .25: d = ref - logp = -log 2
    # k1 = log 2 = .693147 ; k2 = (log 2)^2 / 2 = .240227 ; k3 = .5 + log 2 - 1 = .193147
    lp = torch.log(torch.tensor([[0.5]], dtype=torch.float64))
    ref = torch.log(torch.tensor([[0.25]], dtype=torch.float64))
    ln2 = math.log(2)
    assert kl_estimate(lp, ref, kind="k1").item() == pytest.approx(ln2)
    assert kl_estimate(lp, ref, kind="k2").item() == pytest.approx(ln2**2 / 2)
    assert kl_estimate(lp, ref, kind="k3").item() == pytest.approx(0.5 + ln2 - 1)
    assert kl_estimate(lp, lp, kind="k3").item() == 0.0
    with pytest.raises(ValueError, match="k3"):
        kl_estimate(lp, ref, kind="k4")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(-30, 0), st.floats(-30, 0)), min_size=1, max_size=16))
def test_k3_is_non_negative(pairs):
    lp = torch.tensor([p[0] for p in pairs])
    ref = torch.tensor([p[1] for p in pairs])
    out = kl_estimate(lp, ref, kind="k3")
    assert torch.isfinite(out).all() and (out >= 0).all()


def test_entropy():
    for v in (2, 7, 50):
        out = entropy_from_logits(torch.zeros(3, v))
        torch.testing.assert_close(out, torch.full((3,), math.log(v)))
    # one-hot (huge logit gap) -> 0 ; banned (-inf) tokens are ignored: uniform over 2 -> log 2
    assert entropy_from_logits(torch.tensor([1000.0, 0.0])).item() == pytest.approx(0.0, abs=1e-6)
    out = entropy_from_logits(torch.tensor([0.0, 0.0, -math.inf]))
    assert out.item() == pytest.approx(math.log(2))
    logits = torch.randn(4, 9, dtype=torch.float64)
    ref = torch.distributions.Categorical(logits=logits).entropy()
    torch.testing.assert_close(entropy_from_logits(logits), ref)


def test_entropy_gradient_finite_with_banned_tokens():
    logits = torch.tensor([0.3, -0.2, -math.inf], requires_grad=True)
    entropy_from_logits(logits).backward()
    assert torch.isfinite(logits.grad).all()


def test_token_logprobs_matches_log_softmax():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, 11, (3, 5), generator=gen)
    ref = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    torch.testing.assert_close(token_logprobs(logits, tokens), ref)
    temps = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    ref_t = torch.log_softmax(logits / temps[:, None, None], -1).gather(-1, tokens[..., None])
    torch.testing.assert_close(token_logprobs(logits, tokens, temperature=temps), ref_t.squeeze(-1))
    ref_07 = torch.log_softmax(logits / 0.7, -1).gather(-1, tokens[..., None]).squeeze(-1)
    torch.testing.assert_close(token_logprobs(logits, tokens, temperature=0.7), ref_07)


def test_token_logprobs_validation():
    logits = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        token_logprobs(logits, torch.full((2, 3), 4))
    with pytest.raises(ValueError, match="vocab dim"):
        token_logprobs(logits, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(logits, torch.zeros(2, 3, dtype=torch.long), temperature=0.0)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(logits, torch.zeros(2, 3, dtype=torch.long), temperature=torch.ones(3))


# ---------------------------------------------------------------- aggregation


def test_aggregate_hand_computed():
    # kept tokens: row0 {1, 2}, row1 {4}
    # token-mean = (1+2+4)/3 = 7/3 ; seq-mean-token-sum = (3+4)/2 = 3.5
    # seq-mean-token-mean = (3/2 + 4/1)/2 = 2.75
    v = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, float("nan")]])
    m = torch.tensor([[True, True, False], [True, False, False]])
    assert aggregate(v, m, "token-mean").item() == pytest.approx(7 / 3)
    assert aggregate(v, m, "seq-mean-token-sum").item() == pytest.approx(3.5)
    assert aggregate(v, m, "seq-mean-token-mean").item() == pytest.approx(2.75)
    # explicit denominators: 7/10, 7/4 and 5.5/4
    assert aggregate(v, m, "token-mean", num_tokens=10).item() == pytest.approx(0.7)
    assert aggregate(v, m, "seq-mean-token-sum", num_seqs=4).item() == pytest.approx(1.75)
    assert aggregate(v, m, "seq-mean-token-mean", num_seqs=4).item() == pytest.approx(1.375)


def test_aggregate_empty_rows_and_validation():
    v = torch.ones(2, 2)
    m = torch.zeros(2, 2)
    for mode in AGG_MODES:
        assert aggregate(v, m, mode).item() == 0.0
    with pytest.raises(ValueError, match="mode"):
        aggregate(v, m, "mean")
    with pytest.raises(ValueError, match="num_tokens"):
        aggregate(v, m, "token-mean", num_tokens=0)
    with pytest.raises(ValueError, match="mask has shape"):
        aggregate(v, m[:1], "token-mean")


@pytest.mark.parametrize("mode", AGG_MODES)
def test_micro_batches_sum_to_full_batch(mode):
    gen = torch.Generator().manual_seed(1)
    values = torch.randn(8, 6, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([6, 1, 3, 0, 5, 2, 6, 4])
    mask = torch.arange(6)[None, :] < lengths[:, None]  # [8, 6]
    kw = dict(num_tokens=float(mask.sum()), num_seqs=8.0)
    full = aggregate(values, mask, mode, **kw)
    parts = sum(aggregate(values[i : i + 1], mask[i : i + 1], mode, **kw) for i in range(8))
    torch.testing.assert_close(parts, full)
    # the defaults equal the global denominators for the whole batch
    torch.testing.assert_close(aggregate(values, mask, mode), full)


def test_doctests():
    result = doctest.testmod(loss_mod)
    assert result.attempted > 0 and result.failed == 0
