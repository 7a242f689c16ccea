"""Soak checks: over a long run, the trainer's resources stop growing after a warm-up.

A soak samples, after each training step's metrics are written (:func:`watch`), what a leak would
make grow (:func:`sample`): this process's resident memory, open file descriptors and threads, its
child processes (recursively; the sandbox of the code tasks starts several per program run) and
zombies among them, and the run folder's size with its ``checkpoints/`` apart.
:func:`growth` measures each against the sample that ends the warm-up (the first update allocates
AdamW's state, the first save writes a checkpoint, pools start their threads), and
:func:`problems` names every bound of :class:`Bounds` a run broke:

* open files, threads, child processes and zombies: none above their count at the end of warm-up;
* checkpoints: at most 5 % above their size then (``train.keep_checkpoints`` prunes the old ones);
* the records (metrics, transcripts: the run folder less its checkpoints): under 256 KiB per step;
* resident memory: under 64 MiB more at the last step than at the end of warm-up.

``tests/train/test_soak.py`` and ``benchmarks/soak.py`` both check runs with these functions.
Reads ``/proc`` and ``psutil`` (Linux; elsewhere the file and thread counts are psutil's).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["COUNTS", "Bounds", "Sample", "assert_flat", "folder_size", "growth", "problems", "sample", "watch"]

MIB = 1 << 20
COUNTS = ("fds", "threads", "children", "zombies")
"""The sampled counts that may not grow at all after the warm-up."""

Sample = dict[str, float]
"""One step's sample: ``rss``, ``checkpoints`` and ``run_dir`` in bytes, the :data:`COUNTS`, and :func:`watch`'s
``step`` and ``seconds`` (wall time since the previous sample)."""


@dataclass(frozen=True)
class Bounds:
    """What "flat after the warm-up" allows (module docstring)."""

    warmup: int = 3
    """Index of the sample the later ones are compared with: the steps before it may grow anything."""
    rss_mib: float = 64.0
    """Most resident memory the last sample may hold above the warm-up sample."""
    checkpoints_ratio: float = 1.05
    """Largest checkpoints size after the warm-up, as a multiple of the warm-up sample's."""
    records_kib_per_step: float = 256.0
    """Most the run folder less its checkpoints may grow per step after the warm-up."""

    def __post_init__(self) -> None:
        if self.warmup < 0:
            raise ValueError(f"warmup {self.warmup} must be >= 0")


def folder_size(root: Path) -> int:
    """Bytes of the files under ``root`` (0 when it is not a folder); files removed while it walks are skipped."""
    if not root.is_dir():
        return 0
    total = 0
    for path in root.rglob("*"):
        try:
            if path.is_file():
                total += path.stat().st_size
        except OSError:  # pruned meanwhile
            pass
    return total


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import psutil  # a dependency of accelerate, itself a dependency of teamrl

        return int(psutil.Process().memory_info().rss)


def _count_entries(folder: str, fallback: Callable[[], int]) -> int:
    try:
        return len(os.listdir(folder))
    except OSError:
        return fallback()


def sample(run_dir: Path) -> Sample:
    """This process's resources now, and the run folder's size (with its checkpoints' size apart)."""
    import psutil

    me = psutil.Process()
    children = me.children(recursive=True)
    zombies = 0
    for child in children:
        try:
            zombies += child.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:  # gone between the listing and the look
            pass
    return {"rss": float(_rss_bytes()),
            "fds": float(_count_entries("/proc/self/fd", me.num_fds)),
            "threads": float(_count_entries("/proc/self/task", me.num_threads)),
            "children": float(len(children)), "zombies": float(zombies),
            "checkpoints": float(folder_size(run_dir / "checkpoints")), "run_dir": float(folder_size(run_dir))}


def watch(trainer: Any, run_dir: Path, extra: Callable[[], dict[str, float]] | None = None) -> list[Sample]:
    """Sample after every row ``trainer`` writes to its metrics sink (a training step's, or an evaluation's).

    The list fills while ``trainer.train()`` runs. Each sample also holds the row's ``step``, the wall ``seconds``
    since the previous sample (since this call for the first), and ``extra()``'s values when given. The row of a
    step is written before that step's checkpoint is saved, so a sample sees the previous step's checkpoint with
    the older ones already pruned.
    """
    samples: list[Sample] = []
    write = trainer.sink.write
    last = [time.perf_counter()]

    def write_and_sample(step: int, metrics: dict[str, float]) -> None:
        write(step, metrics)
        now = time.perf_counter()
        row: Sample = {"step": float(step), "seconds": now - last[0], **sample(run_dir)}
        if extra is not None:
            row |= extra()
        samples.append(row)
        last[0] = time.perf_counter()  # the sample's own time (walking the run folder) is not the next step's

    trainer.sink.write = write_and_sample
    return samples


