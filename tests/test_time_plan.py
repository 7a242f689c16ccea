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
from teamrl.plan.prior import WorkPrior
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


# Measured: benchmarks/time_vs_measured.py --steps 4 --prior-steps 2 --set train.threads=1 on an AMD EPYC (family 25
# model 17, AVX-512 BF16, 2 vCPUs, another job on the second core), one thread, 2026-12-04: per config and phase, the
# mean seconds of steps 3 and 4, and of one evaluation of 4 problems before training. docs/time.md has the whole
# table; the plans' shipped priors (teamrl.plan.prior.PRIORS) are steps 1 and 2 of the same runs.
LIMITS = Limits("AMD EPYC (family 25 model 17)", 70.0, 202.0, 27.6, "measured 2026-12-04, 1 thread")
HW = Hardware(cpu_bf16="avx512_bf16", cpu_bf16_speed=2.56)  # what the runs resolved `auto` with
MEASURED: dict[str, dict[str, float]] = {
    'agent_program': {'rollout': 25.09, 'update': 30.45, 'sync': 0.25, 'eval': 5.29},
    'code_pair': {'rollout': 15.66, 'update': 18.66, 'sync': 0.66, 'eval': 10.03},
    'code_single': {'rollout': 12.17, 'update': 17.98, 'sync': 0.3, 'eval': 4.52},
    'code_team': {'rollout': 32.95, 'update': 87.13, 'sync': 0.3, 'eval': 18.18},
    'code_tree': {'rollout': 11.17, 'update': 16.07, 'sync': 0.28, 'eval': 4.04},
    'math_team_c3': {'rollout': 20.29, 'update': 4.53, 'sync': 0.3, 'eval': 5.74},
    'math_team_hetero': {'rollout': 17.38, 'update': 49.74, 'sync': 0.6, 'eval': 7.09},
    'math_team_lora': {'rollout': 87.94, 'update': 74.31, 'eval': 27.87},
    'math_team_mars2': {'rollout': 7.93, 'logprobs': 3.63, 'update': 21.42, 'sync': 0.58, 'eval': 1.55},
    'math_team_separate': {'rollout': 16.53, 'update': 35.88, 'sync': 0.49, 'eval': 5.88},
    'math_team_sharp': {'rollout': 14.96, 'update': 34.73, 'sync': 0.32, 'eval': 6.01},
    'openenv_guess': {'rollout': 11.34, 'update': 33.56, 'sync': 0.22, 'eval': 6.32},
    'openenv_tools': {'rollout': 66.71, 'update': 100.62, 'sync': 0.16, 'eval': 17.59},
    'plan_path_at_grpo': {'rollout': 40.24, 'logprobs': 11.3, 'update': 42.92, 'sync': 0.33, 'eval': 28.16},
    'plan_path_at_grpo_separate': {'rollout': 38.96, 'logprobs': 12.05, 'update': 45.19, 'sync': 0.54, 'eval': 28.41},
    'plan_path_single': {'rollout': 6.87, 'update': 19.38, 'sync': 0.32, 'eval': 5.6},
    'quickstart': {'rollout': 16.8, 'update': 41.28, 'sync': 0.31, 'eval': 5.71},
    'reasoning_gym_single': {'rollout': 1.55, 'update': 3.95, 'sync': 0.3, 'eval': 1.28},
    'reasoning_gym_team': {'rollout': 9.56, 'update': 25.02, 'sync': 0.3, 'eval': 5.69},
    'search_quickstart': {'rollout': 7.56, 'update': 16.95, 'sync': 0.3, 'eval': 3.32},
    'sokoban_at_grpo': {'rollout': 44.95, 'logprobs': 20.14, 'update': 74.79, 'sync': 0.32, 'eval': 26.91},
    'sokoban_single': {'rollout': 7.94, 'update': 19.47, 'sync': 0.38, 'eval': 5.11},
    'sudoku_at_grpo': {'rollout': 51.03, 'logprobs': 0.0, 'update': 0.1, 'sync': 0.44, 'eval': 34.05},
    'sudoku_single': {'rollout': 8.72, 'update': 0.08, 'sync': 0.44, 'eval': 7.25},
    'tictactoe_selfplay': {'rollout': 5.66, 'update': 18.19, 'sync': 0.38, 'eval': 2.43},
    'verifiers_arith': {'rollout': 4.37, 'update': 5.8, 'sync': 0.15, 'eval': 2.15},
    'verifiers_two_seat': {'rollout': 9.01, 'update': 14.32, 'sync': 0.15, 'eval': 3.83},
    'verifiers_v1_sum': {'rollout': 40.35, 'update': 2.97, 'sync': 1.66, 'eval': 17.19},
    'verifiers_v1_two_seat': {'rollout': 59.74, 'update': 22.16, 'sync': 0.88, 'eval': 51.77},
}
# the compared steps' own counts against the caps' (decoded, steps, prefill, trained, host s per episode), and the
# evaluation's
COUNTED: dict[str, tuple[WorkPrior, WorkPrior | None]] = {
    'agent_program': (WorkPrior(0.8179, 1.009, 0.1625, 0.3803, 0.04572), WorkPrior(1.059, 1.009, 0.2625, 1, 0.1152)),
    'code_pair': (WorkPrior(1.21, 1.036, 0.2844, 0.5474, 0.04975), WorkPrior(1.222, 1.036, 0.2931, 1, 0.08996)),
    'code_single': (WorkPrior(1.183, 1.036, 0.0667, 0.5271, 0.04942), WorkPrior(1.044, 1.036, 0.1388, 1, 0.07858)),
    'code_team': (WorkPrior(1.255, 0.5181, 0.5137, 0.9184, 0.06337), WorkPrior(1.245, 0.5181, 0.6245, 1, 0.1019)),
    'code_tree': (WorkPrior(0.679, 0.5181, 0.4943, 0.6061, 0.09261), WorkPrior(0.9361, 1, 2.26, 1, 0.0602)),
    'math_team_c3': (WorkPrior(0.5877, 1.678, 0.2688, 0.0256, 0.00312), WorkPrior(0.605, 1.009, 0.2309, 1, 0.004806)),
    'math_team_hetero': (WorkPrior(0.5566, 0.9926, 0.229, 0.3819, 0.00168), WorkPrior(0.5972, 1.009, 0.2719, 1, 0.005638)),
    'math_team_lora': (WorkPrior(0.6291, 1.053, 0.6151, 0.4366, 0.00493), WorkPrior(0.6467, 1.053, 0.4913, 1, 0.01466)),
    'math_team_mars2': (WorkPrior(0.3727, 0.625, 0.3433, 0.5234, 0.01102), WorkPrior(0.9922, 1.02, 0.07562, 1, 0.002556)),
    'math_team_separate': (WorkPrior(0.5352, 1.009, 0.2294, 0.332, 0.00148), WorkPrior(0.5972, 1.009, 0.2719, 1, 0.005881)),
    'math_team_sharp': (WorkPrior(0.4896, 1.009, 0.2091, 0.3265, 0.00223), WorkPrior(0.605, 1.009, 0.2309, 1, 0.004481)),
    'openenv_guess': (WorkPrior(1.136, 0.9649, 0.0247, 0.2113, 0.02185), WorkPrior(1.087, 0.9649, 0.085, 1, 0.00825)),
    'openenv_tools': (WorkPrior(1.015, 1.036, 0.6871, 0.5624, 0.0458), WorkPrior(1.19, 1.036, 1.643, 1, 0.04666)),
    'plan_path_at_grpo': (WorkPrior(1.034, 0.259, 1.165, 0.4984, 0.351), WorkPrior(1.312, 1.036, 1.623, 1, 0.1569)),
    'plan_path_at_grpo_separate': (WorkPrior(1.074, 0.259, 1.214, 0.538, 0.3588), WorkPrior(1.312, 1.036, 1.67, 1, 0.1555)),
    'plan_path_single': (WorkPrior(1.047, 1.02, 0.3133, 0.635, 0.00528), WorkPrior(1.236, 1.02, 0.5725, 1, 0.0095)),
    'quickstart': (WorkPrior(0.5521, 1.009, 0.2491, 0.3713, 0.0021), WorkPrior(0.605, 1.009, 0.2309, 1, 0.004287)),
    'reasoning_gym_single': (WorkPrior(0.25, 0.1974, 0.066, 0.3379, 0.00105), WorkPrior(0.7083, 0.9868, 0.1581, 1, 0.004631)),
    'reasoning_gym_team': (WorkPrior(0.3408, 0.6743, 0.1278, 0.2064, 0.00259), WorkPrior(0.5768, 0.9868, 0.3137, 1, 0.004613)),
    'search_quickstart': (WorkPrior(0.3822, 0.6702, 0.2715, 0.4227, 0.00733), WorkPrior(0.4688, 0.5016, 0.3875, 1, 0.01525)),
    'sokoban_at_grpo': (WorkPrior(1.297, 0.259, 1.381, 0.8947, 0.4013), WorkPrior(1.312, 1.036, 1.474, 1, 0.1507)),
    'sokoban_single': (WorkPrior(1.247, 1.02, 0.3409, 0.6746, 0.00662), WorkPrior(1.255, 1.02, 0.4242, 1, 0.01153)),
    'sudoku_at_grpo': (WorkPrior(1.305, 0.259, 1.713, 0, 0.376), WorkPrior(1.312, 1.036, 2.009, 1, 0.1697)),
    'sudoku_single': (WorkPrior(1.286, 1.02, 0.4444, 0, 0.00258), WorkPrior(1.292, 1.02, 0.9483, 1, 0.01066)),
    'tictactoe_selfplay': (WorkPrior(0.0885, 0.1842, 0.1638, 0.186, 0.00751), WorkPrior(0.1, 0.1053, 0.5885, 1, 0.01397)),
    'verifiers_arith': (WorkPrior(1.136, 1.009, 0.0362, 0.3424, 0.02966), WorkPrior(1.083, 1.009, 0.0875, 1, 0.03844)),
    'verifiers_two_seat': (WorkPrior(1.09, 0.9942, 0.2076, 0.6006, 0.03452), WorkPrior(1.259, 0.9942, 0.2606, 1, 0.03815)),
    'verifiers_v1_sum': (WorkPrior(1.237, 2.467, 0.048, 0.1886, 0.8038), WorkPrior(1.188, 0.9868, 0.08125, 1, 1.813)),
    'verifiers_v1_two_seat': (WorkPrior(1.079, 1.875, 0.2672, 0.8428, 1.293), WorkPrior(1.205, 2.018, 0.3075, 1, 4.611)),
}
WITHIN_A_QUARTER = {"rollout": (22, 29), "update": (13, 29), "eval": (19, 29), "logprobs": (1, 5), "sync": (25, 28)}
"""Per phase, (phases whose plan from the config and its shipped prior is within 25% of the measured seconds, phases
measured); a phase under a few seconds (the weight sync, an update that trains no row) is counted within
:data:`SLACK_S` instead. The misses, and why, are in docs/time.md: the work a step does moves while the team learns
(on most configs steps 3-4 train fewer tokens than steps 1-2, on a few many more), which no prior from earlier steps
foresees; given the work, :data:`WITHIN_A_QUARTER_OF_THE_WORK` holds."""
WITHIN_A_QUARTER_OF_THE_WORK = {"rollout": (28, 29), "update": (25, 29), "eval": (27, 29), "logprobs": (4, 5),
                                "sync": (25, 28)}
