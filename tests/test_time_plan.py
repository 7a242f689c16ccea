"""The time plan: the limits it is held against, each phase's floor from counted work, the engines' counts, and the
``time plan`` lines of ``--dry-run`` for every shipped config."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from teamrl.cli import main
from teamrl.config.schema import load_config
from teamrl.engines.base import GenRequest, SamplingParams
from teamrl.engines.hf import HFEngine
from teamrl.hardware import Hardware, resolve_config
from teamrl.metrics.phases import ADAMW_BYTES, ModelCost, PhaseMeter, decode_work, floor_s, update_work
from teamrl.plan.limits import Limits, cache_file, cpu_limits, gpu_limits
from teamrl.plan.shapes import SHAPES
from teamrl.plan.timing import LONGEST_SHARE, REPLY_SHARE, decode_plan, plan_time
from tests.conftest import config_marks, make_tiny_model

REPO = Path(__file__).resolve().parents[1]
CPU = Limits("test cpu", 100.0, 400.0, 20.0, "by hand")


def test_gpu_data_sheets_are_matched_by_the_device_name():
    h200 = gpu_limits("NVIDIA H200")
    assert (h200.bfloat16, h200.bandwidth) == (989_400.0, 4800.0)  # GFLOP/s, GB/s
    assert gpu_limits("NVIDIA H100 80GB HBM3").bandwidth == 3350.0
    assert gpu_limits("NVIDIA H100 PCIe").bfloat16 == 756_000.0  # before the SXM part's row
    assert gpu_limits("NVIDIA A100-SXM4-80GB") is not None and gpu_limits("Tesla T4") is None


def test_cpu_limits_are_measured_once_and_read_back_from_the_cache(tmp_path, monkeypatch):
    from teamrl.plan import limits

    monkeypatch.setenv("TEAMRL_CACHE", str(tmp_path))
    monkeypatch.setattr(limits, "others_share", lambda before, after: 0.0)  # the machine idle, whatever else runs
    first = cpu_limits(1)
    path = cache_file(1)
    assert path.is_file() and first.float32 > 0 and first.bfloat16 > 0 and first.bandwidth > 0
    stamp = path.stat().st_mtime_ns
    assert cpu_limits(1) == first and path.stat().st_mtime_ns == stamp  # read, not measured again
    path.write_text("{not json")  # a torn file is measured over
    assert cpu_limits(1).float32 > 0 and json.loads(path.read_text())["device"] == first.device


def test_a_measurement_taken_while_other_processes_use_the_cpus_is_used_but_not_cached(tmp_path, monkeypatch):
    from teamrl.plan import limits

    monkeypatch.setenv("TEAMRL_CACHE", str(tmp_path))
    monkeypatch.setattr(limits, "others_share", lambda before, after: 0.6)
    busy = cpu_limits(1)
    assert busy.busy == 0.6 and busy.float32 > 0 and not cache_file(1).exists()
    assert "other processes took 60% of the CPUs meanwhile: not cached" in busy.describe()


def test_the_share_of_the_cpus_other_processes_took_between_two_readings(monkeypatch):
    from teamrl.plan import limits
    from teamrl.plan.limits import _cpu_seconds, others_share

    monkeypatch.setattr(limits, "_cpus", lambda: {0, 1})
    # 2 s of wall on 2 CPUs: 4 CPU-seconds; all processes busy 3.5 s of it, this one 1.5 s: others 2 of 4
    assert others_share((10.0, 100.0, 5.0), (12.0, 103.5, 6.5)) == pytest.approx(0.5)
    assert others_share((10.0, 100.0, 5.0), (12.0, 101.0, 6.5)) == 0.0  # clamped: jiffies are coarser than times()
    assert others_share(None, (12.0, 101.0, 6.5)) == 0.0  # no /proc/stat
    reading = _cpu_seconds()  # this machine's, over the CPUs this process may use
    assert reading is None or (reading[1] > 0 and reading[2] > 0)


def test_a_floor_is_the_larger_of_products_at_the_peak_and_bytes_at_the_bandwidth():
    assert floor_s(4e9, 1e8, 100.0, 20.0) == pytest.approx(0.04)  # 40 ms of products, 5 ms of reads
    assert floor_s(1e8, 4e9, 100.0, 20.0) == pytest.approx(0.2)


def test_decode_and_update_work_by_hand():
    m = ModelCost(params=1000, trained=1000, layers=2, attn_width=8, kv_width=4, engine_bytes=2, weight_bytes=4,
                  train_dtype="float32", recompute=0.5)
    flops, nbytes = decode_work(m, {"prefill_tokens": 30, "decode_steps": 10, "decode_rows": 40, "decode_context": 500})
    assert flops == 2 * 1000 * 70 + 4 * 2 * 8 * 500
    assert nbytes == 10 * 1000 * 2 + 500 * 2 * 2 * 4 * 2
    flops, nbytes = update_work(m, {"perf/update_tokens_computed": 100, "perf/optimizer_steps": 2,
                                    "perf/micro_batches": 3})
    assert flops == 7 * 1000 * 100  # 6 + 2 x 0.5 recomputed
    assert nbytes == 2 * 1000 * ADAMW_BYTES + 3 * 3 * 1000 * 4


def test_the_meter_records_each_phase_and_its_share_of_the_floor():
    m = ModelCost(10**8, 10**8, 4, 256, 64, 2, 4, "float32")
    meter = PhaseMeter({"main": m}, CPU)
    work = {"main": {"prefill_tokens": 100, "decode_steps": 50, "decode_rows": 400, "decode_context": 4000,
                     "sync_s": 0.0}}
    floor = meter.decode_floor(work)
    flops, nbytes = decode_work(m, work["main"])
    assert floor == pytest.approx(max(flops / 400e9, nbytes / 20e9))  # bf16 engine: the bf16 peak
    out = meter.record("rollout", 2 * floor, floor)
    assert out["perf/rollout/limit_frac"] == pytest.approx(0.5)
    meter.record("rollout", 2 * floor, floor)
    assert meter.summary()["rollout"]["limit_frac"] == pytest.approx(0.5)
    assert PhaseMeter({"main": m}, None).decode_floor(work) is None  # no limits (the Ray backend): no floor


def test_the_engine_counts_the_steps_rows_and_prompt_tokens_it_runs(tokenizer):
    eng = HFEngine(make_tiny_model(tokenizer), tokenizer, seed=0, max_batch_size=8)
    prompt = list(tokenizer.apply_chat_template([{"role": "user", "content": "2+2?"}], add_generation_prompt=True,
                                                tokenize=True, return_dict=False))
    sp = SamplingParams(temperature=1.0, max_new_tokens=5, ignore_eos=True)
    outs = eng.generate([GenRequest(prompt, sp) for _ in range(4)])  # one group: the identical prompts run once
    w = eng.work
    assert all(len(o.response_ids) == 5 for o in outs)
    assert w["prefill_tokens"] == len(prompt)
    # the first token of each row comes from the prefill's logits, the last needs no forward: 4 forwards of 4 rows
    assert w["decode_steps"] == 4 and w["decode_rows"] == 16
    assert w["decode_context"] == sum(4 * (len(prompt) + i) for i in range(1, 5))


def test_decode_plan_by_hand():
    shape = SHAPES["default"]
    w = decode_plan(shape, 2, [(64, 32)], 64)
    assert w.decode_steps == pytest.approx(LONGEST_SHARE * 32)  # one batch, to its longest reply
    assert w.tokens == pytest.approx(64 * REPLY_SHARE * 32)
    queued = decode_plan(shape, 2, [(256, 32)], 16)
    assert queued.decode_steps == pytest.approx(256 * REPLY_SHARE * 32 / 16)  # a full queue: its tokens / 16 rows


def test_the_plan_of_the_quickstart_has_every_phase_it_runs():
    cfg = load_config(REPO / "configs" / "quickstart.yaml", ["models.main.rollout_dtype=bfloat16"])
    plans = {p.phase: p for p in plan_time(cfg, CPU, on_gpu=False)}
    assert {"rollout", "update", "sync", "eval"} <= set(plans) and "logprobs" not in plans
    assert all(p.planned_s > p.floor_s > 0 for p in plans.values())
    more = load_config(REPO / "configs" / "quickstart.yaml", ["models.main.rollout_dtype=bfloat16",
                                                               "rollout.batch_size=16"])
    doubled = {p.phase: p for p in plan_time(more, CPU, on_gpu=False)}
    assert doubled["update"].floor_s == pytest.approx(2 * plans["update"].floor_s, rel=0.05)


@pytest.mark.parametrize("name", [pytest.param(p.stem, marks=config_marks(p.stem))
                                  for p in sorted((REPO / "configs").glob("*.yaml"))])
def test_dry_run_prints_a_time_plan_line_per_phase(name, capsys):
    """Every shipped config's plans; one whose data lies in ../shared, where that folder is absent, then fails the
    run's own data check, after its plans."""
    rc = main(["train", name, "--dry-run"])
    captured = capsys.readouterr()
    out = captured.out
    assert rc == 0 or (rc == 2 and "shared/data" in captured.err and not (REPO.parent / "shared").is_dir()), captured.err
    phases = re.findall(r"^time plan: (\w+) +[0-9.]+ TFLOP +[0-9.]+ GB per (?:step|evaluation): floor [0-9.]+ (?:s|min|h) "
                        r"\((?:compute|memory)-bound\), planned ", out, re.M)
    assert {"rollout", "update"} <= set(phases), out
    assert re.search(r"^time plan: step ~[0-9.]+ (s|min|h), run ~[0-9.]+ (s|min|h) \(", out, re.M), out


