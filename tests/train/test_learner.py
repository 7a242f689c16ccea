from __future__ import annotations

import copy
import math

import pytest
import torch

from teamrl.learner.learner import LearnerSettings, TorchLearner, pack_micro_batches
from teamrl.team.records import Step
from tests.conftest import make_tiny_model


def settings(**kw) -> LearnerSettings:
    base = dict(lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, grad_clip=0.0, warmup_steps=0, schedule="constant",
                total_steps=10, clip_low=0.2, clip_high=0.2, dual_clip=None, agg="token-mean", level="token",
                kl_coef=0.0, kl_kind="k3", entropy_coef=0.0, micro_batch_tokens=100_000, updates_per_batch=1)
    base.update(kw)
    return LearnerSettings(**base)


def optimizer_steps(learner: TorchLearner) -> int:
    """AdamW's step count (every trained tensor's is the same)."""
    return int(next(iter(learner.optimizer.state.values()))["step"])


def make_rows(tokenizer, n: int = 8, agents=("solver", "verifier")) -> list[Step]:
    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(n):
        prompt = tokenizer.encode(f"question number {i} " * (1 + i % 3))
        resp = torch.randint(0, 1000, (3 + i % 4,), generator=g).tolist()
        rows.append(Step(prompt_index=0, episode=i, agent=agents[i % len(agents)], agent_call=0, model="m", prompt_ids=prompt,
                         response_ids=resp, logprobs=[-2.0] * len(resp), temperature=1.0, text="", valid=True,
                         advantage=float(i % 3) - 1.0 + 0.25))
    return rows


def _grads_after_update(model, rows, **kw) -> dict[str, torch.Tensor]:
    TorchLearner("m", model, settings(**kw), {}).compute_gradients(rows)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    # every parameter gets a gradient and some are non-zero: comparisons of these are never vacuous
    assert grads.keys() == dict(model.named_parameters()).keys() and any(bool(g.any()) for g in grads.values())
    return grads


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_one_batch_of_8_equals_8_micro_batches_of_1(tokenizer, agg):
    rows = make_rows(tokenizer)
    m1 = make_tiny_model(tokenizer)
    m2 = copy.deepcopy(m1)
    full = _grads_after_update(m1, rows, agg=agg, micro_batch_tokens=100_000)
    split = _grads_after_update(m2, rows, agg=agg, micro_batch_tokens=1)  # budget 1 -> one row per micro-batch
    assert full.keys() == split.keys()
    for k in full:
        torch.testing.assert_close(full[k], split[k], atol=1e-6, rtol=1e-4)


def test_per_agent_grad_norm_is_exact_under_sharing(tokenizer):
    rows = make_rows(tokenizer)
    model = make_tiny_model(tokenizer)
    stats = TorchLearner("m", copy.deepcopy(model), settings(), {}).update(rows)
    # each agent's norm equals the norm of the gradient of its own rows, with the batch's denominators
    n_tok = sum(len(r.response_ids) for r in rows)
    for agent in ("solver", "verifier"):
        m = copy.deepcopy(model)
        lr = TorchLearner("m", m, settings(), {})
        mine = [r for r in rows if r.agent == agent]
        loss = lr._micro_batch_loss(mine, float(n_tok), float(len(rows)), _NullAcc())
        loss.backward()
        norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in m.parameters() if p.grad is not None))
        assert stats[f"agent/{agent}/grad_norm"] == pytest.approx(norm, rel=1e-4)
    total = math.sqrt(stats["agent/solver/grad_norm"] ** 2 + stats["agent/verifier/grad_norm"] ** 2)
    assert stats["grad_norm"] <= total + 1e-6  # triangle inequality


@pytest.mark.parametrize("micro_batch_tokens", [100_000, 1])
def test_one_gradient_buffer_gives_the_same_gradient_without_agent_norms(tokenizer, micro_batch_tokens):
    """agent_grad_norms=false accumulates every agent into one buffer: the same total gradient (and update), no
    per-agent norms; trimming the heap after each micro-batch changes nothing either."""
    rows = make_rows(tokenizer)
    m1 = make_tiny_model(tokenizer)
    m2 = copy.deepcopy(m1)
    apart = TorchLearner("m", m1, settings(micro_batch_tokens=micro_batch_tokens), {}).compute_gradients(rows)
    one = TorchLearner("m", m2, settings(micro_batch_tokens=micro_batch_tokens, agent_grad_norms=False,
                                         trim_micro_batches=True), {}).compute_gradients(rows)
    assert "agent/solver/grad_norm" in apart and not any(k.startswith("agent/") and k.endswith("/grad_norm")
                                                         for k in one)
    for (n, a), b in zip(m1.named_parameters(), m2.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-7, rtol=1e-5, msg=n)


