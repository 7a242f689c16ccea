"""The memory plan: on a CPU the rollout's KV cache and the update's gradients and activations do not overlap."""

from __future__ import annotations

import pytest

from teamrl.config.schema import load_config
from teamrl.hardware import Hardware, resolve_config
from teamrl.plan import CPU_RUNTIME_GIB, GIB, SHAPES, decode_copies, plan_config
from teamrl.plan.report import format_plan
from tests.conftest import REPO

QUICKSTART = REPO / "configs" / "quickstart.yaml"


def test_cpu_plan_takes_the_larger_phase_and_gpu_plan_the_sum():
    before = ["loss.agent_grad_norms=true", "train.release_memory=false"]  # the copies kept, a second gradient buffer
    (cpu,), _ = plan_config(load_config(QUICKSTART, before), on_gpu=False, bf16_native=True)
    (gpu,), _ = plan_config(load_config(QUICKSTART, before), on_gpu=True)
    P = SHAPES["default"].params
    # fp32 weights 4 B + bf16 rollout copy 2 B per parameter, plus the engine's decode copies in bf16
    copies = 2 * P + 2 * decode_copies(SHAPES["default"], packed=True)
    assert cpu.weights == 4 * P + copies and cpu.copies == copies and not cpu.released
    assert cpu.train == 16 * P and cpu.grads == 8 * P  # gradients + per-agent sum are the update's only
    assert cpu.per_device == cpu.weights + 8 * P + max(8 * P + cpu.activations, cpu.kv_cache)
    assert gpu.per_device == gpu.weights + gpu.train + gpu.activations + gpu.kv_cache


def test_cpu_plan_counts_the_engine_copies_with_the_rollout_when_released():
    cfg = load_config(QUICKSTART)  # train.release_memory true, loss.agent_grad_norms false: one gradient buffer
    (cpu,), _ = plan_config(cfg, on_gpu=False, bf16_native=True)
    P = SHAPES["default"].params
    assert cpu.released and cpu.grads == 4 * P and cpu.train == 12 * P
    base = cpu.weights - cpu.copies  # the fp32 weights alone
    assert base == 4 * P
    assert cpu.per_device == base + 8 * P + max(4 * P + cpu.activations, cpu.kv_cache + cpu.copies)
    # the update's activations under checkpointing include a forward's bf16 weight casts (2 B per parameter)
    assert cpu.activations >= 2 * P
    line = next(x for x in format_plan(cfg, on_gpu=False, bf16_native=True).splitlines() if "(the CPU)" in x)
    assert f"{(cpu.per_device + CPU_RUNTIME_GIB * GIB) / GIB:.1f} GiB peak resident memory" in line
    # the second agent's gradient buffer comes back with the per-agent norms
    (apart,), _ = plan_config(load_config(QUICKSTART, ["loss.agent_grad_norms=true"]), on_gpu=False, bf16_native=True)
    assert apart.grads == 8 * P


def test_a_float32_engine_counts_its_kv_cache_and_decode_copies_at_four_bytes():
    from teamrl.plan import step_weights

    S, P = SHAPES["default"], SHAPES["default"].params
    fp32 = ["models.main.rollout_dtype=same", "models.main.train_autocast=none"]  # as auto resolves on an AVX2 CPU
    (f32,), _ = plan_config(load_config(QUICKSTART, fp32), on_gpu=False, bf16_native=False)
    (b16,), _ = plan_config(load_config(QUICKSTART), on_gpu=False, bf16_native=True)
    assert f32.kv_cache == 2 * b16.kv_cache
    # the decode copies in float32: fused q/k/v and gate/up, and every linear and the lm_head packed for the panel
    # product (nothing for oneDNN or MKL beside it)
    assert f32.copies == 4 * decode_copies(S, packed=True) == 4 * (decode_copies(S, packed=False) + step_weights(S))
    assert b16.copies == 2 * P + 2 * decode_copies(S, packed=True)  # the bf16 rollout copy and its decode copies
    (gpu,), _ = plan_config(load_config(QUICKSTART, fp32), on_gpu=True)  # no prepacked copies on a GPU
    assert gpu.copies == 4 * decode_copies(S, packed=False) and gpu.kv_cache == f32.kv_cache


