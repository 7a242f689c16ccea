"""The soak checks (teamrl.metrics.soak): a flat run passes; a run that leaks memory, files, threads, processes or
disk after its warm-up fails with the resource named, however the leak grows; growth inside the warm-up is allowed;
the sampler sees a file opened, a thread started, a child process and a zombie."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from teamrl.metrics.soak import MIB, Bounds, assert_flat, growth, problems, sample, watch
from tests.conftest import HANG_S


def run(steps: int = 60, **leak) -> list[dict[str, float]]:
    """A flat run of ``steps`` samples; ``leak[key](i)`` is added to ``key`` at sample ``i``. Its warm-up (the first
    3 steps) grows everything: memory, the first checkpoint, a thread pool."""
    out = []
    for i in range(steps):
        s = {"step": i, "seconds": 1.0, "rss": (400 + min(i, 3) * 50) * MIB, "fds": 4 + min(i, 2),
             "threads": 5 + min(i, 3), "children": 0, "zombies": 0,
             "checkpoints": 12 * MIB if i else 0, "run_dir": 12 * MIB * bool(i) + 3000 * i}
        for key, f in leak.items():
            s[key] += f(i)
        out.append(s)
    return out


def test_a_flat_run_passes_whatever_its_warm_up_grew():
    samples = run()
    assert problems(samples) == []
    assert_flat(samples)
    g = growth(samples)
    assert g["rss_mib"] == g["rss_peak_mib"] == g["rss_slope_mib"] == 0.0
    assert (g["fds"], g["threads"], g["children"], g["zombies"], g["checkpoints_ratio"]) == (0, 0, 0, 0, 1.0)
    assert g["records_kib_per_step"] == pytest.approx(3000 / 1024)


def test_noise_that_does_not_grow_passes():
    """Memory up and down by 32 MiB, a file closed now and then, the checkpoint's size a little off."""
    samples = run(rss=lambda i: (i % 5) * 8 * MIB, fds=lambda i: -(i > 3 and i % 2), checkpoints=lambda i: (i % 3) * 100_000)
    assert problems(samples) == []


@pytest.mark.parametrize(("key", "leak", "named"), [
    ("rss", lambda i: i * 2 * MIB, "resident memory grew"),  # 2 MiB a step: 114 MiB over the run
    ("rss", lambda i: 80 * MIB * (i > 50), "resident memory grew"),  # one late jump
    ("fds", lambda i: i // 10, "fds grew"),  # a file left open every 10 steps
    ("fds", lambda i: i == 40, "fds grew"),  # one, once (the check takes the highest later count)
    ("threads", lambda i: i // 20, "threads grew"),
    ("children", lambda i: i > 30, "children grew"),  # a process left behind
    ("zombies", lambda i: i // 7, "zombies grew"),
    ("checkpoints", lambda i: i * 12 * MIB, "checkpoints grew"),  # nothing pruned
    ("run_dir", lambda i: i * 300 * 1024, "records grow"),  # 300 KiB of records a step
])
def test_each_kind_of_growth_after_the_warm_up_fails_by_name(key, leak, named):
    found = problems(run(**{key: leak}))
    assert len(found) == 1 and found[0].startswith(named), found
    with pytest.raises(AssertionError, match=named):
        assert_flat(run(**{key: leak}))


def test_the_warm_up_is_the_bounds_own():
    late = run(threads=lambda i: 4 <= i < 10)  # a pool still starting a thread after the warm-up, until step 10
    [found] = problems(late)
    assert found.startswith("threads grew after warm-up: 8 -> 9 (series 5 7 9 9 9 8 8")  # every 2nd of 60 samples
    assert problems(late, Bounds(warmup=10)) == []
    assert growth(late, warmup=10)["threads"] == 0


def test_too_short_a_run_cannot_be_judged():
    with pytest.raises(ValueError, match="at least 5"):
        growth(run(4))
    with pytest.raises(ValueError, match="warmup"):
        Bounds(warmup=-1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")
def test_sample_sees_files_threads_children_zombies_and_the_run_folder(tmp_path: Path):
    (tmp_path / "checkpoints" / "step-1").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-1" / "model.bin").write_bytes(bytes(5000))
    (tmp_path / "metrics.jsonl").write_bytes(bytes(300))
    before = sample(tmp_path)
    assert (before["checkpoints"], before["run_dir"]) == (5000, 5300) and before["rss"] > MIB
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    sleeper = subprocess.Popen(["sleep", "60"])
    ended = subprocess.Popen(["true"])  # not waited for: a zombie once it exits
    try:
        deadline = time.monotonic() + HANG_S
        while Path(f"/proc/{ended.pid}/stat").read_text().split(")")[-1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.01)
        with open(tmp_path / "metrics.jsonl"):
            thread.start()
            now = sample(tmp_path)
    finally:
        stop.set()
        sleeper.kill()
        sleeper.wait()
        ended.wait()
        if thread.is_alive():
            thread.join()
    assert now["fds"] >= before["fds"] + 1 and now["threads"] >= before["threads"] + 1
    assert now["children"] >= before["children"] + 2 and now["zombies"] >= before["zombies"] + 1


def test_watch_samples_each_row_the_trainer_writes(tmp_path: Path):
    written = []

    class Sink:
        def write(self, step, metrics):
            written.append(step)

    class Trainer:
        sink = Sink()

    trainer = Trainer()
    calls = iter(range(1, 10))
    samples = watch(trainer, tmp_path, extra=lambda: {"sandbox_runs": float(next(calls))})
    for step in range(3):
        trainer.sink.write(step, {"rollout/reward_mean": 0.0})
    assert written == [0, 1, 2]
    assert [s["step"] for s in samples] == [0, 1, 2] and [s["sandbox_runs"] for s in samples] == [1, 2, 3]
    assert all(s["seconds"] >= 0 and s["run_dir"] == 0 for s in samples)
