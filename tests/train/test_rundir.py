"""The run folder's records survive faults: a torn last line, a full disk and a read-only folder (on a real
tmpfs where this process may mount one), a checkpoint writer killed with SIGKILL, and a new run started in a
used folder."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from teamrl.cli import main
from teamrl.config.schema import load_config
from teamrl.learner import checkpoint
from teamrl.metrics.sinks import append_jsonl
from teamrl.train import rundir
from teamrl.train.rundir import RunDirError, drop_rows_from
from teamrl.train.trainer import Trainer
from tests.conftest import REPO

TINY = ["rollout.batch_size=2", "rollout.group_size=2", "eval.before=false", "eval.after=false",
        "agents.solver.max_new_tokens=4", "agents.verifier.max_new_tokens=4", "train.loggers=[]"]


def tiny(run: Path, model: Path, *more: str):
    return load_config(None, [f"run_dir={run}", f"models.main.path={model}", *TINY, *more])


# ------------------------------------------------------------------ a real small filesystem


def _mount(path: Path, options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True).returncode == 0


def _remount(path: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(path)], check=True, capture_output=True)


@pytest.fixture
def tmpfs(tmp_path):
    """A fresh 64 MB tmpfs at ``tmp_path/fs`` (skipped where mounting is not permitted, e.g. without root)."""
    fs = tmp_path / "fs"
    if not _mount(fs, "size=64m"):
        pytest.skip("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN); the injected-error tests cover the logic")
    yield fs
    subprocess.run(["umount", "-l", str(fs)], capture_output=True)


def _used_kb(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize // 1024


# ------------------------------------------------------------------ torn lines


def test_a_torn_last_line_is_dropped_with_a_warning_naming_file_and_line(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "a": 1}\n{"step": 1, "a": 2}\n{"step": 2, "text": "cut sh')
    with caplog.at_level(logging.WARNING):
        assert drop_rows_from(path, 2) == 1
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1]
    assert f"{path} line 3: dropped a torn last line" in caplog.text


def test_a_damaged_line_before_the_last_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "episodes.jsonl"
    path.write_text('{"step": 0}\n{"step": 1, "te\n{"step": 2}\n')
    with pytest.raises(RunDirError, match=rf"{path} line 2 is not a JSON row"):
        drop_rows_from(path, 1)
    assert path.read_text() == '{"step": 0}\n{"step": 1, "te\n{"step": 2}\n'  # nothing lost


def test_an_append_that_fails_part_way_leaves_no_torn_line(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    append_jsonl(path, [{"step": 0}])
    real = os.write

    def half_then_full(fd, data):  # the kernel takes part of the row, then the disk is full
        if len(data) > 10:
            return real(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError) as info:
        append_jsonl(path, [{"step": 1, "text": "x" * 100}])
    assert info.value.errno == errno.ENOSPC
    assert path.read_text() == '{"step": 0}\n'


def test_an_append_to_a_full_tmpfs_leaves_no_torn_line(tmpfs):
    path = tmpfs / "metrics.jsonl"
    append_jsonl(path, [{"step": 0}])
    (tmpfs / "filler").write_bytes(b"\0" * (60 << 20))
    _remount(tmpfs, f"size={_used_kb(tmpfs) + 8}k")  # 8 KB left
    with pytest.raises(OSError) as info:
        append_jsonl(path, [{"step": 1, "text": "x" * (64 << 10)}])
    assert info.value.errno == errno.ENOSPC
    assert path.read_text() == '{"step": 0}\n'


def test_resume_after_a_torn_metrics_line(tmp_path, tiny_model_dir, caplog):
    run = tmp_path / "run"
    Trainer(tiny(run, tiny_model_dir, "train.steps=1"), progress=False).train()
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 1, "rollout/reward_mean": 0.')  # a kill or a full disk mid-append
    with caplog.at_level(logging.WARNING):
        resumed = Trainer(tiny(run, tiny_model_dir, "train.steps=2"), resume=True, allow_change=("train.steps",), progress=False)
    assert resumed.start_step == 1 and "metrics.jsonl line 2: dropped a torn last line" in caplog.text
    resumed.train()
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1]


# ------------------------------------------------------------------ a full disk, a read-only folder


def _stop_before_checkpoint(trainer: Trainer, step: int, action) -> None:
    save = trainer.save

    def save_after(n: int) -> None:
        if n == step:
            action()
        save(n)

    trainer.save = save_after  # type: ignore[method-assign]


def test_disk_full_during_a_checkpoint_is_one_line_saying_what_was_kept(tmpfs, tiny_model_dir):
    run = tmpfs / "run"
    trainer = Trainer(tiny(run, tiny_model_dir, "train.steps=3", "train.save_every=1"), progress=False)
    _stop_before_checkpoint(trainer, 3, lambda: _remount(tmpfs, f"size={_used_kb(tmpfs) + 256}k"))
    with pytest.raises(RunDirError) as info:
        trainer.train()
    assert str(info.value) == (f"disk full while writing checkpoint step_3 in {run}; kept checkpoint step_2 "
                               f"and metrics up to step 2; free space and run with --resume")
    assert not list((run / "checkpoints").glob(".tmp-*"))  # the half checkpoint is gone
    _remount(tmpfs, "size=64m")
    resumed = Trainer(tiny(run, tiny_model_dir, "train.steps=3", "train.save_every=1"), resume=True, allow_change=("train.steps",), progress=False)
    assert resumed.start_step == 2


def test_disk_full_while_writing_a_steps_metrics_is_one_line_and_leaves_whole_rows(tmpfs, tiny_model_dir):
    run = tmpfs / "run"
    trainer = Trainer(tiny(run, tiny_model_dir, "train.steps=2", "train.save_every=0"), progress=False)
    write = trainer.sink.write

    def write_then_fill(step: int, metrics: dict) -> None:
        if step == 1:
            _remount(tmpfs, f"size={_used_kb(tmpfs)}k")  # not one more page
        write(step, {**metrics, "padding": 0.0} | {f"x/{i:05d}": 0.0 for i in range(2000)})  # a ~30 KB row

    trainer.sink.write = write_then_fill  # type: ignore[method-assign]
    with pytest.raises(RunDirError) as info:
        trainer.train()
    assert str(info.value) == (f"disk full while writing the records of step 1 in {run}; kept no checkpoint and "
                               f"metrics up to step 0; free space and start again with --overwrite (no checkpoint "
                               f"to resume from)")
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [0]


def test_disk_full_in_a_checkpoint_file_injected(tmp_path, tiny_model_dir, monkeypatch):
    run = tmp_path / "run"
    trainer = Trainer(tiny(run, tiny_model_dir, "train.steps=2", "train.save_every=1"), progress=False)

    def full(*_, **__):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(run / "checkpoints" / ".tmp-x"))

    _stop_before_checkpoint(trainer, 2, lambda: monkeypatch.setattr(checkpoint, "save_state", full))
    with pytest.raises(RunDirError, match=r"^disk full while writing checkpoint step_2 in .*; kept checkpoint step_1 "
                                          r"and metrics up to step 1; free space and run with --resume$"):
        trainer.train()


def test_a_folder_turned_read_only_mid_run_is_one_line(tmpfs, tiny_model_dir):
    run = tmpfs / "run"
    trainer = Trainer(tiny(run, tiny_model_dir, "train.steps=2", "train.save_every=1"), progress=False)
    _stop_before_checkpoint(trainer, 2, lambda: _remount(tmpfs, "ro"))
    with pytest.raises(RunDirError, match=r"^cannot write checkpoint step_2: .* is not writable \(Read-only file system\); "
                                          r"kept checkpoint step_1 and metrics up to step 1; make .* writable"):
        trainer.train()


def test_a_read_only_run_folder_is_one_line_from_the_command_line(tmpfs, tiny_model_dir, capsys):
    _remount(tmpfs, "ro")
    code = main(["train", f"run_dir={tmpfs / 'run'}", f"models.main.path={tiny_model_dir}", *TINY, "train.steps=1"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"error: cannot write the run folder: {tmpfs / 'run'} is not writable"), err


def test_resuming_in_a_read_only_folder_is_one_line_before_any_tracker_starts(tmpfs, tiny_model_dir, capsys):
    run = tmpfs / "run"
    Trainer(tiny(run, tiny_model_dir, "train.steps=1"), progress=False).train()
    _remount(tmpfs, "ro")
    capsys.readouterr()
    args = [f"run_dir={run}", f"models.main.path={tiny_model_dir}", *TINY, "train.steps=2", "train.loggers=[tensorboard]"]
    assert main(["train", *args, "--resume", "--allow-change", "train.steps"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and not list(run.glob("tensorboard/*")), err
    assert (f"error: cannot write the run folder: {run} is not writable (Read-only file system); kept checkpoint "
            f"step_1 and metrics up to step 0; make {run} writable") in err


# ------------------------------------------------------------------ a checkpoint writer killed mid-write

WRITER = """
import sys, time
from pathlib import Path
import torch
from teamrl.learner import checkpoint

