"""Checkpoints: weights, optimizer and scheduler per physical model, RNG states, data cursor.

Every file is safetensors (:mod:`teamrl.learner.safestate`): reading a checkpoint never executes
code. Weights are what each learner trains: ``model-<name>.safetensors`` for a fully trained
model (parameter names as in the model's ``state_dict``), or ``adapter-<name>-<adapter>.safetensors``
per LoRA adapter (the frozen base is reloaded from its path). ``optim-<name>.safetensors`` holds
the optimizer and scheduler state, ``trainer.safetensors`` the RNG states, data cursor, results
and the engines' sampling generators.

A checkpoint is a directory ``checkpoints/step_<n>`` written under a temporary name and renamed
into place, so a crash mid-write never leaves a half checkpoint; ``checkpoints/latest`` names
the newest complete one. After each save :func:`prune` keeps the newest ``train.keep_checkpoints``
checkpoints: only the newest keeps its ``optim-*`` files (what ``--resume`` reads with it), the older
kept ones hold weights and trainer state only (enough for ``teamrl eval`` and ``teamrl export``).
The writer holds an exclusive ``flock`` on ``.tmp-*/.writer.lock`` while
it writes, so :func:`remove_stale_tmp` can tell the folder of a killed writer (removed when a run
starts or resumes) from one being written.
"""

from __future__ import annotations

import fcntl
import logging
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from teamrl.learner.safestate import CheckpointError, load_state, load_weights, save_state, save_weights

__all__ = ["CheckpointError", "latest", "load", "load_weights_only", "prune", "remove_stale_tmp", "rng_state",
           "save", "save_trainer_state", "set_rng_state"]

log = logging.getLogger(__name__)

TRAINER = "trainer.safetensors"
TMP_LOCK = ".writer.lock"
"""File inside a ``.tmp-*`` folder on which its writer holds an exclusive ``flock`` (released when it dies)."""


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(root: Path, step: int, learners: dict[str, Any], trainer_state: dict[str, Any]) -> Path:
    """Write checkpoint ``step`` atomically; returns its directory."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
    try:
        with (tmp / TMP_LOCK).open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            for name, learner in learners.items():
                for key, weights in learner.weight_files().items():
                    save_weights(tmp / f"{key}.safetensors", weights)
                save_state(tmp / f"optim-{name}.safetensors", learner.state_dict())
            save_state(tmp / TRAINER, {**trainer_state, "rng": rng_state(), "step": step})
            (tmp / TMP_LOCK).unlink()  # complete: the folder is a checkpoint, not a writer's
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    pointer = root / ".latest.tmp"
    pointer.write_text(final.name)
    os.replace(pointer, root / "latest")
    return final


def save_trainer_state(root: Path, step: int, trainer_state: dict[str, Any]) -> Path:
    """Replace the trainer state of the complete checkpoint ``step`` (weights and optimizer states unchanged, e.g.
    after the final evaluation added its results); the file is replaced atomically. Returns the checkpoint's folder."""
    final = root / f"step_{step}"
    if not is_checkpoint(final):
        raise CheckpointError(f"no complete checkpoint {final} to record the trainer state in")
    tmp = final / f".{TRAINER}.tmp"
    save_state(tmp, {**trainer_state, "rng": rng_state(), "step": step})
    os.replace(tmp, final / TRAINER)
    return final


def steps(root: Path) -> list[int]:
    """The steps of the complete checkpoints under ``root``, oldest first."""
    found = [int(p.name[5:]) for p in root.glob("step_*") if p.name[5:].isdigit()] if root.is_dir() else []
    return sorted(s for s in found if is_checkpoint(root / f"step_{s}"))