def test_a_run_logs_each_phase_against_its_floor_and_sums_them_in_its_summary(tmp_path, tiny_model_dir):
    from teamrl._cli import format_time
    from teamrl.train.trainer import Trainer
    from tests.train.test_trainer import tiny_config

    cfg = tiny_config(tmp_path, tiny_model_dir, "run", "models.main.rollout_dtype=bfloat16", "eval.after=false",
                      "train.save_every=0", "algo.format_penalty=0", "loss.entropy_coef=0.01")
    Trainer(cfg, progress=False).train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "perf/rollout/s" in r]
    assert len(steps) == 2
    for r in steps:
        for phase in ("rollout", "update"):
            assert r[f"perf/{phase}/s"] > 0 and r[f"perf/{phase}/floor_s"] > 0
            assert 0 < r[f"perf/{phase}/limit_frac"] == pytest.approx(r[f"perf/{phase}/floor_s"] / r[f"perf/{phase}/s"])
        assert r["perf/rollout/engine_s"] + r["perf/rollout/host_s"] == pytest.approx(r["perf/rollout/s"])
        assert r["perf/rollout/decoded_tokens"] > 0 and r["perf/rollout/decode_steps"] > 0
        # a bf16 rollout copy over float32 weights: a weight sync every step, timed apart from both phases
        assert r["perf/sync/s"] > 0 and r["perf/rollout/s"] + r["perf/update/s"] <= r["perf/step_s"] + 1e-6
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["time"]["update"]["s"] == pytest.approx(sum(r["perf/update/s"] for r in steps), abs=0.02)
    assert summary["time_evals"]["before"]["s"] > 0
    line = format_time(tmp_path / "run")
    assert line.startswith("time by phase (share of its floor): rollout ") and "eval before" in line