# /usr/bin/time -v peaks of quickstart runs on a 2-core AMD EPYC with avx512_bf16 (docs/memory.md), with the overrides
# that give each run's settings on today's code
FORMER = ("loss.agent_grad_norms=true", "train.release_memory=false", "loss.micro_batch_tokens=4096")
MEASURED = {
    (*FORMER, "models.main.gradient_checkpointing=false", "loss.logits_chunk_tokens=4096"): 9.75,  # 2 steps
    (*FORMER, "loss.logits_chunk_tokens=1024"): 5.10,  # 2 steps
    # a float32 engine, as rollout_dtype auto resolves on a CPU without bf16 instructions: 2 steps without evaluations
    # (benchmarks/plan_vs_measured.py --set models.main.rollout_dtype=same) on the Intel Xeon of MEASURED_PEAKS below,
    # its rollout at the peak, the panel product's copies its one packed copy of the weights (afbfca1)
    ("models.main.rollout_dtype=same", "models.main.train_autocast=none", "eval.before=false", "eval.after=false"): 3.68,
}


def test_quickstart_plan_is_within_a_fifth_of_its_measured_peak():
    for overrides, gib in MEASURED.items():
        text = format_plan(load_config(QUICKSTART, overrides), on_gpu=False, bf16_native=True)
        line = next(x for x in text.splitlines() if "(the CPU)" in x)
        planned = float(line.split("(the CPU), ")[1].split(" GiB")[0])
        assert abs(planned / gib - 1) <= 0.2, (overrides, planned, gib)


def test_several_models_on_one_cpu_share_the_update_but_not_the_rollout():
    # two separate models: each keeps its weights and moments; a rollout holds both KV caches and copies, an update
    # one model's gradients and activations at a time
    from teamrl.plan import cpu_peak

    cfg = load_config(REPO / "configs" / "math_team_separate.yaml")
    plans, _ = plan_config(cfg, on_gpu=False, bf16_native=True)
    assert len(plans) == 2
    a, b = plans
    assert cpu_peak(plans) == a.resident + b.resident + max(a.update_peak, b.update_peak,
                                                            a.rollout_peak + b.rollout_peak)
    assert cpu_peak(plans) < a.per_device + b.per_device  # not the sum of two whole processes


# code_pair as it was shipped before it took the quickstart's memory settings: a plan with every knob still to turn
CODE_PAIR_FULL = ("models.aux_model.gradient_checkpointing=false", "models.main_model.gradient_checkpointing=false",
                  "loss.logits_chunk_tokens=1024")


def test_a_plan_that_does_not_fit_names_the_settings_that_would():
    from teamrl.plan import cpu_peak
    from teamrl.plan.report import knobs_to_fit

    cfg = load_config(REPO / "configs" / "code_pair.yaml", CODE_PAIR_FULL)
    full = cpu_peak(plan_config(cfg, on_gpu=False, bf16_native=True)[0]) + CPU_RUNTIME_GIB * GIB
    assert knobs_to_fit(cfg, full, bf16_native=True)[0] == "loss.logits_chunk_tokens=256"  # the cheapest first
    text, planned = knobs_to_fit(cfg, 0.6 * full, bf16_native=True)
    assert planned <= 0.6 * full and "gradient_checkpointing=true" in text
    # each setting named is one the plan acts on: applied as overrides, the plan is the one promised
    again = cpu_peak(plan_config(load_config(REPO / "configs" / "code_pair.yaml", [*CODE_PAIR_FULL, *text.split()]),
                                 on_gpu=False, bf16_native=True)[0]) + CPU_RUNTIME_GIB * GIB
    assert again == planned
    assert knobs_to_fit(cfg, 1 * GIB, bf16_native=True) is None  # nothing fits 1 GiB
    assert cfg.loss.logits_chunk_tokens != 256  # the config itself is left as it was
    # the shipped config already chunks its logits and checkpoints: those are not named again, nor a second gradient
    # buffer where each model trains one agent, and a smaller micro-batch than the suggested one is not raised to it
    shipped = load_config(REPO / "configs" / "code_pair.yaml", ["loss.micro_batch_tokens=512"])
    text, _ = knobs_to_fit(shipped, 0.9 * cpu_peak(plan_config(shipped, on_gpu=False, bf16_native=True)[0]),
                           bf16_native=True)
    assert text == "models.aux_model.optim.states=8bit models.main_model.optim.states=8bit", text


