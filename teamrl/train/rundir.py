"""The run folder's records across faults: who may write into a folder, what a resume keeps, what a
full disk leaves.

- :func:`claim`: a new run refuses a folder that holds an earlier run's records unless told to
  continue it (``--resume``) or to start over (``--overwrite``, which moves the old records aside to
  ``<run_dir>.replaced-<UTC time>``, deleting nothing).
- :func:`drop_rows_from`: on resume, JSON-lines rows written after the checkpoint go, and so does a
  torn last line (a write cut short by a kill or a full disk), with a warning naming file and line.
- :func:`guard`: a full disk or a read-only folder while writing ends in one :class:`RunDirError`
  line saying what was being written and what was kept, instead of a traceback.

Not here: how the records are written (:mod:`teamrl.metrics.sinks`, :mod:`teamrl.learner.checkpoint`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from teamrl.learner import checkpoint

log = logging.getLogger(__name__)

__all__ = ["RECORDS", "RunDirError", "check_writable", "claim", "drop_rows_from", "guard", "kept", "used_records"]

RECORDS = ("metrics.jsonl", "episodes.jsonl", "failed_episodes.jsonl")
"""The JSON-lines files a training run appends to, one row per step (or per episode) with its ``step``."""

_FULL = {errno.ENOSPC, errno.EDQUOT}
_READ_ONLY = {errno.EROFS, errno.EACCES, errno.EPERM}


class RunDirError(ValueError):
    """The run folder cannot be used as asked (earlier records, a full disk, no write permission)."""


def used_records(run_dir: Path) -> list[str]:
    """The records of an earlier run in ``run_dir``: non-empty JSON-lines files, summary.json, checkpoints.

    >>> used_records(Path("/nonexistent"))
    []
    """
    found = [n for n in RECORDS if (run_dir / n).is_file() and (run_dir / n).stat().st_size > 0]
    if (run_dir / "summary.json").is_file():
        found.append("summary.json")
    ckpt = run_dir / "checkpoints"
    steps = sorted(p.name for p in ckpt.glob("step_*") if p.is_dir()) if ckpt.is_dir() else []
    if steps or (ckpt / "latest").is_file():
        found.append(f"checkpoints/{', '.join(steps) or 'latest'}")
    return found


def claim(run_dir: Path, *, resume: bool, overwrite: bool) -> Path | None:
    """Check that a run may write into ``run_dir``; with ``overwrite``, move an earlier run's records aside.

    Args:
        run_dir: the run folder (need not exist).
        resume: the run continues the folder's records (``--resume``).
        overwrite: a new run replaces them (``--overwrite``).

    Returns:
        Where the earlier records went (``<run_dir>.replaced-<UTC time>``), or None when nothing moved.

    Raises:
        RunDirError: both flags, or a new run in a used folder without ``overwrite``.
    """
    if resume and overwrite:
        raise RunDirError("--resume continues a run and --overwrite starts it over; give one of them")
    found = [] if resume else used_records(run_dir)
    if not found:
        return None
    if not overwrite:
        raise RunDirError(f"run_dir {run_dir} holds an earlier run's records ({'; '.join(found)}); continue it with "
                          f"--resume, start over with --overwrite (moves them to {run_dir}.replaced-<time>), "
                          f"or set another run_dir")
    aside = run_dir.with_name(f"{run_dir.name}.replaced-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    try:
        os.rename(run_dir, aside)
    except OSError as exc:
        if exc.errno in _FULL | _READ_ONLY:
            raise  # guard() says what it means for the run
        raise RunDirError(f"--overwrite: cannot move {run_dir} to {aside} ({exc.strerror}); move or delete it "
                          f"yourself, or set another run_dir") from None
    log.warning("--overwrite: the earlier records of %s moved to %s", run_dir, aside)
    return aside


def check_writable(run_dir: Path) -> None:
    """Create and remove a file in ``run_dir``, so a read-only folder fails here, before trackers start threads.

    Raises:
        OSError: naming ``run_dir`` (EROFS, EACCES, ENOSPC, ...).
    """
    try:
        with tempfile.TemporaryFile(dir=run_dir):
            pass
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(run_dir)) from None


def drop_rows_from(path: Path, step: int) -> int:
    """Remove the rows of a JSON-lines file whose ``step`` is >= ``step`` (written after the checkpoint a run
    resumes from) and a torn last line (logged with the file and line number); the file is rewritten atomically.

    Returns:
        How many lines were removed.

    Raises:
        RunDirError: a line other than the last is not JSON (the file was edited or damaged: fix or remove it).
    """
    if not path.is_file():
        return 0
    lines = path.read_bytes().splitlines(keepends=True)
    keep = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            keep.append(line)
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            if number < len(lines) and line.endswith(b"\n"):
                raise RunDirError(f"{path} line {number} is not a JSON row ({exc}); fix or remove that line, "
                                  f"then resume again") from None
            log.warning("%s line %d: dropped a torn last line (%d bytes; a write cut short by a kill or a full "
                        "disk)", path, number, len(line))
            continue
        if not isinstance(row, dict) or row.get("step", -1) < step:
            keep.append(line)
    if len(keep) == len(lines):
        return 0
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(b"".join(keep))
    os.replace(tmp, path)
    return len(lines) - len(keep)


def kept(run_dir: Path) -> str:
    """What ``run_dir`` holds that a resume can continue from, in words.

    >>> kept(Path("/nonexistent"))
    'no checkpoint and no metrics'
    """
    ckpt = run_dir / "checkpoints"
    steps = sorted(int(m.group(1)) for p in (ckpt.iterdir() if ckpt.is_dir() else [])
                   if (m := re.fullmatch(r"step_(\d+)", p.name)) and checkpoint.is_checkpoint(p))
    parts = ["no checkpoint" if not steps else f"checkpoint step_{steps[0]}" if len(steps) == 1
             else f"checkpoints step_{steps[0]}..step_{steps[-1]}" if len(steps) == steps[-1] - steps[0] + 1
             else "checkpoints " + ", ".join(f"step_{s}" for s in steps)]
    last = _last_step(run_dir / "metrics.jsonl")
    parts.append("no metrics" if last is None else f"metrics up to step {last}")
    return " and ".join(parts)


def _last_step(path: Path) -> int | None:
    try:
        tail = path.read_bytes()[-65536:].splitlines()
    except OSError:
        return None
    for line in reversed(tail):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue
    return None


@contextmanager
def guard(run_dir: Path, what: str) -> Iterator[None]:
    """Turn a full disk or a read-only ``run_dir`` met while writing ``what`` into one :class:`RunDirError` line.

    Args:
        run_dir: the run folder.
        what: what is being written, for the message (e.g. ``"checkpoint step_3"``).

    Raises:
        RunDirError: from an OSError with errno ENOSPC/EDQUOT (disk full), or EROFS/EACCES/EPERM (not writable)
            on a path inside ``run_dir``; other errors pass unchanged.
    """
    try:
        yield
    except OSError as exc:
        if exc.errno in _FULL:
            have = kept(run_dir)
            then = ("run with --resume" if not have.startswith("no checkpoint")
                    else "start again with --overwrite (no checkpoint to resume from)")
            raise RunDirError(f"disk full while writing {what} in {run_dir}; kept {have}; free space and {then}") from None
        where = os.fsdecode(exc.filename) if exc.filename else run_dir
        path, root = Path(where).resolve(), run_dir.resolve()
        if exc.errno in _READ_ONLY and (path.is_relative_to(root) or root.is_relative_to(path)):  # not a data file
            raise RunDirError(f"cannot write {what}: {where} is not writable ({exc.strerror}); kept {kept(run_dir)}; "
                              f"make {run_dir} writable (or set another run_dir) and run again "
                              f"(with --resume to continue)") from None
        raise