# Measured: benchmarks/time_vs_measured.py --set train.threads=1 on an AMD EPYC (family 25 model 17, AVX-512 BF16,
# 2 vCPUs, another job on the second core), one thread, 2026-12-04: per config and phase, the seconds of the last of
# 2 steps, and of one evaluation of 4 problems before training. docs/time.md has the whole table; the plans' shipped
# priors (teamrl.plan.prior.PRIORS) are the first steps of the same runs.
LIMITS = Limits("AMD EPYC (family 25 model 17)", 70.0, 202.0, 27.6, "measured 2026-12-04, 1 thread")
HW = Hardware(cpu_bf16="avx512_bf16", cpu_bf16_speed=2.56)  # what the runs resolved `auto` with
MEASURED: dict[str, dict[str, float]] = {
    'agent_program': {'rollout': 27.96, 'update': 24.81, 'sync': 0.29, 'eval': 11.94},
    'code_pair': {'rollout': 17.07, 'update': 32.64, 'sync': 1.01, 'eval': 10.48},
    'code_single': {'rollout': 13.0, 'update': 31.83, 'sync': 1.0, 'eval': 4.47},
    'code_team': {'rollout': 37.12, 'update': 100.44, 'sync': 0.29, 'eval': 18.66},
    'code_tree': {'rollout': 13.67, 'update': 21.51, 'sync': 0.32, 'eval': 6.88},
    'math_team_c3': {'rollout': 21.04, 'update': 12.73, 'sync': 0.3, 'eval': 5.53},
    'math_team_hetero': {'rollout': 19.41, 'update': 59.17, 'sync': 1.54, 'eval': 6.47},
    'math_team_lora': {'rollout': 72.22, 'update': 69.01, 'eval': 27.32},
    'math_team_mars2': {'rollout': 12.35, 'logprobs': 6.76, 'update': 34.54, 'sync': 1.54, 'eval': 1.57},
    'math_team_separate': {'rollout': 17.58, 'update': 43.68, 'sync': 1.53, 'eval': 6.25},
    'math_team_sharp': {'rollout': 17.53, 'update': 45.53, 'sync': 0.35, 'eval': 6.05},
    'openenv_guess': {'rollout': 7.65, 'update': 22.87, 'sync': 0.16, 'eval': 3.91},
    'openenv_tools': {'rollout': 80.79, 'update': 26.55, 'sync': 0.16, 'eval': 16.17},
    'plan_path_at_grpo': {'rollout': 46.15, 'logprobs': 19.22, 'update': 67.11, 'sync': 0.32, 'eval': 28.77},
    'plan_path_at_grpo_separate': {'rollout': 44.63, 'logprobs': 17.68, 'update': 44.58, 'sync': 0.55, 'eval': 30.44},
    'plan_path_single': {'rollout': 8.2, 'update': 26.8, 'sync': 0.3, 'eval': 5.5},
    'quickstart': {'rollout': 17.14, 'update': 44.91, 'sync': 0.37, 'eval': 5.68},
    'reasoning_gym_single': {'rollout': 1.52, 'update': 5.82, 'sync': 0.32, 'eval': 1.31},
    'reasoning_gym_team': {'rollout': 10.14, 'update': 23.9, 'sync': 0.39, 'eval': 5.97},
    'search_quickstart': {'rollout': 8.6, 'update': 16.1, 'sync': 0.32, 'eval': 3.45},
    'sokoban_at_grpo': {'rollout': 47.1, 'logprobs': 19.65, 'update': 36.27, 'sync': 0.45, 'eval': 28.98},
    'sokoban_single': {'rollout': 7.04, 'update': 21.29, 'sync': 0.3, 'eval': 5.45},
    'sudoku_at_grpo': {'rollout': 52.79, 'logprobs': 14.64, 'update': 0.09, 'sync': 0.43, 'eval': 34.26},
    'sudoku_single': {'rollout': 9.11, 'update': 0.07, 'sync': 0.54, 'eval': 7.18},
    'tictactoe_selfplay': {'rollout': 4.68, 'update': 14.57, 'sync': 0.35, 'eval': 2.44},
    'verifiers_arith': {'rollout': 4.1, 'update': 7.7, 'sync': 0.16, 'eval': 3.3},
    'verifiers_two_seat': {'rollout': 9.28, 'update': 5.16, 'sync': 0.15, 'eval': 4.08},
}
WITHIN_A_QUARTER = {"rollout": (23, 27), "update": (12, 27), "eval": (18, 27), "logprobs": (2, 5), "sync": (22, 26)}
"""Per phase, (phases whose plan from the config and its shipped prior is within 25% of the measured seconds, phases
measured); the weight sync, under a second a step, is counted within 0.5 s instead (SYNC_SLACK_S). The misses, and
why, are in docs/time.md: mostly an update whose rows trained differ between the first step (the prior) and the
second."""
SYNC_SLACK_S = 0.5


def planned_from_the_config(name: str) -> dict[str, float]:
    cfg = resolve_config(load_config(REPO / "configs" / f"{name}.yaml", ["train.steps=2", "eval.problems=4",
                                                                         "train.threads=1"]), HW)
    return {p.phase: p.planned_s for p in plan_time(cfg, LIMITS, on_gpu=False)}


def test_every_shipped_config_is_measured():
    assert set(MEASURED) == {p.stem for p in (REPO / "configs").glob("*.yaml")}


def test_the_plan_from_the_config_is_within_a_quarter_of_the_measured_time_on_most_shipped_configs():
    within: dict[str, list[int]] = {}
    for name, phases in MEASURED.items():
        plan = planned_from_the_config(name)
        for phase, measured in phases.items():
            w = within.setdefault(phase, [0, 0])
            w[1] += 1
            if phase not in plan:  # a phase the plan does not foresee (math_team_mars2's log-probs) is a miss
                continue
            ratio = plan[phase] / measured
            w[0] += abs(plan[phase] - measured) <= SYNC_SLACK_S if phase == "sync" else 0.75 <= ratio <= 1.25
    assert {k: tuple(v) for k, v in within.items()} == WITHIN_A_QUARTER, within