def _split(samples: Sequence[Sample], warmup: int) -> tuple[Sample, Sequence[Sample]]:
    if len(samples) < warmup + 2:
        raise ValueError(f"{len(samples)} samples: a warm-up of {warmup} needs at least {warmup + 2}")
    return samples[warmup], samples[warmup + 1:]


def growth(samples: Sequence[Sample], warmup: int = Bounds.warmup) -> dict[str, float]:
    """How much each resource grew after the warm-up sample ``samples[warmup]``.

    Returns:
        ``rss_mib`` (last - warm-up, MiB), ``rss_peak_mib`` (highest later - warm-up), ``rss_slope_mib``
        (least-squares slope of the later samples, MiB per 100 samples), for each of :data:`COUNTS` the highest
        later count less the warm-up one, ``checkpoints_ratio`` (largest later size / warm-up size; 1 when both
        are 0) and ``records_kib_per_step`` (the run folder less its checkpoints, KiB per later sample).

    >>> s = [{"rss": (100 + i) * MIB, "fds": 9, "threads": 4, "children": 0, "zombies": 0, "checkpoints": 10,
    ...       "run_dir": 10 + 1024 * i} for i in range(6)]
    >>> g = growth(s, warmup=1)
    >>> g["rss_mib"], g["rss_slope_mib"], g["fds"], g["checkpoints_ratio"], g["records_kib_per_step"]
    (4.0, 100.0, 0.0, 1.0, 1.0)
    """
    warm, later = _split(samples, warmup)
    out = {"rss_mib": (later[-1]["rss"] - warm["rss"]) / MIB,
           "rss_peak_mib": (max(s["rss"] for s in later) - warm["rss"]) / MIB,
           "rss_slope_mib": 100 * _slope([s["rss"] / MIB for s in later])}
    for key in COUNTS:
        out[key] = float(max(s[key] for s in later) - warm[key])
    top = max(s["checkpoints"] for s in later)
    out["checkpoints_ratio"] = top / warm["checkpoints"] if warm["checkpoints"] else (1.0 if top == 0 else float("inf"))
    records = (later[-1]["run_dir"] - later[-1]["checkpoints"]) - (warm["run_dir"] - warm["checkpoints"])
    out["records_kib_per_step"] = records / 1024 / len(later)
    return out


def _slope(ys: Sequence[float]) -> float:
    """Least-squares slope of ``ys`` over 0, 1, 2, ... (0 for fewer than two points)."""
    n = len(ys)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, sum(ys) / n
    return sum((x - mx) * (y - my) for x, y in enumerate(ys)) / sum((x - mx) ** 2 for x in range(n))


def problems(samples: Sequence[Sample], bounds: Bounds = Bounds()) -> list[str]:
    """One line per bound of ``bounds`` the samples break (empty: the run stayed flat after its warm-up).

    >>> flat = [{"rss": 500 * MIB, "fds": 9, "threads": 4, "children": 0, "zombies": 0, "checkpoints": 10,
    ...          "run_dir": 20} for _ in range(6)]
    >>> problems(flat)
    []
    >>> problems(flat[:5] + [{**flat[5], "fds": 10}])
    ['fds grew after warm-up: 9 -> 10 (series 9 9 9 9 9 10)']
    """
    g = growth(samples, bounds.warmup)
    warm = samples[bounds.warmup]
    out = []
    for key in COUNTS:
        if g[key] > 0:
            out.append(f"{key} grew after warm-up: {warm[key]:.0f} -> {warm[key] + g[key]:.0f} "
                       f"(series {_series(samples, key)})")
    if g["checkpoints_ratio"] > bounds.checkpoints_ratio:
        out.append(f"checkpoints grew x{g['checkpoints_ratio']:.2f} after warm-up (bound x{bounds.checkpoints_ratio:g}; "
                   f"series in KiB {_series(samples, 'checkpoints', 1024)})")
    if g["records_kib_per_step"] >= bounds.records_kib_per_step:
        out.append(f"records grow {g['records_kib_per_step']:.0f} KiB per step "
                   f"(bound {bounds.records_kib_per_step:g} KiB)")
    if g["rss_mib"] >= bounds.rss_mib:
        out.append(f"resident memory grew {g['rss_mib']:.0f} MiB after warm-up (bound {bounds.rss_mib:g} MiB; "
                   f"series in MiB {_series(samples, 'rss', MIB)})")
    return out


def _series(samples: Sequence[Sample], key: str, unit: int = 1, most: int = 40) -> str:
    """The values of ``key`` (in ``unit``s) as text; a long series is thinned to about ``most`` values."""
    every = max(1, -(-len(samples) // most))
    return " ".join(f"{s[key] / unit:.0f}" for s in samples[::every])


def assert_flat(samples: Sequence[Sample], bounds: Bounds = Bounds()) -> None:
    """Raise AssertionError naming every bound the samples break (:func:`problems`)."""
    found = problems(samples, bounds)
    assert not found, "; ".join(found)