def test_partial_checkpointing_is_planned_between_none_and_every_layer():
    from teamrl.plan import cpu_peak
    from teamrl.plan.report import knobs_to_fit

    def update(*over):
        (plan,), _ = plan_config(load_config(QUICKSTART, list(over)), on_gpu=False, bf16_native=True)
        return plan.activations

    none, half, full = (update("models.main.gradient_checkpointing=false"),
                        update("models.main.checkpoint_layers=0.5"), update())
    assert full < half < none
    # at half the micro-batch, every other layer checkpointed holds about what every layer does at the whole one
    assert update("models.main.checkpoint_layers=0.5", "loss.micro_batch_tokens=1024") < none / 2
    # a config with half its layers checkpointed is told to checkpoint them all before anything slower
    cfg = load_config(QUICKSTART, ["models.main.checkpoint_layers=0.25", "loss.micro_batch_tokens=4096"])
    peak = cpu_peak(plan_config(cfg, on_gpu=False, bf16_native=True)[0]) + CPU_RUNTIME_GIB * GIB
    text, planned = knobs_to_fit(cfg, peak - 0.05 * GIB, bf16_native=True)
    assert text.split()[0] == "models.main.checkpoint_layers=1" and planned < peak


def test_dry_run_says_when_it_does_not_fit_and_which_settings_would(monkeypatch):
    import teamrl.plan
    import teamrl.plan.report

    cfg = load_config(REPO / "configs" / "code_pair.yaml", CODE_PAIR_FULL)
    full = teamrl.plan.cpu_peak(plan_config(cfg, on_gpu=False, bf16_native=True)[0]) + CPU_RUNTIME_GIB * GIB
    ram = int(0.8 * full)
    monkeypatch.setattr(teamrl.plan.report.os, "sysconf", lambda key: 1 if key == "SC_PAGE_SIZE" else ram)
    text = format_plan(cfg, on_gpu=False, bf16_native=True)
    assert "does NOT fit" in text
    assert "would make it fit" in text and "loss.logits_chunk_tokens=256" in text