class Learner:
    def weight_files(self):
        return {"model-m": {"w": torch.zeros(1000)}}
    def state_dict(self):
        time.sleep(600)  # the weights are on disk; killed here

checkpoint.save(Path(sys.argv[1]), 1, {"m": Learner()}, {})
"""


def test_a_checkpoint_folder_of_a_killed_writer_is_removed_and_a_live_ones_kept(tmp_path):
    root = tmp_path / "checkpoints"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(root)], cwd=REPO)
    try:
        deadline = time.time() + 60
        while not list(root.glob(".tmp-*/model-m.safetensors")) and time.time() < deadline:
            time.sleep(0.05)
        (tmp,) = root.glob(".tmp-*")
        assert checkpoint.remove_stale_tmp(root, min_age_s=0) == [] and tmp.is_dir()  # still being written
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert checkpoint.remove_stale_tmp(root) == [tmp] and not tmp.exists()


def test_a_run_start_removes_stale_tmp_folders(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    stale = run / "checkpoints" / ".tmp-abc"
    stale.mkdir(parents=True)
    (stale / checkpoint.TMP_LOCK).touch()
    (stale / "model-main.safetensors").write_bytes(b"\0" * 1000)
    Trainer(tiny(run, tiny_model_dir, "train.steps=1"), progress=False)
    assert not stale.exists()


# ------------------------------------------------------------------ a new run in a used folder


def test_a_new_run_in_a_used_folder_is_refused_and_overwrite_moves_the_old_records(tmp_path, tiny_model_dir, capsys):
    run = tmp_path / "run"
    Trainer(tiny(run, tiny_model_dir, "train.steps=1"), progress=False).train()
    rows = (run / "metrics.jsonl").read_text()
    with pytest.raises(RunDirError, match=r"holds an earlier run's records \(metrics.jsonl; episodes.jsonl; "
                                          r"summary.json; checkpoints/step_1\); continue it with --resume"):
        Trainer(tiny(run, tiny_model_dir, "train.steps=1"), progress=False)
    assert (run / "metrics.jsonl").read_text() == rows and (run / "checkpoints" / "latest").read_text() == "step_1"
    capsys.readouterr()  # progress bars of the run above
    args = ["train", f"run_dir={run}", f"models.main.path={tiny_model_dir}", *TINY, "train.steps=1"]
    assert main(args) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "--overwrite" in lines[0] and "Traceback" not in err, err
    assert main([*args, "--resume", "--overwrite"]) == 2
    assert main([*args, "--overwrite"]) == 0
    (aside,) = tmp_path.glob("run.replaced-*")
    assert (aside / "metrics.jsonl").read_text() == rows  # nothing deleted
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [0]


def test_an_empty_or_config_only_folder_is_not_used(tmp_path):
    (tmp_path / "config.yaml").write_text("{}")
    (tmp_path / "metrics.jsonl").write_text("")  # emptied by teamrl ablate before a cell starts again
    assert rundir.used_records(tmp_path) == []
    assert rundir.claim(tmp_path, resume=False, overwrite=False) is None


def test_a_permission_error_outside_the_run_folder_passes_unchanged(tmp_path):
    with pytest.raises(PermissionError), rundir.guard(tmp_path / "run", "the run's records"):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "data" / "train.jsonl"))
    with pytest.raises(RunDirError, match=r"^cannot write x: .*/run/metrics.jsonl is not writable"), \
            rundir.guard(tmp_path / "run", "x"):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "run" / "metrics.jsonl"))
