"""``teamrl probe``: the per-agent gradients it measures, the reward sweep and the report's statistics."""

from __future__ import annotations

import json
import math

import pytest
import torch

from teamrl.algos.advantages import get_estimator
from teamrl.cli import main
from teamrl.scoring.advantages import advantages_for
from teamrl.study.probe import ProbeSpec, agent_gradients, probe_batch, transform_rewards
from teamrl.study.probe_report import amplification_points, effect_rows, ratio_rows, slope_interval, write_probe_report
from tests.study.runs import TINY
from tests.train.test_learner import make_rows, settings


def _learner(model, **kw):
    from teamrl.learner.learner import TorchLearner

    return TorchLearner("m", model, settings(**kw), {})


def _hand_gradient(model, rows, agent: str) -> torch.Tensor:
    """-(1/T) Σ_{rows of agent} A_r Σ_t ∇ log p(token_t): the token-mean policy gradient at ratio 1, T = every
    row's reply tokens, written out with a plain forward pass."""
    model.zero_grad(set_to_none=True)
    total_tokens = sum(len(r.response_ids) for r in rows)
    loss = torch.zeros(())
    for r in rows:
        if r.agent != agent:
            continue
        ids = torch.tensor([r.prompt_ids + r.response_ids])
        logits = model(ids).logits[0, len(r.prompt_ids) - 1: -1].float()  # [R, V] predicting each reply token
        logp = torch.log_softmax(logits, -1).gather(1, torch.tensor(r.response_ids)[:, None]).sum()
        loss = loss - r.advantage * logp / total_tokens
    loss.backward()
    g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    return g


@pytest.mark.parametrize("preset", ["grpo", "drmas"])
def test_each_agents_probe_gradient_is_its_hand_computed_policy_gradient(tokenizer, preset):
    from tests.conftest import make_tiny_model

    model = make_tiny_model(tokenizer)
    rows = make_rows(tokenizer, n=8)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    adv = advantages_for(rows, rewards, get_estimator(preset), eps=1e-6)
    for s, a in zip(rows, adv.tolist()):
        s.advantage = a
    got = agent_gradients({"m": _learner(model, old_logprobs="recompute")}, rows, keep=torch.float32)  # ratio 1, as the quickstart
    for agent in ("solver", "verifier"):
        want = _hand_gradient(model, rows, agent)
        torch.testing.assert_close(got.vectors[agent], want, rtol=1e-4, atol=1e-6)
        assert got.sq[agent] == pytest.approx(float(want.pow(2).sum()), rel=1e-4)
    assert all(p.grad is None for p in model.parameters())  # cleared: the probe leaves no gradient behind


def test_the_agents_probe_gradients_add_up_to_the_training_updates_gradient(tokenizer):
    """The training update (one optimizer step, no clipping) steps along exactly Σ_k g_k."""
    from tests.conftest import make_tiny_model

    model = make_tiny_model(tokenizer)
    rows = make_rows(tokenizer, n=8)
    learner = _learner(model, grad_clip=0.0)
    probed = agent_gradients({"m": learner}, rows, keep=torch.float32)
    seen = []
    learner.optimizer.register_step_pre_hook(
        lambda opt, *_: seen.append(torch.cat([p.grad.reshape(-1).clone() for p in model.parameters()])))
    learner.update(rows)
    torch.testing.assert_close(seen[0], probed.vectors["solver"] + probed.vectors["verifier"], rtol=1e-5, atol=1e-8)


def test_reward_transform_moves_one_agents_mean_and_spread_within_each_group():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    prompts = torch.tensor([0, 0, 0, 1, 1, 1])
    mask = torch.tensor([True, True, False, True, False, False])
    out = transform_rewards(r, prompts, mask, shift=1.0, scale=3.0)
    # group 0, agent rows 1 and 0: mean 0.5 -> 0.5 + 3(±0.5) + 1 = 3.0 and 0.0; group 1: its one row stays 1 + 1
    assert out.tolist() == [3.0, 0.0, 0.0, 2.0, 1.0, 1.0]


def test_agent_wise_advantages_ignore_the_sweep_transform_and_global_ones_do_not(tokenizer):
    rows = make_rows(tokenizer, n=8)
    r = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    prompts = torch.zeros(8, dtype=torch.long)
    mask = torch.tensor([s.agent == "solver" for s in rows])
    r2 = transform_rewards(r, prompts, mask, shift=2.0, scale=2.0)
    for name, same in (("drmas", True), ("grpo_step", False)):
        a, b = (advantages_for(rows, x, get_estimator(name), eps=1e-6) for x in (r, r2))
        assert torch.allclose(a, b, atol=1e-5) is same


