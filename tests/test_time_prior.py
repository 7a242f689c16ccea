"""The time plan's work prior (teamrl.plan.prior): the shares of the caps' work a run does, measured from a run's
counts, applied to a config's plan, read from an earlier run (--plan-from) and shipped per workflow and task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from teamrl._cli import run_prior
from teamrl.cli import main
from teamrl.config.schema import load_config
from teamrl.plan.limits import Limits
from teamrl.plan.prior import NONE, PRIORS, WorkPrior, prior_for
from teamrl.plan.timing import base_counts, measure, plan_time

REPO = Path(__file__).resolve().parents[1]
CPU = Limits("test cpu", 100.0, 400.0, 20.0, "by hand")


def quickstart(*over: str):
    return load_config(REPO / "configs" / "quickstart.yaml", ["models.main.rollout_dtype=bfloat16", *over])


def test_the_caps_work_by_hand():
    # 8 problems x 8 episodes, two loops of a solver (32 tokens) and a verifier (16) on one model
    base = base_counts(quickstart())
    assert base["decoded"] == pytest.approx(0.75 * 64 * 2 * (32 + 16))
    assert base["prefill"] == pytest.approx(100 * 64 * 2 * 2)
    assert base["steps"] == pytest.approx(0.95 * 2 * (32 + 16))  # each call's 64 rows at once, to the longest
    assert base["trained"] > 0


def test_a_prior_is_the_measured_counts_over_the_caps_work():
    cfg = quickstart()
    base = base_counts(cfg)
    rows = [{"perf/rollout/s": 10.0, "perf/rollout/decoded_tokens": 0.5 * base["decoded"],
             "perf/rollout/decode_steps": 0.8 * base["steps"], "perf/rollout/prefill_tokens": 0.25 * base["prefill"],
             "perf/update_tokens_computed": 0.4 * base["trained"], "perf/rollout/host_s": 3.2},
            {"perf/rollout/s": 10.0, "perf/rollout/decoded_tokens": 0.7 * base["decoded"],
             "perf/rollout/decode_steps": 0.8 * base["steps"], "perf/rollout/prefill_tokens": 0.25 * base["prefill"],
             "perf/update_tokens_computed": 0.6 * base["trained"], "perf/rollout/host_s": 6.4},
            {"eval/accuracy": 0.5}]  # not a training step
    p = measure(cfg, rows, "by hand")
    assert (p.decoded, p.steps, p.prefill, p.trained) == pytest.approx((0.6, 0.8, 0.25, 0.5))
    assert p.host_s == pytest.approx(4.8 / 64)  # per episode: 8 problems x 8
    with pytest.raises(ValueError, match="no training step"):
        measure(cfg, [{"eval/accuracy": 0.5}], "an evaluation only")


def test_a_prior_scales_the_work_each_phase_is_planned_from():
    cfg = quickstart()
    plain = {p.phase: p for p in plan_time(cfg, CPU, on_gpu=False, prior=NONE)}
    half = WorkPrior(decoded=0.5, steps=0.5, prefill=0.5, trained=0.25, host_s=0.1, source="by hand")
    scaled = {p.phase: p for p in plan_time(cfg, CPU, on_gpu=False, prior=half)}
    for phase in ("rollout", "eval"):
        a, b = plain[phase].work["main"], scaled[phase].work["main"]
        assert (b.tokens, b.decode_steps, b.prefill) == pytest.approx((a.tokens / 2, a.decode_steps / 2, a.prefill / 2))
        assert b.flops < a.flops and b.nbytes < a.nbytes
    assert scaled["update"].work["main"].tokens == pytest.approx(plain["update"].work["main"].tokens / 4)
    assert scaled["rollout"].host_s == pytest.approx(0.1 * 64)
    assert scaled["eval"].host_s == pytest.approx(0.1 * 200 * 4)  # the evaluation's episodes
    assert plain["rollout"].host_s == 0.0


def test_every_shipped_config_has_a_prior_for_its_workflow_and_task():
    missing = {}
    for path in sorted((REPO / "configs").glob("*.yaml")):
        cfg = load_config(path)
        if prior_for(cfg) is NONE:
            missing[path.stem] = (cfg.workflow.name, cfg.task.name)
    assert not missing, missing
    assert all(0 < p.decoded and 0 < p.steps and 0 < p.prefill and 0 <= p.trained for p in PRIORS.values())


def test_plan_from_an_earlier_run_reproduces_its_counts(tmp_path, tiny_model_dir, capsys):
    from teamrl.train.trainer import Trainer
    from tests.train.test_trainer import tiny_config

    cfg = tiny_config(tmp_path, tiny_model_dir, "run", "eval.before=false", "eval.after=false", "train.save_every=0")
    Trainer(cfg, progress=False).train()
    prior = run_prior(tmp_path / "run")
    saved = load_config(tmp_path / "run" / "config.yaml")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "perf/rollout/s" in r]
    base = base_counts(saved)
    mean = sum(r["perf/rollout/decoded_tokens"] for r in steps) / len(steps)
    assert prior.decoded * base["decoded"] == pytest.approx(mean, rel=1e-3)
    assert prior.source.startswith(f"the run {tmp_path / 'run'} (2 steps)")
    # the CLI: the same config planned from its own run says so
    rc = main(["train", str(tmp_path / "run" / "config.yaml"), f"run_dir={tmp_path / 'other'}", "--dry-run",
               "--plan-from", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert rc == 0 and f"time plan: work from the run {tmp_path / 'run'} (2 steps): decoded tokens x" in out


def test_plan_from_refusals_are_one_line(tmp_path, capsys):
    assert main(["train", "quickstart", "--plan-from", str(tmp_path)]) == 2
    assert "add --dry-run" in capsys.readouterr().err
    assert main(["train", "quickstart", "--dry-run", "--plan-from", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"--plan-from {tmp_path}: no config.yaml there" in err and "Traceback" not in err


def test_the_update_line_shows_checkpointings_recompute():
    from teamrl.plan.timing import format_time

    on = next(line for line in format_time(quickstart(), CPU, on_gpu=False).splitlines() if "plan: update" in line)
    off = next(line for line in format_time(quickstart("models.main.gradient_checkpointing=false"), CPU,
                                            on_gpu=False).splitlines() if "plan: update" in line)
    assert "checkpointing's recompute" in on and "checkpointing's recompute" not in off
    plans = {p.phase: p for p in plan_time(quickstart(), CPU, on_gpu=False, prior=NONE)}
    w = plans["update"].work["main"]
    assert w.recompute == pytest.approx(w.flops * 2 / 8)  # 2 of 8 P per token: every layer recomputed


def test_a_debate_is_planned_as_its_own_phase_per_teacher():
    cfg = quickstart("models.ta.path=default", "models.ta.trainable=false", "models.tb.path=default",
                     "models.tb.trainable=false", "algo.distill.teachers.solver=[ta,tb]", "algo.distill.loss=jsd",
                     "algo.distill.debate_rounds=2", "algo.distill.debate_max_tokens=100")
    plans = {p.phase: p for p in plan_time(cfg, CPU, on_gpu=False, prior=NONE)}
    debate = plans["debate"].work
    assert set(debate) == {"ta", "tb"}
    replies = 8 * 2 * 8  # the solver's replies of a step: 8 problems x 2 loops x 8 episodes
    assert debate["ta"].tokens == pytest.approx(2 * replies * 0.75 * 100)  # two rounds, one answer each
    assert "debate" not in {p.phase for p in plan_time(quickstart(), CPU, on_gpu=False)}
