"""GPU measurement helpers of the benchmarks: device synchronisation, GPU utilisation, the measured copy
bandwidth and the roofline of a decode step."""

from __future__ import annotations

import statistics
import time

import torch


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class GpuBusy:
    """Mean GPU utilisation (NVML: the share of time a kernel ran) sampled every 20 ms while in the block."""

    def __enter__(self):
        import threading

        self.samples: list[int] = []
        self.stop = threading.Event()

        def poll():
            while not self.stop.wait(0.02):
                self.samples.append(torch.cuda.utilization())

        self.thread = threading.Thread(target=poll, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    @property
    def mean(self) -> float:
        return statistics.mean(self.samples) if self.samples else float("nan")


def roofline(model, B: int, context: float, bandwidth: float, peak: float | None) -> tuple[float, str]:
    """Tokens/s of a decode step at the memory / compute limit: every weight read once and every row's
    ``context`` cached keys and values read once per step, over ``bandwidth`` B/s; 2 FLOPs per weight and
    row (plus attention) over ``peak`` FLOP/s. Returns (tokens/s, which limit binds)."""
    cfg = model.config
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    size = next(model.parameters()).element_size()
    weights = sum(p.numel() for p in model.parameters())
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * D * size * context * B
    flops = 2 * weights * B + 4 * cfg.num_hidden_layers * cfg.num_attention_heads * D * context * B
    t_mem = (weights * size + kv) / bandwidth
    t_fl = flops / (peak * 1e12) if peak else 0.0
    return B / max(t_mem, t_fl), ("memory" if t_mem >= t_fl else "compute")


def copy_bandwidth() -> float:
    """Measured device-to-device copy rate in bytes/s (bytes read + written), the HBM ceiling used above."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    sync()
    t = time.perf_counter()
    for _ in range(20):
        y.copy_(x)
    sync()
    return 2 * x.numel() * 20 / (time.perf_counter() - t)
