"""Peak memory per phase of a training step: resident set size, and CUDA memory on a GPU.

On Linux the kernel's peak-RSS mark (``VmHWM``) is reset at the start of each phase (writing 5
to ``/proc/self/clear_refs``), so ``perf/peak_rss_gb/rollout`` is the peak of that phase alone.
Where the mark cannot be reset the value is the process's peak so far (``ru_maxrss``).
"""

from __future__ import annotations

import contextlib
import resource
import sys
from pathlib import Path
from typing import Callable, Iterator

import torch

_GB = 1024**3


def _reset_rss_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _vmhwm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


def _maxrss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def peak_rss_gb() -> float:
    """The process's peak resident set size in GiB (since the last reset where resets work)."""
    try:
        return _vmhwm_bytes() / _GB
    except OSError:
        return _maxrss_bytes() / _GB


class PeakMemory:
    """Records peak RSS (and CUDA max allocated, when CUDA is in use) of named phases."""

    def __init__(self) -> None:
        self.cuda = torch.cuda.is_available()
        self._cuda_peak: Callable[[], float] = (lambda: torch.cuda.max_memory_allocated() / _GB) if self.cuda else (lambda: 0.0)
        self.peaks: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Measure the peaks of the code run inside this block under ``name``."""
        _reset_rss_peak()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        try:
            yield
        finally:
            self.peaks[f"perf/peak_rss_gb/{name}"] = peak_rss_gb()
            if self.cuda:
                self.peaks[f"perf/cuda_max_allocated_gb/{name}"] = self._cuda_peak()

    def metrics(self) -> dict[str, float]:
        """The peaks of the phases measured so far."""
        return dict(self.peaks)
