"""Where each model runs and in which precision: ``auto`` settings resolved against the hardware.

``models.<m>.device`` (``auto | cpu | cuda | cuda:N``) and the ``auto`` values of ``dtype``,
``rollout_dtype`` and ``train_autocast`` are resolved once, before any model is loaded, by
:func:`resolve_config`. The rules are pure functions of a :class:`Hardware` description, so every
hardware case is testable on any machine:

* device ``auto``: the GPU when torch sees one (separate models take the visible GPUs in turn,
  sorted by model name), else the CPU;
* bf16 is *native* on a CUDA GPU that reports bf16 support (``torch.cuda.is_bf16_supported``)
  and on a CPU with AMX or AVX-512 BF16 (``amx_bf16`` / ``avx512_bf16`` in ``/proc/cpuinfo``,
  ``bf16`` on Arm), unless ``ATEN_CPU_CAPABILITY`` or ``ONEDNN_MAX_CPU_ISA`` caps the process below
  those instructions (how an AVX2-only CPU is emulated on a larger one); elsewhere bf16 matmuls are
  emulated and slower than fp32;
* ``train_autocast: auto``: ``bfloat16`` where bf16 is native and, on a CPU, where a training-sized bf16
  product also runs at least :data:`BF16_SLOWER` of float32's speed (measured once per process,
  :func:`cpu_bf16_speed`: bf16 instructions alone do not make a CPU's bf16 products fast), else ``none``;
* ``rollout_dtype: auto``: ``bfloat16`` where bf16 is native (a bf16 copy of fp32 weights), else
  ``same`` (the engine uses the learner's module);
* ``dtype: auto``: ``float32`` for a trained model (its optimizer needs fp32 weights: bf16 weights
  lose updates smaller than their precision), ``bfloat16`` for a frozen one where bf16 is native.

Every choice comes with its reason, logged once per model and written into the run's config.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from teamrl.config.model import check_device
from teamrl.engines.registry import engine_spec

if TYPE_CHECKING:
    from teamrl.config.schema import Config, ModelConfig

log = logging.getLogger(__name__)

CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")  # x86 AMX, x86 AVX-512 BF16, Arm BF16 (in this order)
BF16_SLOWER = 0.8
"""``train_autocast: auto`` stays float32 on a CPU whose bf16 products of training size run below this fraction of
float32's speed (:func:`cpu_bf16_speed`). An Intel Xeon (family 6 model 207) whose hypervisor hides AMX ran them at
0.55-0.62x (oneDNN's AVX-512 BF16 kernels against MKL's float32 ones), and its update 1.5x faster in float32."""


@dataclass(frozen=True)
class Hardware:
    """What the resolution rules look at.

    Args:
        gpus: name of each visible CUDA GPU, by index.
        gpu_bf16: whether each GPU runs bf16 natively (same order as ``gpus``).
        cpu_bf16: the CPU flag that makes bf16 native (``amx_bf16``, ``avx512_bf16``, ``bf16``), or None.
        cpu_capped: the setting that caps this process below the CPU's bf16 instructions
            (``ATEN_CPU_CAPABILITY=avx2``, ``ONEDNN_MAX_CPU_ISA=AVX2``), else None.
        cpu_bf16_speed: with ``cpu_bf16``, a bf16 product's speed over float32's measured here
            (:func:`cpu_bf16_speed`); None: not measured (taken as fast).
    """

    gpus: tuple[str, ...] = ()
    gpu_bf16: tuple[bool, ...] = ()
    cpu_bf16: str | None = None
    cpu_capped: str | None = None
    cpu_bf16_speed: float | None = None


def cpu_bf16_flag(cpuinfo: str) -> str | None:
    """The first bf16 flag of :data:`CPU_BF16_FLAGS` present in ``/proc/cpuinfo`` text, or None.

    >>> cpu_bf16_flag("flags\\t: fpu sse avx512f avx512_bf16 amx_bf16 amx_tile")
    'amx_bf16'
    >>> cpu_bf16_flag("flags\\t: fpu sse avx2") is None
    True
    """
    words: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            words.update(value.split())
    return next((f for f in CPU_BF16_FLAGS if f in words), None)


ONEDNN_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI")
"""``ONEDNN_MAX_CPU_ISA`` values below oneDNN's bf16 instructions (AVX512_CORE_BF16, AMX)."""


