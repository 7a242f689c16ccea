"""The memory plan: on a CPU the rollout's KV cache and the update's gradients and activations do not overlap."""

from __future__ import annotations

from teamrl.config.schema import load_config
from teamrl.plan import CPU_RUNTIME_GIB, GIB, SHAPES, decode_copies, format_plan, plan_config
from tests.conftest import REPO

QUICKSTART = REPO / "configs" / "quickstart.yaml"


def test_cpu_plan_takes_the_larger_phase_and_gpu_plan_the_sum():
    cfg = load_config(QUICKSTART)
    (cpu,), _ = plan_config(cfg, on_gpu=False, bf16_native=True)
    (gpu,), _ = plan_config(cfg, on_gpu=True)
    P = SHAPES["default"].params
    # fp32 weights 4 B + bf16 rollout copy 2 B per parameter, plus the engine's decode copies in bf16
    assert cpu.weights == 6 * P + 2 * decode_copies(SHAPES["default"], packed=True)
    assert cpu.train == 16 * P and cpu.grads == 8 * P  # gradients + per-agent sum are the update's only
    assert cpu.per_device == cpu.weights + 8 * P + max(8 * P + cpu.activations, cpu.kv_cache)
    assert gpu.per_device == gpu.weights + gpu.train + gpu.activations + gpu.kv_cache
    line = next(x for x in format_plan(cfg, on_gpu=False, bf16_native=True).splitlines() if "(the CPU)" in x)
    assert f"{(cpu.per_device + CPU_RUNTIME_GIB * GIB) / GIB:.1f} GiB peak resident memory" in line


def test_quickstart_plan_is_within_a_fifth_of_its_measured_peak():
    # /usr/bin/time -v of a 2-step quickstart run on a 2-core AMD EPYC with avx512_bf16 (docs/memory.md)
    measured = {("models.main.gradient_checkpointing=true",): 5.10, ("loss.logits_chunk_tokens=4096",): 9.75}
    for overrides, gib in measured.items():
        text = format_plan(load_config(QUICKSTART, overrides), on_gpu=False, bf16_native=True)
        line = next(x for x in text.splitlines() if "(the CPU)" in x)
        planned = float(line.split("(the CPU), ")[1].split(" GiB")[0])
        assert abs(planned / gib - 1) <= 0.2, (overrides, planned, gib)
