"""Device and precision resolution: every hardware case, by passing the hardware in."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from teamrl import hardware
from teamrl.config import tools as configtools
from teamrl.config.schema import load_config
from teamrl.hardware import Hardware, bf16_fast, bf16_native, resolve_config, resolve_device, resolve_dtype

REPO = Path(__file__).resolve().parents[1]
KINDS = ("dtype", "train_autocast", "rollout_dtype")

AMX_CPU = Hardware(cpu_bf16="amx_bf16")
AVX512_BF16_CPU = Hardware(cpu_bf16="avx512_bf16")
PLAIN_CPU = Hardware()  # e.g. a Xeon without AVX-512 BF16 / AMX: bf16 is emulated there
H100 = Hardware(gpus=("NVIDIA H100 80GB HBM3",), gpu_bf16=(True,))
V100 = Hardware(gpus=("Tesla V100-SXM2-16GB",), gpu_bf16=(False,))
TWO_GPUS = Hardware(gpus=("NVIDIA H100 80GB HBM3",) * 2, gpu_bf16=(True, True))


@pytest.mark.parametrize("hw, device, expected", [
    (AMX_CPU, "cpu", ("float32", "bfloat16", "bfloat16")),
    (AVX512_BF16_CPU, "cpu", ("float32", "bfloat16", "bfloat16")),
    (PLAIN_CPU, "cpu", ("float32", "none", "same")),
    (H100, "cuda:0", ("float32", "bfloat16", "bfloat16")),
    (V100, "cuda:0", ("float32", "none", "same")),
    (H100, "cpu", ("float32", "none", "same")),  # the CPU of a GPU machine without bf16 flags
])
def test_auto_precision_per_hardware(hw, device, expected):
    native, _ = bf16_native(device, hw)
    dtype = resolve_dtype("dtype", "auto", native)
    got = (dtype, resolve_dtype("train_autocast", "auto", native), resolve_dtype("rollout_dtype", "auto", native,
                                                                                 weights=dtype))
    assert got == expected


def test_frozen_models_take_bf16_weights_only_where_native():
    assert resolve_dtype("dtype", "auto", True, trainable=False) == "bfloat16"
    assert resolve_dtype("dtype", "auto", False, trainable=False) == "float32"
    # bf16 weights need no bf16 copy for the engine
    assert resolve_dtype("rollout_dtype", "auto", True, weights="bfloat16") == "same"


def test_explicit_settings_are_kept_whatever_the_hardware():
    for kind, value in [("dtype", "bfloat16"), ("train_autocast", "none"), ("rollout_dtype", "float32")]:
        assert resolve_dtype(kind, value, True) == value
        assert resolve_dtype(kind, value, False) == value
    with pytest.raises(ValueError, match="not a precision setting"):
        resolve_dtype("kv_dtype", "auto", True)


def test_devices():
    assert resolve_device("auto", PLAIN_CPU)[0] == "cpu"
    assert resolve_device("auto", H100)[0] == "cuda:0"
    assert [resolve_device("auto", TWO_GPUS, turn=t)[0] for t in range(3)] == ["cuda:0", "cuda:1", "cuda:0"]
    assert resolve_device("cuda", H100)[0] == "cuda:0"
    assert resolve_device("cuda:1", TWO_GPUS)[0] == "cuda:1"
    assert resolve_device("cpu", H100)[0] == "cpu"
    with pytest.raises(ValueError, match="torch sees no CUDA GPU"):
        resolve_device("cuda", PLAIN_CPU)
    with pytest.raises(ValueError, match=r"cuda:0\.\.cuda:1"):
        resolve_device("cuda:2", TWO_GPUS)
    with pytest.raises(ValueError, match="not a device"):
        resolve_device("gpu", H100)


def test_cpu_flags_from_cpuinfo():
    assert hardware.cpu_bf16_flag("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n") is None
    assert hardware.cpu_bf16_flag("flags\t\t: fpu avx512f avx512_bf16\n") == "avx512_bf16"
    assert hardware.cpu_bf16_flag("Features\t: fp asimd bf16 i8mm\n") == "bf16"  # Arm


def test_config_rejects_a_bad_device_in_one_line():
    with pytest.raises(configtools.ConfigError) as exc:
        load_config(None, ["models.main.device=gpu"])
    assert "not a device; use auto, cpu, cuda or cuda:N" in str(exc.value)
    with pytest.raises(configtools.ConfigError, match="with backend: ray the device follows"):
        load_config(None, ["backend=ray", "models.main.device=cuda"])


def test_quickstart_resolves_to_its_former_settings_on_a_bf16_cpu(caplog):
    """The shipped configs say auto; on a CPU with AMX or AVX-512 BF16 that is float32 / bf16 / bf16."""
    cfg = load_config(REPO / "configs" / "quickstart.yaml")
    assert (cfg.models["main"].dtype, cfg.models["main"].train_autocast, cfg.models["main"].rollout_dtype) == \
        ("auto",) * 3
    with caplog.at_level("INFO", logger="teamrl.hardware"):
        out = resolve_config(cfg, AMX_CPU)
    mc = out.models["main"]
    assert (mc.device, mc.dtype, mc.train_autocast, mc.rollout_dtype) == ("cpu", "float32", "bfloat16", "bfloat16")
    assert resolve_config(out, PLAIN_CPU) is out  # resolved: nothing left to choose
    line, = [r.getMessage() for r in caplog.records]
    assert "model main: device cpu (auto: torch sees no CUDA GPU)" in line
    assert "train_autocast bfloat16 (auto: CPU has amx_bf16)" in line
    plain = resolve_config(cfg, PLAIN_CPU).models["main"]
    assert (plain.dtype, plain.train_autocast, plain.rollout_dtype) == ("float32", "none", "same")


def test_this_machine_resolves_the_quickstart_as_before():
    """Here: the same settings the quickstart named before it said auto (where the CPU runs bf16), the update's
    autocast only where this CPU's bf16 products are not slower than float32's (measured)."""
    hw = hardware.detect()
    if hw.gpus or not hw.cpu_bf16:
        pytest.skip(f"this machine is not a bf16 CPU without a GPU ({hw})")
    assert hw.cpu_bf16_speed is not None and hw.cpu_bf16_speed > 0
    mc = resolve_config(load_config(REPO / "configs" / "quickstart.yaml")).models["main"]
    autocast = "bfloat16" if hw.cpu_bf16_speed >= hardware.BF16_SLOWER else "none"
    assert (mc.device, mc.dtype, mc.train_autocast, mc.rollout_dtype) == ("cpu", "float32", autocast, "bfloat16")


def test_a_cpu_whose_bf16_products_are_slow_updates_in_float32_and_decodes_in_bf16(caplog):
    """bf16 instructions without fast bf16 products (an Intel Xeon whose hypervisor hides AMX: 0.55-0.62x float32's): the
    update's autocast stays off (its matmuls dominate), the rollout copy stays bf16 (half the memory of the decode
    copies and KV cache), and the log line says why."""
    slow = Hardware(cpu_bf16="avx512_bf16", cpu_bf16_speed=0.5)
    caplog.set_level("INFO", logger="teamrl.hardware")
    mc = resolve_config(load_config(REPO / "configs" / "quickstart.yaml"), slow).models["main"]
    assert (mc.dtype, mc.train_autocast, mc.rollout_dtype) == ("float32", "none", "bfloat16")
    assert "train_autocast none (auto: CPU has avx512_bf16, but its bf16 products ran at 0.50x float32's speed " \
        "here)" in caplog.text
    for speed in (hardware.BF16_SLOWER, 2.5, None):  # at the bar, faster, or not measured: bf16 as before
        fast = Hardware(cpu_bf16="avx512_bf16", cpu_bf16_speed=speed)
        assert resolve_config(load_config(REPO / "configs" / "quickstart.yaml"), fast).models["main"].train_autocast \
            == "bfloat16"
    assert bf16_fast("cuda:0", H100) == bf16_native("cuda:0", H100)  # a GPU: bf16 support alone decides
    assert not bf16_fast("cpu", PLAIN_CPU)[0]


def test_the_bf16_speed_is_measured_once_per_process():
    speed = hardware.cpu_bf16_speed()
    assert 0.01 < speed < 100  # a ratio of two measured times
    assert hardware.cpu_bf16_speed() == speed  # cached: every model of a run resolves against the same figure


def test_separate_models_take_the_gpus_in_turn():
    cfg = load_config(REPO / "configs" / "math_team_separate.yaml")
    out = resolve_config(cfg, TWO_GPUS)
    assert {n: m.device for n, m in out.models.items()} == {"solver_model": "cuda:0", "verifier_model": "cuda:1"}
    pinned = resolve_config(load_config(REPO / "configs" / "math_team_separate.yaml",
                                        ["models.solver_model.device=cuda:1", "models.verifier_model.device=cuda:1"]),
                            TWO_GPUS)
    assert {m.device for m in pinned.models.values()} == {"cuda:1"}


def test_openai_models_resolve_without_a_device(tiny_model_dir):
    cfg = load_config(None, [f"models.main.path={tiny_model_dir}", "models.main.engine=openai",
                             "models.main.trainable=false", "models.main.openai.base_url=http://127.0.0.1:1/v1",
                             "models.main.rollout_dtype=auto"])
    assert resolve_config(cfg, H100).models["main"].rollout_dtype == "same"


def test_build_refuses_cuda_without_a_gpu(tiny_model_dir):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from teamrl.runtime import local

    cfg = load_config(None, [f"models.main.path={tiny_model_dir}", "models.main.device=cuda"])
    with pytest.raises(ValueError, match=r"^models\.main\.device 'cuda' is set but torch sees no CUDA GPU"):
        local.build(cfg)


def test_an_avx2_capped_process_resolves_as_an_avx2_cpu(monkeypatch):
    """ATEN_CPU_CAPABILITY=avx2 or ONEDNN_MAX_CPU_ISA=AVX2 (how an AVX2-only CPU is emulated) makes an AMX or AVX-512
    BF16 CPU run without its bf16 instructions: auto then picks float32, as on an AVX2-only CPU, and says why."""
    monkeypatch.setattr(hardware, "cpu_bf16_flag", lambda text: "amx_bf16")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    hw = hardware.detect()
    assert hw.cpu_bf16 is None and hw.cpu_capped == "ATEN_CPU_CAPABILITY=avx2"
    native, why = bf16_native("cpu", hw)
    assert not native and "ATEN_CPU_CAPABILITY=avx2" in why
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert hardware.detect().cpu_bf16 == "amx_bf16"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")
    assert hardware.detect().cpu_capped == "ONEDNN_MAX_CPU_ISA=AVX2"