"""The same, planned from the work the compared steps (and the evaluation) counted: :data:`COUNTED`."""
SLACK_S = 0.5

def planned_from_the_config(name: str) -> dict[str, float]:
    cfg = resolve_config(load_config(REPO / "configs" / f"{name}.yaml", ["train.steps=2", "eval.problems=4",
                                                                         "train.threads=1"]), HW)
    return {p.phase: p.planned_s for p in plan_time(cfg, LIMITS, on_gpu=False)}


def test_every_shipped_config_is_measured():
    assert set(MEASURED) == {p.stem for p in (REPO / "configs").glob("*.yaml")}


def within(plan: dict[str, float], phase: str, measured: float) -> bool:
    planned = plan.get(phase, 0.0)  # a phase the plan does not foresee is planned at 0 s
    return abs(planned - measured) <= SLACK_S or (measured > 0 and 0.75 <= planned / measured <= 1.25)


def count_within(plans: dict[str, dict[str, dict[str, float]]]) -> dict[str, tuple[int, int]]:
    out: dict[str, list[int]] = {}
    for name, phases in MEASURED.items():
        for phase, measured in phases.items():
            w = out.setdefault(phase, [0, 0])
            w[0] += within(plans[name][phase if phase == "eval" else "step"], phase, measured)
            w[1] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


def test_the_plan_from_the_config_is_within_a_quarter_of_the_measured_time_on_most_shipped_configs():
    plans = {name: dict.fromkeys(("step", "eval"), planned_from_the_config(name)) for name in MEASURED}
    assert count_within(plans) == WITHIN_A_QUARTER


def test_the_plan_of_the_work_a_run_counted_is_within_a_quarter_of_its_time():
    plans = {}
    for name in MEASURED:
        step, ev = COUNTED[name]
        cfg = resolve_config(load_config(REPO / "configs" / f"{name}.yaml", ["train.steps=2", "eval.problems=4",
                                                                             "train.threads=1"]), HW)
        plans[name] = {k: {p.phase: p.planned_s for p in plan_time(cfg, LIMITS, on_gpu=False, prior=prior)}
                       for k, prior in (("step", step), ("eval", ev or step))}
    assert set(COUNTED) == set(MEASURED)
    assert count_within(plans) == WITHIN_A_QUARTER_OF_THE_WORK