def prune(root: Path, keep: int) -> list[Path]:
    """Keep the newest ``keep`` checkpoints under ``root``; all of them but the newest lose their optimizer state.

    The newest is the one ``latest`` names (the highest step when it names none). Run right after a
    :func:`save` completed, so a crash at any point leaves the newest checkpoint whole.

    Returns:
        The files and folders removed.
    """
    if keep < 1:
        raise ValueError(f"train.keep_checkpoints {keep} would keep no checkpoint to resume from; set it to 1 or more")
    found = steps(root)
    newest = latest(root)
    newest_step = int(newest.name[5:]) if newest is not None else (found[-1] if found else None)
    older = [s for s in found if s != newest_step]
    removed: list[Path] = []
    for s in older[: max(0, len(older) - (keep - 1))]:
        shutil.rmtree(root / f"step_{s}", ignore_errors=True)
        removed.append(root / f"step_{s}")
    for s in older[max(0, len(older) - (keep - 1)):]:
        for f in sorted((root / f"step_{s}").glob("optim-*.safetensors")):
            f.unlink()
            removed.append(f)
    if removed:
        log.info("train.keep_checkpoints %d: removed %s", keep, ", ".join(str(p.relative_to(root)) for p in removed))
    return removed


def remove_stale_tmp(root: Path, min_age_s: float = 60.0) -> list[Path]:
    """Remove the ``.tmp-*`` folders under ``root`` that no live process is writing (a writer killed mid-save).

    A folder is being written while its :data:`TMP_LOCK` is locked; one without that file is left alone
    for ``min_age_s`` after its last change (its writer may be about to create it).

    Returns:
        The folders removed.
    """
    removed = []
    for tmp in sorted(root.glob(".tmp-*")) if root.is_dir() else []:
        if not tmp.is_dir() or _being_written(tmp, min_age_s):
            continue
        size = sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file())
        shutil.rmtree(tmp, ignore_errors=True)
        log.warning("removed %s (%.1f MB), a checkpoint whose writer stopped before it was complete", tmp, size / 1e6)
        removed.append(tmp)
    return removed


def _being_written(tmp: Path, min_age_s: float) -> bool:
    lock = tmp / TMP_LOCK
    if not lock.is_file():
        return time.time() - tmp.stat().st_mtime < min_age_s
    with lock.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False


def latest(root: Path) -> Path | None:
    """The newest complete checkpoint under ``root``, or None."""
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    return path if is_checkpoint(path) else None


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a complete checkpoint directory (of this format or the old one)."""
    return (path / TRAINER).is_file() or (path / "trainer.pt").is_file()


def _check_format(path: Path) -> None:
    if not (path / TRAINER).is_file() and (path / "trainer.pt").is_file():
        raise CheckpointError(
            f"checkpoint {path} is in the old pickle format (*.pt), which teamrl no longer reads because "
            "unpickling can run code; train again, or convert it with a teamrl version that wrote it")


def _load_weights(path: Path, learners: dict[str, Any]) -> None:
    for name, learner in learners.items():
        files = {}
        for key in learner.weight_files():
            f = path / f"{key}.safetensors"
            if not f.is_file():
                raise CheckpointError(f"checkpoint {path} has no weights {key!r} of model {name!r} ({f.name}); "
                                      f"resume with the models and adapters the checkpoint was written with")
            files[key] = load_weights(f)
        learner.load_weight_files(files)


def load_weights_only(path: Path, learners: dict[str, Any]) -> None:
    """Restore the learners' weights from checkpoint ``path``; nothing else is read (evaluation)."""
    _check_format(path)
    _load_weights(path, learners)


def load(path: Path, learners: dict[str, Any]) -> dict[str, Any]:
    """Restore weights and optimizers in place; returns the trainer state (RNG already restored)."""
    _check_format(path)
    _load_weights(path, learners)
    for name, learner in learners.items():
        optim = path / f"optim-{name}.safetensors"
        if not optim.is_file():
            raise CheckpointError(f"checkpoint {path} holds weights only, no optimizer state of model {name!r} "
                                  f"(train.keep_checkpoints keeps it in the newest checkpoint only); resume from "
                                  f"the one {path.parent / 'latest'} names, or evaluate this one with teamrl eval")
        learner.load_state_dict(load_state(optim))
    state = load_state(path / TRAINER)
    set_rng_state(state["rng"])
    return state