# Peak resident memory of every shipped config, 2 steps with evaluations and checkpoint saves off (the larger of the
# 20 ms RSS samples and the run's perf/peak_rss_gb over both steps), on a 2-core Intel Xeon (family 6 model 207) with
# avx512_bf16 whose bf16 products run at 0.55-0.62x float32's (so train_autocast resolves to none, the rollout copy
# to bf16), tcmalloc preloaded (`python benchmarks/plan_vs_measured.py CONFIG`; those marked "entropy" in
# docs/memory.md with `--set loss.entropy_coef=0.001`, so that their rows train). Every config with the quickstart's
# memory settings, measured again at 444fa9e (the fused AdamW step).
MEASURED_PEAKS = {"agent_program": 5.73, "code_pair": 5.19, "code_single": 3.10, "code_team": 3.86, "code_tree": 3.25,
                  "math_team_hetero": 5.59, "math_team_lora": 1.83, "math_team_mars2": 5.97,
                  "math_team_separate": 5.25, "math_team_sharp": 3.40, "plan_path_at_grpo": 3.39,
                  "plan_path_at_grpo_separate": 5.24, "plan_path_single": 2.99, "quickstart": 3.30,
                  "reasoning_gym_single": 3.23, "reasoning_gym_team": 3.39, "search_quickstart": 3.31,
                  "sokoban_at_grpo": 3.33, "sokoban_single": 2.99, "sudoku_at_grpo": 3.12, "sudoku_single": 3.04,
                  "tictactoe_selfplay": 3.36,
                  # the environment hubs' configs (docs/hubs.md): perf/peak_rss_gb/run of their whole training runs on a
                  # 2-core AMD EPYC without avx512_bf16, evaluations included
                  "openenv_guess": 3.24, "verifiers_arith": 3.20, "verifiers_two_seat": 3.43,
                  # its whole run on a 2-core AMD EPYC (family 25 model 17, avx512_bf16), evaluations included
                  "openenv_tools": 5.90,
                  # 2 steps on a 2-core AMD EPYC (family 25 model 17, avx512_bf16) with --set
                  # models.main.train_autocast=none (the Xeon's resolution); the quickstart measured 3.17 beside it
                  "math_team_c3": 3.13,
                  # the same way (2 steps, the same machine and --set); verifiers 0.4 installed beside teamrl
                  "verifiers_v1_sum": 3.11, "verifiers_v1_two_seat": 3.34}
MEASURED_ON = Hardware(cpu_bf16="avx512_bf16", cpu_bf16_speed=0.6)  # how that Xeon resolves the configs


def _planned_peak(name: str) -> float:
    from teamrl.plan import cpu_peak

    off = ["train.steps=2", "train.save_every=0", "eval.before=false", "eval.after=false"]
    cfg = resolve_config(load_config(REPO / "configs" / f"{name}.yaml", off), MEASURED_ON)
    plans, unknown = plan_config(cfg, on_gpu=False)
    assert not unknown, name
    return cpu_peak(plans) / GIB + CPU_RUNTIME_GIB


def test_every_shipped_config_is_measured():
    assert set(MEASURED_PEAKS) == {p.stem for p in (REPO / "configs").glob("*.yaml")}


def test_every_measured_config_is_planned_within_a_fifth():
    ratios = {name: round(_planned_peak(name) / gib, 2) for name, gib in MEASURED_PEAKS.items()}
    assert all(abs(r - 1) <= 0.2 for r in ratios.values()), ratios


def test_update_tokens_by_hand():
    from teamrl.plan import update_tokens

    # quickstart: 8 groups of 8, max_loops 2; the solver's (32 new tokens) is the larger agent: 8 x (64 + 0.75 x 8 x 32)
    # for the groups' first calls + 8 x 1 x 8 x (64 + 0.75 x 32) for the second loop's, a prompt per row
    assert update_tokens(load_config(QUICKSTART), "main") == 8 * (64 + 192) + 8 * 8 * (64 + 24)
    # a tree's nodes share the problem's prompt (calls_share_prompt): 8 trees, 6 nodes over 2 agents = 3 calls each,
    # 64 new tokens: 8 x (64 + 48) + 8 x 2 x 48
    assert update_tokens(load_config(REPO / "configs" / "code_tree.yaml"), "main") == 8 * (64 + 48) + 8 * 2 * 48
    # one model per agent: each model plans its own agent's rows only (the verifier's 16 new tokens)
    hetero = load_config(REPO / "configs" / "math_team_hetero.yaml")
    assert update_tokens(hetero, "verifier_model") == 8 * (64 + 96) + 8 * 8 * (64 + 12)