def test_probe_batch_rows_cosines_and_sweep(tokenizer):
    from tests.conftest import make_tiny_model

    model = make_tiny_model(tokenizer)
    rows = make_rows(tokenizer, n=8)
    for i, s in enumerate(rows):
        s.prompt_index = i // 4
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    spec = ProbeSpec(sweep="solver", shifts=(0.0, 1.0), scales=(1.0, 2.0))
    out, sweep = probe_batch({"m": _learner(model)}, rows, rewards, spec, eps=1e-6, tag={"seed": 0, "batch": 0})
    assert sorted((r["preset"], r["agent"]) for r in out) == sorted(
        (p, a) for p in spec.presets for a in ("solver", "verifier"))
    by = {(r["preset"], r["agent"]): r for r in out}
    # drmas: the solver's rows are (1, 0) in both groups; z-scores with the sample std (n - 1 = 1):
    # ±0.5 / 0.7071 = ±0.7071, so the mean square is 0.5
    assert by[("drmas", "solver")]["adv_sq_mean"] == pytest.approx(0.5, abs=1e-4)
    # a preset's gradient has cosine 1 with itself nowhere listed, and cosines are symmetric
    assert by[("grpo", "solver")]["cos"]["drmas"] == pytest.approx(by[("drmas", "solver")]["cos"]["grpo"])
    assert "grpo" not in by[("grpo", "solver")]["cos"]
    # sweep: at the identity transform drmas is its own base (measured 1) and grpo_step matches the grid's row
    ident = {r["preset"]: r for r in sweep if (r["shift"], r["scale"]) == (0.0, 1.0)}
    assert ident["drmas"]["measured"] == pytest.approx(1.0)
    assert ident["grpo_step"]["grad_sq"] == pytest.approx(by[("grpo_step", "solver")]["grad_sq"], rel=1e-6)
    assert len(sweep) == 4 * 2  # (shift, scale) in {0, 1} x {1, 2}, two presets each
    scaled = {r["preset"]: r for r in sweep if (r["shift"], r["scale"]) == (0.0, 2.0)}
    assert scaled["drmas"]["measured"] == pytest.approx(1.0, rel=1e-3)  # agent-wise: invariant to the transform
    # each group: solver (1, 0) -> (1.5, -0.5), verifier (0, 1); mu = 0.5, sigma^2 = (1 + 1 + .25 + .25) / 4 = 0.625,
    # the solver's mean square deviation 1, so F = 1 / 0.625 = 1.6 (it was 1: equal spreads, equal means)
    assert ident["grpo_step"]["predicted"] == pytest.approx(1.0)
    assert scaled["grpo_step"]["predicted"] == pytest.approx(1.6)


def _row(agent, preset, batch, sq, f=1.0):
    return {"seed": 0, "batch": batch, "agent": agent, "preset": preset, "grad_sq": sq, "F_pred": f}


def test_report_statistics_by_hand():
    # two batches; solver's squared norms per cell: grpo 1, grpo_step 2, agent_episode 4, drmas 16 (batch 0)
    # and 2, 4, 8, 32 (batch 1): on the log scale both batches give the same contrasts
    rows = []
    for b, k in ((0, 1.0), (1, 2.0)):
        for preset, sq in (("grpo", 1.0), ("grpo_step", 2.0), ("agent_episode", 4.0), ("drmas", 16.0)):
            rows.append(_row("solver", preset, b, k * sq, f=8.0))
    ratios = {r["preset"]: r["log_ratio"] for r in ratio_rows(rows, "grpo")}
    assert math.exp(ratios["drmas"].mean) == pytest.approx(16.0) and ratios["drmas"].half == pytest.approx(0.0)
    (e,) = effect_rows(rows)
    # statistics: ((log4 - log1) + (log16 - log2)) / 2 = (log4 + log8) / 2; counting: (log2 + log4) / 2;
    # interaction: log(16/2) - log(4/1) = log 2; the two main effects add up to log 16 = drmas - grpo
    assert e["per-agent statistics"].mean == pytest.approx((math.log(4) + math.log(8)) / 2)
    assert e["per-call counting"].mean == pytest.approx((math.log(2) + math.log(4)) / 2)
    assert e["interaction"].mean == pytest.approx(math.log(2))
    assert e["share per-agent statistics"] + e["share per-call counting"] == pytest.approx(1.0)
    assert e["share per-agent statistics"] == pytest.approx(5 / 8)  # (2 + 3) / 2 of log2-units over 4
    points = amplification_points(rows)
    assert [p["measured"] for p in points] == [2.0 / 16.0] * 2 and points[0]["predicted"] == 8.0