def x86_cap(flag: str | None, capability: str | None, onednn_isa: str | None) -> str | None:
    """What caps this process below the x86 bf16 instructions ``flag`` names, or None.

    Emulating an AVX2-only CPU on a larger one takes ``ATEN_CPU_CAPABILITY=avx2`` (torch's own kernels)
    and ``ONEDNN_MAX_CPU_ISA=AVX2`` (its matmuls); either one makes bf16 run as it would there. Arm's
    ``bf16`` is not affected.

    >>> x86_cap("amx_bf16", "AVX2", None), x86_cap("amx_bf16", "AVX512", "avx2"), x86_cap("amx_bf16", "AVX512", None)
    ('ATEN_CPU_CAPABILITY=avx2', 'ONEDNN_MAX_CPU_ISA=AVX2', None)
    >>> x86_cap("bf16", "AVX2", "AVX2") is None
    True
    """
    if flag not in ("amx_bf16", "avx512_bf16"):
        return None
    if capability in ("AVX2", "DEFAULT"):
        return f"ATEN_CPU_CAPABILITY={capability.lower()}"
    if onednn_isa and onednn_isa.upper() in ONEDNN_WITHOUT_BF16:
        return f"ONEDNN_MAX_CPU_ISA={onednn_isa.upper()}"
    return None


@functools.cache
def cpu_bf16_speed(size: int = 1024, rounds: int = 8) -> float:
    """How fast a bf16 product of training size runs on this CPU against float32's, with torch's threads: the
    best of ``rounds`` timed ``[size, size] @ [size, size]^T`` products (a linear layer's layout) of each dtype,
    interleaved, after one of each untimed (oneDNN compiles its kernel then). About 0.2-0.4 s, once per process."""
    a = torch.randn(size, size)
    w = torch.randn(size, size)
    pairs = {torch.float32: (a, w), torch.bfloat16: (a.bfloat16(), w.bfloat16())}
    best = {dtype: float("inf") for dtype in pairs}
    for r in range(rounds + 1):
        for dtype, (x, y) in pairs.items():
            t0 = time.perf_counter()
            torch.mm(x, y.t())
            if r:
                best[dtype] = min(best[dtype], time.perf_counter() - t0)
    return best[torch.float32] / best[torch.bfloat16]


def detect(measure: bool = True) -> Hardware:
    """This machine's :class:`Hardware` (CUDA through torch, the CPU through ``/proc/cpuinfo`` and torch's CPU
    capability, which ``ATEN_CPU_CAPABILITY`` may cap); with ``measure``, the CPU's bf16 product speed where it has
    bf16 instructions (:func:`cpu_bf16_speed`)."""
    try:
        flag = cpu_bf16_flag(Path("/proc/cpuinfo").read_text())
    except OSError:  # not Linux: ask torch's CPU capability probes
        cpu = torch.cpu
        flag = ("amx_bf16" if getattr(cpu, "_is_amx_tile_supported", lambda: False)()
                else "avx512_bf16" if getattr(cpu, "_is_avx512_bf16_supported", lambda: False)() else None)
    get_capability = getattr(torch.backends.cpu, "get_cpu_capability", None)
    capped = x86_cap(flag, get_capability() if get_capability is not None else None,
                     os.environ.get("ONEDNN_MAX_CPU_ISA"))
    if capped:
        flag = None
    speed = cpu_bf16_speed() if flag and measure else None
    if not torch.cuda.is_available():
        return Hardware(cpu_bf16=flag, cpu_capped=capped, cpu_bf16_speed=speed)
    n = torch.cuda.device_count()
    names = tuple(torch.cuda.get_device_name(i) for i in range(n))
    bf16 = tuple(torch.cuda.get_device_capability(i)[0] >= 8 for i in range(n))  # Ampere and newer
    return Hardware(gpus=names, gpu_bf16=bf16, cpu_bf16=flag, cpu_capped=capped, cpu_bf16_speed=speed)


