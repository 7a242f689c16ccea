"""Throughput and model FLOPs utilisation (MFU) of a training step's rollout and update.

Per step: ``perf/tokens_per_s/rollout`` (prompt + response tokens of every call, over the rollout
time), ``perf/tokens_per_s/update`` (prompt + response tokens of every row a learner trains on,
over the update time) and, where every model runs on a GPU whose peak is in :data:`PEAK_TFLOPS`,
``perf/mfu/rollout`` and ``perf/mfu/update``: model FLOPs per second over the GPUs' peak,

    update FLOPs  ~ 6 x N_params x tokens  (forward + backward)
    rollout FLOPs ~ 2 x N_params x tokens  (forward)

(attention's own FLOPs and the recomputation of gradient checkpointing are not counted, as usual
for MFU). The peak is that of the precision the model computes in (bf16 when it runs bf16 or
autocasts to it, else fp32) times the number of GPUs in use: those of the engines for the rollout,
those of the learners for the update (one and the same GPU per model in one process; with the Ray
backend each engine actor's and each learner worker's own). On a CPU no MFU is reported:
its peak depends on the core count, clocks and vector units in use, which torch does not expose.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# Dense peak TFLOP/s from NVIDIA's data sheets (no sparsity). fp32: plain fp32 (torch does not use
# TF32 for matmuls unless torch.backends.cuda.matmul.allow_tf32 is set).
PEAK_TFLOPS = {
    "H200": {"bfloat16": 989.4, "float32": 66.9},
    "H100 PCIe": {"bfloat16": 756.0, "float32": 51.2},
    "H100": {"bfloat16": 989.4, "float32": 66.9},  # SXM
    "A100": {"bfloat16": 312.0, "float32": 19.5},
}


def peak_tflops(device_name: str, precision: str) -> float | None:
    """Dense peak TFLOP/s of a GPU named ``device_name`` in ``precision``, or None when unknown.

    >>> peak_tflops("NVIDIA H100 80GB HBM3", "bfloat16")
    989.4
    >>> peak_tflops("NVIDIA H100 PCIe", "float32")
    51.2
    >>> peak_tflops("cpu", "float32") is None
    True
    """
    for key, peaks in PEAK_TFLOPS.items():  # "H100 PCIe" before "H100"
        if all(word in device_name for word in key.split()):
            return peaks.get(precision)
    return None


def mfu(flops: float, seconds: float, peak_tflops_total: float) -> float:
    """Achieved FLOP/s over the peak (a fraction).

    >>> round(mfu(6 * 1.5e9 * 21_700, 1.0, 989.4), 3)
    0.197
    """
    return flops / max(seconds, 1e-9) / (peak_tflops_total * 1e12)


@dataclass(frozen=True)
class ModelPerf:
    """What MFU needs to know of one model: its size and the devices its engine and learner run on."""

    params: int
    device: str  # where its engine runs (a torch device string, or node:gpu for a Ray actor)
    peak: float | None  # TFLOP/s of one of its devices in its precision (None: not a known GPU)
    learner_devices: tuple[str, ...] = ()  # where its learner runs, if not on ``device`` alone



class PerfMeter:
    """Tokens/s and MFU of each step, from the models' sizes, devices and precisions."""

    def __init__(self, models: dict[str, torch.nn.Module], precisions: dict[str, str],
                 remote: dict[str, ModelPerf] | None = None) -> None:
        """``models``: the in-process modules; ``remote``: models whose actors reported their own
        :class:`ModelPerf` (the Ray backend)."""
        self.models: dict[str, ModelPerf] = dict(remote or {})
        for name, m in models.items():
            p = next(m.parameters())
            device = str(p.device)
            peak = (peak_tflops(torch.cuda.get_device_name(p.device), precisions.get(name, "float32"))
                    if p.device.type == "cuda" else None)
            self.models[name] = ModelPerf(sum(t.numel() for t in m.parameters()), device, peak)

    def metrics(self, steps: list[Any], rollout_s: float, update_s: float,
                trained: set[str] | None = None) -> dict[str, float]:
        """The step's throughput (and MFU where known); ``steps``: its :class:`~teamrl.team.records.Step` s."""
        tokens: dict[str, int] = {}
        for s in steps:
            tokens[s.model] = tokens.get(s.model, 0) + len(s.prompt_ids) + len(s.response_ids)
        trained = set(self.models) if trained is None else trained
        roll = sum(tokens.values())
        upd = sum(n for m, n in tokens.items() if m in trained)
        out = {"perf/tokens_per_s/rollout": roll / max(rollout_s, 1e-9),
               "perf/tokens_per_s/update": upd / max(update_s, 1e-9)}
        local = [m for m in tokens if m in self.models]
        if local and len(local) == len(tokens) and all(self.models[m].peak for m in local):
            def peak(names: list[str], learners: bool) -> float:  # each GPU once, at its (last) model's precision
                devices = {d: float(self.models[m].peak or 0.0) for m in names
                           for d in ((self.models[m].learner_devices or (self.models[m].device,)) if learners
                                     else (self.models[m].device,))}
                return sum(devices.values())

            out["perf/mfu/rollout"] = mfu(sum(2 * self.models[m].params * tokens[m] for m in local), rollout_s,
                                          peak(local, learners=False))
            upd_models = [m for m in local if m in trained]
            out["perf/mfu/update"] = (mfu(sum(6 * self.models[m].params * tokens[m] for m in upd_models), update_s,
                                          peak(upd_models, learners=True)) if upd_models else 0.0)
        return out
