"""The physical limits a phase's time is held against: matmul peak per dtype and memory bandwidth.

A GPU's come from :data:`GPU_SPECS` (the makers' data sheets: dense peaks, no sparsity). A CPU's are measured
(:func:`measure_cpu`, about 3 s) with the thread count training uses, and cached per machine as JSON under
``$TEAMRL_CACHE/limits/`` (:func:`cpu_limits`), keyed by the CPU's model name and flags, the thread count, torch's
version and the ISA caps in the environment (``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``), so a time plan costs
the measurement once per machine:

* matmul peak: the best of a few ``[n, n] @ [n, n]^T`` products (a linear layer's layout, n = 1024), in float32 and
  bfloat16, GFLOP/s: what the cores reach on large shapes;
* memory bandwidth: the best of a few sums over a 256 MiB float32 tensor, GB/s (read bandwidth: what a decode step's
  weight reads and an optimizer step's moment reads are bounded by).

A measurement during which other processes kept more than :data:`BUSY_SHARE` of this process's CPUs busy (read from
``/proc/stat``'s lines of the CPUs it may run on, steal included, the measuring process's own CPU time left out) is used but not cached, and says so: a busy machine
measures low, and a low figure cached would plan every later run too long.

``python -m teamrl.plan.limits`` prints this machine's limits (``--again`` measures anew).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# Dense peak TFLOP/s (bf16 / fp32 without TF32) and memory bandwidth GB/s from NVIDIA's data sheets. Matched by the
# words of the key in torch's device name, in this order ("H100 PCIe" before "H100", "H200 NVL" before "H200").
GPU_SPECS: dict[str, dict[str, float]] = {
    "H200 NVL": {"bfloat16": 835.5, "float32": 60.0, "bandwidth": 4800.0},
    "H200": {"bfloat16": 989.4, "float32": 66.9, "bandwidth": 4800.0},  # SXM, 141 GB HBM3e
    "H100 PCIe": {"bfloat16": 756.0, "float32": 51.2, "bandwidth": 2000.0},
    "H100 NVL": {"bfloat16": 835.5, "float32": 60.0, "bandwidth": 3900.0},
    "H100": {"bfloat16": 989.4, "float32": 66.9, "bandwidth": 3350.0},  # SXM, 80 GB HBM3
    "A100 80GB": {"bfloat16": 312.0, "float32": 19.5, "bandwidth": 2039.0},
    "A100": {"bfloat16": 312.0, "float32": 19.5, "bandwidth": 1555.0},  # 40 GB
    "L40S": {"bfloat16": 362.1, "float32": 91.6, "bandwidth": 864.0},
}
PEAK_SIZE = 1024
READ_MIB = 256
BUSY_SHARE = 0.2
"""The share of the CPUs' time other processes may take during a measurement that is still cached."""


@dataclass(frozen=True)
class Limits:
    """One device's limits: matmul peak per dtype (GFLOP/s) and memory bandwidth (GB/s)."""

    device: str
    float32: float
    bfloat16: float
    bandwidth: float
    source: str  # "measured <date>, <threads> threads" or "data sheet"
    busy: float = 0.0  # the share of the CPUs' time other processes took while it was measured

    def peak(self, dtype: str) -> float:
        """GFLOP/s in ``dtype`` (``bfloat16`` or anything else: float32)."""
        return self.bfloat16 if dtype == "bfloat16" else self.float32

    def describe(self) -> str:
        busy = (f"; other processes took {self.busy:.0%} of the CPUs meanwhile: not cached, measure again when "
                f"idle" if self.busy > BUSY_SHARE else "")
        return (f"{self.device}: matmul {self.float32:,.0f} GFLOP/s float32, {self.bfloat16:,.0f} bfloat16; "
                f"memory {self.bandwidth:,.1f} GB/s ({self.source}{busy})")


def gpu_limits(name: str) -> Limits | None:
    """The data sheet's :class:`Limits` of a GPU named ``name`` (torch's device name), or None when unknown.

    >>> gpu_limits("NVIDIA H200").bandwidth, gpu_limits("NVIDIA H100 PCIe").bfloat16, gpu_limits("cpu")
    (4800.0, 756000.0, None)
    """
    for key, spec in GPU_SPECS.items():
        if all(word in name for word in key.split()):
            return Limits(name, 1e3 * spec["float32"], 1e3 * spec["bfloat16"], spec["bandwidth"], "data sheet")
    return None