def test_the_agent_with_the_largest_micro_batch_runs_first(tokenizer):
    """Its activations peak before any gradient buffer exists; the order changes the gradient only by float
    summation order."""
    from teamrl.learner.microbatches import by_agent as _by_agent

    rows = make_rows(tokenizer)
    for r in rows:
        if r.agent == "verifier":  # the verifier's prompts 4x as long: it runs first though "solver" sorts first
            r.prompt_ids = r.prompt_ids * 4
    model = make_tiny_model(tokenizer)
    learners = [TorchLearner("m", copy.deepcopy(model), settings(agent_grad_norms=False), {}) for _ in range(2)]
    learners[1]._largest_first = lambda rs: [(a, m, learners[1]._micro_batches(m)) for a, m in _by_agent(rs)]  # by name
    orders = []
    for learner in learners:
        order, loss = [], learner._micro_batch_loss
        learner._micro_batch_loss = lambda mb, *a, _o=order, _l=loss, **k: _o.append(mb[0].agent) or _l(mb, *a, **k)
        learner.compute_gradients(rows)
        orders.append(order)
    assert orders == [["verifier", "solver"], ["solver", "verifier"]]
    for (n, a), b in zip(learners[0].model.named_parameters(), learners[1].model.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-7, rtol=1e-5, msg=n)


class _NullAcc:
    def add(self, *a, **k) -> None:
        pass


def test_update_changes_every_parameter_tensor(tokenizer):
    rows = make_rows(tokenizer)
    model = make_tiny_model(tokenizer)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    stats = TorchLearner("m", model, settings(), {}).update(rows)
    assert stats["skipped"] == 0.0
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
    assert unchanged == []


def test_non_finite_gradient_skips_the_update(tokenizer, caplog):
    rows = make_rows(tokenizer)
    rows[0].advantage = float("nan")
    model = make_tiny_model(tokenizer)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    lr = TorchLearner("m", model, settings(), {})
    stats = lr.update(rows)
    assert stats["skipped"] == 1.0 and lr.skipped_updates == 1
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert "update skipped" in caplog.text


def test_zero_advantage_rows_are_not_run_but_count_in_denominators(tokenizer):
    rows = make_rows(tokenizer)
    for r in rows[4:]:
        r.advantage = 0.0
    model = make_tiny_model(tokenizer)
    stats = TorchLearner("m", model, settings(), {}).update(rows)
    assert stats["rows"] == 8 and stats["rows_trained"] == 4


def test_loss_weight_zero_removes_an_agents_gradient(tokenizer):
    rows = make_rows(tokenizer)
    stats = TorchLearner("m", make_tiny_model(tokenizer), settings(), {"verifier": 0.0}).update(rows)
    assert stats["agent/verifier/grad_norm"] == 0.0 and stats["agent/solver/grad_norm"] > 0


def test_kl_and_entropy_terms_are_reported(tokenizer):
    rows = make_rows(tokenizer)
    stats = TorchLearner("m", make_tiny_model(tokenizer), settings(kl_coef=0.1, entropy_coef=0.01), {}).update(rows)
    assert stats["kl"] == pytest.approx(0.0, abs=1e-6)  # the policy equals its reference before the first step
    assert stats["entropy"] > 0


def test_pack_micro_batches_respects_budget():
    lengths = [5, 3, 9, 4, 9, 1]
    packs = pack_micro_batches(lengths, budget=12)
    assert sorted(i for p in packs for i in p) == list(range(6))
    for p in packs:
        assert len(p) == 1 or len(p) * max(lengths[i] for i in p) <= 12


def test_recomputed_old_logprobs_start_the_ratio_at_one(tokenizer):
    rows = make_rows(tokenizer)  # recorded log-probs are -2.0 everywhere: far from the model's
    stats_engine = TorchLearner("m", make_tiny_model(tokenizer), settings(), {}).update(rows)
    stats_recomp = TorchLearner("m", make_tiny_model(tokenizer), settings(old_logprobs="recompute"), {}).update(rows)
    assert stats_engine["clip_frac"] > 0  # ratios against the stale log-probs are clipped
    assert stats_recomp["clip_frac"] == 0.0  # ratio exactly 1 on the single update
    assert stats_recomp["engine_logprob_absdiff"] > 0.5  # the mismatch is still reported