def test_slope_of_exact_power_law_points_is_its_exponent():
    pts = [{"predicted": x, "measured": 0.5 * x ** 1.5} for x in (1.0, 2.0, 4.0, 8.0, 16.0)]
    fit = slope_interval(pts, reps=200)
    assert fit["slope"] == pytest.approx(1.5) and fit["low"] == pytest.approx(1.5) and fit["high"] == pytest.approx(1.5)
    assert math.exp(fit["intercept"]) == pytest.approx(0.5)


def test_probe_spec_refuses_bad_settings():
    with pytest.raises(ValueError, match="grop"):
        ProbeSpec(presets=("grop",))
    with pytest.raises(ValueError, match="scale"):
        ProbeSpec(scales=(0.0,))
    with pytest.raises(ValueError, match="batches"):
        ProbeSpec(batches=0)


def test_probe_command_end_to_end_with_a_tiny_model(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "probe"
    rc = main(["probe", "--batches", "2", "--seeds", "1", "--out", str(out), "--sweep", "solver", "--shifts", "0,1",
               f"models.main.path={tiny_model_dir}", *TINY, "train.threads=1"])
    assert rc == 0
    rows = [json.loads(line) for line in (out / "probe_rows.jsonl").read_text().splitlines()]
    assert {r["batch"] for r in rows} == {0, 1}
    assert {r["preset"] for r in rows} == {"grpo", "grpo_step", "agent_episode", "drmas"}
    assert all(r["model"] == "main" and r["grad_sq"] >= 0 and "cos" in r for r in rows)
    sweep = [json.loads(line) for line in (out / "sweep_rows.jsonl").read_text().splitlines()]
    assert {(r["shift"], r["preset"]) for r in sweep} == {(0.0, "grpo_step"), (0.0, "drmas"), (1.0, "grpo_step"),
                                                          (1.0, "drmas")}
    report = (out / "probe_report.md").read_text()
    assert "relative to grpo" in report and "Heterogeneity sweep" in report
    assert write_probe_report(out) == out / "probe_report.md"  # --report-only rewrites it from the rows
    assert main(["probe", "--report-only", "--out", str(out)]) == 0
    assert main(["probe", "--presets", "grpo,nope", "--out", str(out)]) == 2
    assert "nope" in capsys.readouterr().err


def test_sweep_slope_is_the_power_law_exponent_and_skips_constant_predictions():
    from teamrl.study.probe_report import sweep_slopes

    sweep = []
    for batch, noise in enumerate((0.9, 1.0, 1.1)):
        for shift, f in ((0.0, 1.0), (1.0, 2.0), (2.0, 4.0)):
            sweep.append({"agent": "verifier", "preset": "grpo_step", "seed": 0, "batch": batch, "shift": shift,
                          "scale": 1.0, "predicted": f, "measured": noise * f ** 2})
            sweep.append({"agent": "verifier", "preset": "drmas", "seed": 0, "batch": batch, "shift": shift,
                          "scale": 1.0, "predicted": 1.0, "measured": 1.0})
    (fit,) = sweep_slopes(sweep, reps=200)  # drmas: predicted constant, no slope
    assert fit["preset"] == "grpo_step" and fit["n"] == 9
    assert fit["slope"] == pytest.approx(2.0) and fit["low"] == pytest.approx(2.0) and fit["high"] == pytest.approx(2.0)
    assert (fit["predicted_min"], fit["predicted_max"]) == pytest.approx((1.0, 4.0))


def test_batch_bootstrap_resamples_whole_batches():
    # two batches with opposite slopes: resampling points mixes them, resampling batches gives one or the other
    pts = [{"seed": 0, "batch": b, "predicted": x, "measured": x ** (1.0 if b == 0 else 3.0)}
           for b in (0, 1) for x in (1.0, 2.0, 4.0)]
    fit = slope_interval(pts, reps=400, by_batch=True)
    assert fit["slope"] == pytest.approx(2.0)
    assert fit["low"] == pytest.approx(1.0) and fit["high"] == pytest.approx(3.0)