def cpu_name() -> str:
    """The CPU's model name with its family and model numbers, e.g. ``AMD EPYC (family 26 model 2)``."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
            if key.strip() == "flags":
                break
    except OSError:
        return platform.processor() or platform.machine()
    name = fields.get("model name", platform.machine())
    if "cpu family" in fields:
        name += f" (family {fields['cpu family']} model {fields.get('model', '?')})"
    return name


def _key(threads: int) -> str:
    import torch

    try:
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        flags = ""
    caps = f"{os.environ.get('ATEN_CPU_CAPABILITY', '')}/{os.environ.get('ONEDNN_MAX_CPU_ISA', '')}"
    text = "|".join([cpu_name(), flags, str(threads), torch.__version__, caps])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _best(fn, rounds: int) -> float:
    fn()  # oneDNN compiles its kernel on the first call
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _cpus() -> set[int]:
    """The CPUs this process may run on."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return set(range(os.cpu_count() or 1))


def _cpu_seconds() -> tuple[float, float, float] | None:
    """(wall, busy CPU seconds on this process's CPUs, this process's CPU seconds), or None without ``/proc/stat``.
    Busy: user, nice, system, irq, softirq and steal (time the hypervisor gave to other guests)."""
    cpus = _cpus()
    try:
        lines = Path("/proc/stat").read_text().splitlines()
        busy = 0
        for line in lines:
            name, *values = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in values[:8])
                busy += user + nice + system + irq + softirq + steal
    except (OSError, ValueError):
        return None
    own = os.times()
    return time.perf_counter(), busy / os.sysconf("SC_CLK_TCK"), own.user + own.system


def others_share(before: tuple[float, float, float] | None, after: tuple[float, float, float] | None) -> float:
    """The share of this process's CPUs' time other processes (and other guests' steal) took between two
    :func:`_cpu_seconds` readings."""
    if before is None or after is None or after[0] <= before[0]:
        return 0.0
    others = (after[1] - before[1]) - (after[2] - before[2])
    return max(0.0, min(1.0, others / ((after[0] - before[0]) * len(_cpus()))))


def measure_cpu(threads: int) -> Limits:
    """This CPU's :class:`Limits` with ``threads`` torch threads (module docstring), about 3 s."""
    import torch

    start = _cpu_seconds()
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        g = torch.Generator().manual_seed(0)
        n = PEAK_SIZE
        peaks = {}
        for dtype in (torch.float32, torch.bfloat16):
            a, w = torch.randn((n, n), generator=g).to(dtype), torch.randn((n, n), generator=g).to(dtype)
            peaks[dtype] = 2 * n**3 / _best(lambda a=a, w=w: torch.mm(a, w.t()), 6) / 1e9
        x = torch.randn(READ_MIB * 2**20 // 4, generator=g)
        bandwidth = x.numel() * 4 / _best(lambda: x.sum(), 5) / 1e9
    finally:
        torch.set_num_threads(before)
    return Limits(cpu_name(), round(peaks[torch.float32], 1), round(peaks[torch.bfloat16], 1), round(bandwidth, 2),
                  f"measured {time.strftime('%Y-%m-%d')}, {threads} thread{'s' if threads > 1 else ''}",
                  round(others_share(start, _cpu_seconds()), 3))


def cache_file(threads: int) -> Path:
    from teamrl.models import cache_dir

    return cache_dir() / "limits" / f"cpu-{_key(threads)}.json"


def cpu_limits(threads: int = 0, *, again: bool = False) -> Limits:
    """This CPU's :class:`Limits` with ``threads`` torch threads (0: torch's default), from the cache or measured
    once and cached (``again``: measured anew). A cache file that does not parse is measured over; a measurement
    taken while other processes kept the CPUs busy (:data:`BUSY_SHARE`) is returned but not cached."""
    import torch

    threads = threads or torch.get_num_threads()
    path = cache_file(threads)
    if path.is_file() and not again:
        try:
            return Limits(**json.loads(path.read_text()))
        except (ValueError, TypeError):
            pass
    limits = measure_cpu(threads)
    if limits.busy > BUSY_SHARE:
        return limits
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(limits), indent=1))
        tmp.replace(path)
    except OSError:  # a read-only cache: measured again next time
        pass
    return limits


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m teamrl.plan.limits", description="this machine's matmul peak and "
                                 "memory bandwidth (measured once per machine and cached)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    ap.add_argument("--again", action="store_true", help="measure anew")
    args = ap.parse_args(argv)
    limits = cpu_limits(args.threads, again=args.again)
    print(limits.describe())
    if limits.busy <= BUSY_SHARE:
        print(f"cached in {cache_file(args.threads or __import__('torch').get_num_threads())}")


if __name__ == "__main__":
    main()