def resolve_device(setting: str, hw: Hardware, turn: int = 0) -> tuple[str, str]:
    """The device a model runs on, and why.

    Args:
        setting: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        hw: the hardware.
        turn: this model's position among the models placed by ``auto`` (they take the GPUs in turn).

    Returns:
        (``cpu`` or ``cuda:N``, reason).

    Raises:
        ValueError: a malformed setting, CUDA asked for where torch sees none, or a GPU index out of range.

    >>> resolve_device("auto", Hardware(gpus=("A", "B")), turn=3)
    ('cuda:1', 'auto: 2 GPUs, models take them in turn')
    >>> resolve_device("auto", Hardware())
    ('cpu', 'auto: torch sees no CUDA GPU')
    """
    error = check_device(setting)
    if error:
        raise ValueError(error)
    n = len(hw.gpus)
    if setting == "auto":
        if n == 0:
            return "cpu", "auto: torch sees no CUDA GPU"
        return f"cuda:{turn % n}", ("auto: the GPU" if n == 1 else f"auto: {n} GPUs, models take them in turn")
    if setting == "cpu":
        return "cpu", "set"
    if n == 0:
        raise ValueError(f"device {setting!r} is set but torch sees no CUDA GPU (torch.cuda.is_available() is False); "
                         f"use device: auto or cpu, or install a CUDA build of torch")
    index = int(setting.partition(":")[2] or 0)
    if index >= n:
        raise ValueError(f"device {setting!r}: torch sees {n} GPU{'s' if n > 1 else ''} (cuda:0..cuda:{n - 1}); "
                         f"pick one of those")
    return f"cuda:{index}", "set"


def bf16_native(device: str, hw: Hardware) -> tuple[bool, str]:
    """Whether ``device`` (``cpu`` or ``cuda:N``) runs bf16 natively, and why.

    >>> bf16_native("cpu", Hardware(cpu_bf16="amx_bf16"))
    (True, 'CPU has amx_bf16')
    >>> bf16_native("cpu", Hardware())
    (False, 'CPU has no amx_bf16/avx512_bf16/bf16')
    >>> bf16_native("cpu", Hardware(cpu_capped="ATEN_CPU_CAPABILITY=avx2"))
    (False, 'the CPU has bf16 instructions but ATEN_CPU_CAPABILITY=avx2 caps this process below them')
    >>> bf16_native("cuda:0", Hardware(gpus=("Tesla V100-SXM2-16GB",), gpu_bf16=(False,)))
    (False, 'GPU Tesla V100-SXM2-16GB has no native bf16')
    """
    if device == "cpu":
        if hw.cpu_bf16:
            return True, f"CPU has {hw.cpu_bf16}"
        if hw.cpu_capped:
            return False, f"the CPU has bf16 instructions but {hw.cpu_capped} caps this process below them"
        return False, f"CPU has no {'/'.join(CPU_BF16_FLAGS)}"
    index = int(device.partition(":")[2] or 0)
    name = hw.gpus[index]
    if hw.gpu_bf16[index]:
        return True, f"GPU {name} supports bf16"
    return False, f"GPU {name} has no native bf16"


def bf16_fast(device: str, hw: Hardware) -> tuple[bool, str]:
    """Whether ``device`` runs bf16 natively *and* fast enough for the update's autocast (``train_autocast: auto``),
    and why: :func:`bf16_native`, and on a CPU a measured bf16 product speed of at least :data:`BF16_SLOWER`.

    >>> bf16_fast("cpu", Hardware(cpu_bf16="avx512_bf16", cpu_bf16_speed=0.52))
    (False, "CPU has avx512_bf16, but its bf16 products ran at 0.52x float32's speed here")
    >>> bf16_fast("cpu", Hardware(cpu_bf16="amx_bf16", cpu_bf16_speed=3.1))
    (True, "CPU has amx_bf16, its bf16 products at 3.10x float32's speed")
    """
    native, why = bf16_native(device, hw)
    speed = hw.cpu_bf16_speed
    if device != "cpu" or not native or speed is None:
        return native, why
    if speed < BF16_SLOWER:
        return False, f"{why}, but its bf16 products ran at {speed:.2f}x float32's speed here"
    return True, f"{why}, its bf16 products at {speed:.2f}x float32's speed"


def resolve_dtype(kind: str, setting: str, native: bool, *, trainable: bool = True,
                  weights: str = "float32") -> str:
    """The concrete value of one precision setting (``setting`` is returned unless it is ``auto``).

    Args:
        kind: ``dtype``, ``train_autocast`` or ``rollout_dtype``.
        setting: the configured value.
        native: bf16 runs natively on the model's device (:func:`bf16_native`).
        trainable: the model has a learner (``dtype``: a trained model keeps fp32 weights).
        weights: the model's resolved ``dtype`` (``rollout_dtype``: bf16 weights need no bf16 copy).

    Returns:
        ``float32``/``bfloat16`` (dtype), ``none``/``bfloat16`` (train_autocast),
        ``same``/``bfloat16``/``float32`` (rollout_dtype).

    Raises:
        ValueError: an unknown ``kind``.

    >>> [resolve_dtype(k, "auto", True) for k in ("dtype", "train_autocast", "rollout_dtype")]
    ['float32', 'bfloat16', 'bfloat16']
    >>> [resolve_dtype(k, "auto", False) for k in ("dtype", "train_autocast", "rollout_dtype")]
    ['float32', 'none', 'same']
    >>> resolve_dtype("dtype", "auto", True, trainable=False)
    'bfloat16'
    """
    if kind not in ("dtype", "train_autocast", "rollout_dtype"):
        raise ValueError(f"kind {kind!r} is not a precision setting; use dtype, train_autocast or rollout_dtype")
    if setting != "auto":
        return setting
    if kind == "dtype":
        return "bfloat16" if native and not trainable else "float32"
    if kind == "train_autocast":
        return "bfloat16" if native else "none"
    return "bfloat16" if native and weights != "bfloat16" else "same"