def test_recompute_with_two_updates_per_batch(tokenizer):
    rows = make_rows(tokenizer)
    lr = TorchLearner("m", make_tiny_model(tokenizer), settings(old_logprobs="recompute", updates_per_batch=2), {})
    stats = lr.update(rows)
    assert stats["skipped"] == 0.0 and optimizer_steps(lr) == 2


def test_the_anchor_pass_scores_only_the_rows_that_carry_a_gradient(tokenizer):
    rows = make_rows(tokenizer)
    for r in rows[::2]:  # a group whose episodes scored alike: no gradient, no anchor needed
        r.advantage = 0.0
    kw = dict(old_logprobs="recompute", updates_per_batch=2)
    mixed = TorchLearner("m", make_tiny_model(tokenizer), settings(**kw), {}).update(rows)
    active = TorchLearner("m", make_tiny_model(tokenizer), settings(**kw), {}).update(rows[1::2])
    every = TorchLearner("m", make_tiny_model(tokenizer), settings(kl_coef=0.1, **kw), {}).update(rows)  # KL: all
    assert 0 < mixed["perf/logprob_tokens"] == active["perf/logprob_tokens"] < every["perf/logprob_tokens"]
    assert mixed["skipped"] == 0.0 and mixed["perf/update_tokens_computed"] > 0


def test_bf16_autocast_update_is_close_to_fp32(tokenizer):
    rows = make_rows(tokenizer)
    g32 = _grads_after_update(make_tiny_model(tokenizer), rows)
    g16 = _grads_after_update(make_tiny_model(tokenizer), rows, autocast=True)
    for k in g32:
        cos = torch.nn.functional.cosine_similarity(g32[k].flatten(), g16[k].flatten(), dim=0)
        assert cos > 0.95, k


def test_entropy_clip_fraction_and_kl_are_reported_per_agent(tokenizer):
    rows = make_rows(tokenizer)
    for r in rows:  # old log-probs far from the policy: many ratios leave the clip range
        r.logprobs = [-1.0] * len(r.response_ids)
    stats = TorchLearner("m", make_tiny_model(tokenizer), settings(kl_coef=0.1), {}).update(rows)
    tokens = {a: sum(len(r.response_ids) for r in rows if r.agent == a) for a in ("solver", "verifier")}
    for key in ("entropy", "clip_frac", "kl"):
        per_agent = {a: stats[f"agent/{a}/{key}"] for a in tokens}
        # the model's value is the token-weighted mean of its agents' values
        weighted = sum(per_agent[a] * tokens[a] for a in tokens) / sum(tokens.values())
        assert stats[key] == pytest.approx(weighted, rel=1e-9, abs=1e-12), key
    assert stats["agent/solver/entropy"] > 0 and stats["agent/verifier/entropy"] > 0


def test_mini_batch_rows_steps_once_per_run_of_rows(tokenizer):
    """8 rows in runs of 3: steps on rows 0-2, 3-5 and 6-7; dropping the remainder leaves rows 6-7 out, and two
    updates of one step on rows 0-2 and 3-5 give the same weights."""
    rows = make_rows(tokenizer)
    lr = TorchLearner("m", make_tiny_model(tokenizer), settings(mini_batch_rows=3), {})
    lr.update(rows)
    assert optimizer_steps(lr) == 3
    dropped = TorchLearner("m", make_tiny_model(tokenizer), settings(mini_batch_rows=3, drop_remainder=True), {})
    dropped.update(rows)
    by_hand = TorchLearner("m", make_tiny_model(tokenizer), settings(), {})
    by_hand.update(rows[0:3])
    by_hand.update(rows[3:6])
    assert optimizer_steps(dropped) == optimizer_steps(by_hand) == 2
    for (name, a), b in zip(dropped.model.named_parameters(), by_hand.model.parameters()):
        assert torch.equal(a, b), name


def test_logprob_temperature_scores_every_row_at_one_temperature(tokenizer):
    """loss.logprob_temperature: rows sampled at 1.5 are scored at 1.0 (PettingLLMs' rollout temperature), the same
    log-probs as rows whose own temperature is 1.0."""
    from teamrl.learner.scoring import response_logprobs

    model = make_tiny_model(tokenizer)
    rows = make_rows(tokenizer)
    hot = [copy.copy(r) for r in rows]
    for r in hot:
        r.temperature = 1.5
    with torch.no_grad():
        plain, _, _ = response_logprobs(model, rows)
        at_one, _, _ = response_logprobs(model, hot, temperature=1.0)
        own, _, _ = response_logprobs(model, hot)
    assert torch.allclose(plain, at_one) and not torch.allclose(plain, own)
