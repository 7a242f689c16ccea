"""The learner's rollout correction: no-op when sampler and learner agree, masked tokens out of both sides of
the loss, and the mismatch metrics per agent and per model."""

from __future__ import annotations

import pytest
import torch

from teamrl.algos import correction, losses
from teamrl.algos.correction import MODES
from teamrl.learner.learner import TorchLearner, pack_micro_batches
from teamrl.learner.scoring import response_logprobs
from tests.conftest import make_tiny_model
from tests.train.test_learner import make_rows, settings


def own_logprobs(model, rows, budget: int = 100_000) -> None:
    """Set every row's sampler log-probs to the learner's own, computed on the micro-batches the learner will run."""
    for agent in sorted({r.agent for r in rows}):
        mine = [r for r in rows if r.agent == agent]
        for mb in pack_micro_batches([len(r.prompt_ids) + len(r.response_ids) for r in mine], budget):
            with torch.no_grad():
                logp, _, _ = response_logprobs(model, [mine[i] for i in mb])
            for j, i in enumerate(mb):
                mine[i].logprobs = logp[j, : len(mine[i].response_ids)].tolist()


def grads(model, rows, **kw) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    model.zero_grad(set_to_none=True)
    stats = TorchLearner("m", model, settings(old_logprobs="recompute", **kw), {}).compute_gradients(rows)
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, stats


@pytest.mark.parametrize("mode", MODES[1:])
def test_identical_logprobs_change_nothing(tokenizer, mode):
    """fp32 sampler = learner: every mode leaves the loss and every gradient bit-identical."""
    model = make_tiny_model(tokenizer)
    rows = make_rows(tokenizer)
    own_logprobs(model, rows)
    g_off, s_off = grads(model, rows)
    g_on, s_on = grads(model, rows, rollout_correction=mode)
    assert g_off.keys() == g_on.keys() and any(bool(g.any()) for g in g_off.values())
    for k in g_off:
        assert torch.equal(g_off[k], g_on[k]), k
    assert s_on["loss"] == s_off["loss"]
    assert s_on["mismatch/model/m/weight_max"] == 1.0 and s_on["mismatch/model/m/masked_frac"] == 0.0
    assert s_on["mismatch/solver/kl_k3"] == 0.0 and s_on["mismatch/verifier/chi2_seq"] == 0.0


def test_masked_tokens_leave_numerator_and_denominator(tokenizer):
    """token-mis over several micro-batches equals sum(kept token losses) / kept tokens, computed directly."""
    model = make_tiny_model(tokenizer)
    rows = make_rows(tokenizer)
    own_logprobs(model, rows)
    for r in rows[::3]:  # these rows' first token: rho = e > 2 (masked); their second: rho = e^-0.1 (kept, weight 0.905)
        r.logprobs[0] -= 1.0
        r.logprobs[1] += 0.1
    got, stats = grads(model, rows, rollout_correction="token-mis", micro_batch_tokens=40)
    model.zero_grad(set_to_none=True)
    total_kept = 0.0
    parts = []
    for r in rows:
        logp, _, mask = response_logprobs(model, [r])
        sampler = torch.tensor([r.logprobs])
        w, keep = correction.correction_weights(logp.detach(), sampler, mask, "token-mis")
        per_tok, _ = losses.clipped_surrogate(logp, logp.detach(), torch.tensor([r.advantage]), mask)
        parts.append((per_tok * w)[keep].sum())
        total_kept += float(keep.sum())
    assert total_kept == sum(len(r.response_ids) for r in rows) - len(rows[::3])
    (torch.stack(parts).sum() / total_kept).backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-4, atol=1e-6, msg=n)
    n_tok = sum(len(r.response_ids) for r in rows)
    assert stats["mismatch/model/m/masked_frac"] == pytest.approx(len(rows[::3]) / n_tok)  # 3 of 36 tokens


def test_truncation_weighs_without_dropping(tokenizer):
    """token-tis with one token at rho = e: its term is weighed by 2 (the threshold); the denominator keeps every token."""
    model = make_tiny_model(tokenizer)
    rows = make_rows(tokenizer, n=2)
    own_logprobs(model, rows)
    rows[0].logprobs[0] -= 1.0
    got, stats = grads(model, rows, rollout_correction="token-tis")
    model.zero_grad(set_to_none=True)
    n_tok = sum(len(r.response_ids) for r in rows)
    parts = []
    for r in rows:
        logp, _, mask = response_logprobs(model, [r])
        per_tok, _ = losses.clipped_surrogate(logp, logp.detach(), torch.tensor([r.advantage]), mask)
        w = torch.ones_like(per_tok)
        if r is rows[0]:
            w[0, 0] = 2.0
        parts.append((per_tok * w).sum())
    (torch.stack(parts).sum() / n_tok).backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-4, atol=1e-6, msg=n)
    assert stats["mismatch/model/m/truncated_frac"] == pytest.approx(1 / n_tok)
    assert stats["mismatch/solver/ratio_max"] == pytest.approx(torch.e, rel=1e-4)


def test_metrics_are_logged_with_the_correction_off(tokenizer):
    model = make_tiny_model(tokenizer)
    rows = make_rows(tokenizer)  # sampler log-probs -2.0 everywhere: far from the learner's
    stats = TorchLearner("m", model, settings(), {}).update(rows)
    for key in ("kl_k1", "kl_k3", "chi2_token", "chi2_seq", "log_ppl_diff", "ratio_mean", "ratio_max",
                "weight_mean", "truncated_frac", "masked_frac"):
        for scope in ("solver", "verifier", "model/m"):
            assert f"mismatch/{scope}/{key}" in stats, (scope, key)
    assert stats["mismatch/model/m/kl_k3"] > 0


def _mars2_grads(model, rows, **kw) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    model.zero_grad(set_to_none=True)
    s = settings(old_logprobs="engine", level="sequence", agg="seq-mean-token-mean", **kw)
    stats = TorchLearner("m", model, s, {}).compute_gradients(rows)
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, stats


def test_mars2_form_ratio_against_the_sampler_weights_and_veto(tokenizer):
    """MARS2's GSPO loss (old_logprobs engine, sequence level, token TIS): no-op when sampler = learner; a reply with
    a token whose rho is below the veto contributes nothing but stays in the denominator."""
    model = make_tiny_model(tokenizer)
    rows = make_rows(tokenizer)
    own_logprobs(model, rows)
    g_off, s_off = _mars2_grads(model, rows)
    g_on, s_on = _mars2_grads(model, rows, rollout_correction="token-tis", correction_veto=1e-4)
    for k in g_off:
        assert torch.equal(g_off[k], g_on[k]), k
    assert s_on["loss"] == s_off["loss"]
    vetoed = rows[2]
    vetoed.logprobs[0] += 10.0  # rho = e^-10 < 1e-4 on its first token
    g_veto, _ = _mars2_grads(model, rows, rollout_correction="token-tis", correction_veto=1e-4)
    vetoed.logprobs[0] -= 10.0
    vetoed.advantage = 0.0  # the same row contributing nothing, still counted in num_seqs
    g_zero, _ = _mars2_grads(model, rows, rollout_correction="token-tis")
    for k in g_zero:
        # equal up to float32 summation order (two threads may add in another order: differences near 1e-7)
        torch.testing.assert_close(g_veto[k], g_zero[k], rtol=1e-5, atol=1e-6, msg=k)
    assert any(not torch.allclose(g_veto[k], g_off[k]) for k in g_off)  # the veto changed the gradient