def test_a_micro_batch_is_planned_at_one_optimizer_steps_share_of_the_rows():
    from teamrl.plan import calls_per_episode, optimizer_step_share, update_tokens

    sudoku = load_config(REPO / "configs" / "sudoku_at_grpo.yaml")  # optimizer steps of 16 rows
    rows = sudoku.rollout.batch_size * calls_per_episode(sudoku) * sudoku.rollout.group_size
    assert optimizer_step_share(sudoku, "main") == 16 / rows < 1
    assert optimizer_step_share(load_config(QUICKSTART, ["loss.updates_per_batch=4"]), "main") == 0.25
    assert optimizer_step_share(load_config(QUICKSTART, ["loss.mini_batch_rows=4096"]), "main") == 1.0  # all rows
    # the activations follow: a quarter of the quickstart's 7,680 step tokens is 1,920 a micro-batch, not 4,096
    (whole,), _ = plan_config(load_config(QUICKSTART), on_gpu=False, bf16_native=True)
    (quarter,), _ = plan_config(load_config(QUICKSTART, ["loss.updates_per_batch=4"]), on_gpu=False, bf16_native=True)
    assert update_tokens(load_config(QUICKSTART), "main") == 7680 and quarter.activations < whole.activations


@pytest.mark.slow  # about a minute: two runs of two steps
def test_plan_against_a_measured_run_of_a_small_random_model(tokenizer, tmp_path):
    # a 4-layer, 512-wide random Llama (35 M parameters, the embedded tokenizer) trained as the quickstart trains, with
    # and without checkpointing: the run's own peak (summary.json) against the plan of the same config
    import json
    import subprocess
    import sys

    from teamrl.hardware import resolve_config
    from teamrl.plan import cpu_peak
    from tests.conftest import make_tiny_model

    model_dir = tmp_path / "model"
    make_tiny_model(tokenizer, hidden=512, layers=4).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    for ckpt in ("true", "false"):
        # an entropy bonus trains every row (a random model's rewards are all equal: zero advantages)
        over = [f"models.main.path={model_dir}", f"models.main.gradient_checkpointing={ckpt}", "train.steps=2",
                "loss.entropy_coef=0.001",
                "train.save_every=0", "eval.before=false", "eval.after=false", f"run_dir={tmp_path / ckpt}"]
        plans, _ = plan_config(resolve_config(load_config(QUICKSTART, over)), on_gpu=False)  # as the run resolves
        planned = cpu_peak(plans) / GIB + CPU_RUNTIME_GIB
        subprocess.run([sys.executable, "-m", "teamrl.cli", "train", str(QUICKSTART), *over], check=True, cwd=REPO,
                       capture_output=True, timeout=900)
        measured = json.loads((tmp_path / ckpt / "summary.json").read_text())["peak_rss_gb"]
        assert abs(planned / measured - 1) <= 0.2, (ckpt, round(planned, 2), measured)


def test_every_builtin_workflow_declares_its_calls_per_problem():
    from teamrl.plan import calls_per_episode
    from teamrl.team.registry import WORKFLOWS, load_builtin_workflows

    load_builtin_workflows()
    undeclared = {name for name, spec in WORKFLOWS.items() if spec.calls is None}
    # an outside program's calls, and a verifiers environment's, are not known beforehand
    assert undeclared <= {"agent_program", "verifiers", "verifiers_v1"}, undeclared
    assert calls_per_episode(load_config(REPO / "configs" / "code_team.yaml", ["workflow.code_team.max_turns=3"])) == 3
    sokoban = load_config(REPO / "configs" / "sokoban_at_grpo.yaml")
    assert calls_per_episode(sokoban) == sokoban.task.sokoban.max_turns * sokoban.workflow.env_team_tree.branch


def test_a_workflow_without_declared_calls_is_planned_at_one_and_said_so():
    from teamrl.plan import calls_per_episode

    cfg = load_config(REPO / "configs" / "agent_program.yaml")
    assert calls_per_episode(cfg) == 1
    assert "does not declare its calls per problem" in format_plan(cfg, on_gpu=False, bf16_native=True)