def resolve_model(name: str, mc: ModelConfig, hw: Hardware, turn: int = 0) -> tuple[ModelConfig, str]:
    """``mc`` with device and precision resolved (no ``auto`` left), and one readable log line.

    Raises:
        ValueError: as :func:`resolve_device`, prefixed with the model's key.
    """
    spec = engine_spec(mc)
    if not spec.local_weights:  # weights on a server: nothing runs here but the tokenizer
        out = replace(mc, device="cpu", dtype=cast(Any, resolve_dtype("dtype", mc.dtype, False)),
                      train_autocast=cast(Any, resolve_dtype("train_autocast", mc.train_autocast, False)),
                      rollout_dtype="same" if mc.rollout_dtype == "auto" else mc.rollout_dtype)
        return out, f"model {name}: engine {spec.name}, the server picks its device and dtype"
    try:
        device, why_device = resolve_device(mc.device, hw, turn)
    except ValueError as exc:
        raise ValueError(f"models.{name}.{exc}") from None
    native, why = bf16_native(device, hw)
    fast, why_fast = bf16_fast(device, hw)
    dtype = resolve_dtype("dtype", mc.dtype, native, trainable=mc.trainable)
    autocast = resolve_dtype("train_autocast", mc.train_autocast, fast)
    rollout = resolve_dtype("rollout_dtype", mc.rollout_dtype, native, weights=dtype)
    out = replace(mc, device=device, dtype=cast(Any, dtype), train_autocast=cast(Any, autocast),
                  rollout_dtype=cast(Any, rollout))  # resolve_dtype returns one of each key's literals

    def said(key: str, value: str, reason: str) -> str:
        return f"{key} {value} ({reason if getattr(mc, key) == 'auto' else 'set'})"

    dtype_why = ("auto: trained weights and AdamW state stay fp32" if mc.trainable
                 else f"auto: frozen, {why}" if native else f"auto: {why}")
    line = (f"model {name}: device {device} ({why_device}), " + ", ".join([
        said("dtype", dtype, dtype_why), said("train_autocast", autocast, f"auto: {why_fast}"),
        said("rollout_dtype", rollout, f"auto: {why}")]))
    return out, line


def resolve_config(cfg: Config, hw: Hardware | None = None, names: list[str] | None = None) -> Config:
    """``cfg`` with every used model's device and precision resolved; logs one line per model.

    Idempotent: a resolved config resolves to itself. Models no agent uses are left as they are.

    Args:
        cfg: the run's config.
        hw: the hardware (default: :func:`detect`).
        names: resolve only these models (default: every model some agent uses).

    Raises:
        ValueError: a device that cannot be used on this machine (one line naming the key).
    """
    used = sorted({a.model for a in cfg.agents.values()} | set(cfg.algo.distill.models())) if names is None \
        else sorted(names)
    todo = [n for n in used if _unresolved(cfg.models[n])]
    if not todo:
        return cfg
    hw = detect() if hw is None else hw
    models = dict(cfg.models)
    turn = 0
    for n in used:
        if n not in todo:
            continue
        models[n], line = resolve_model(n, cfg.models[n], hw, turn)
        turn += cfg.models[n].device == "auto" and engine_spec(cfg.models[n]).local_weights
        log.info("%s", line)
    return replace(cfg, models=models)


def _unresolved(mc: ModelConfig) -> bool:
    """Whether ``mc`` still needs resolving; a ``cuda:N`` device is always checked against the GPUs torch sees."""
    return "auto" in (mc.device, mc.dtype, mc.train_autocast, mc.rollout_dtype) or mc.device.startswith("cuda")
