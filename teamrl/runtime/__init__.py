"""Where the models run: the one place the backend is chosen.

:func:`build` turns a config into a :class:`Runtime` — every physical model's engine and learner —
in this process (``backend: local``, :mod:`teamrl.runtime.local`) or as Ray actors behind proxies
(``backend: ray``, :mod:`teamrl.runtime.distributed`, the only package that imports Ray). The training loop receives the runtime and never
asks which backend it has: both kinds keep the engine and learner contracts
(:class:`teamrl.engines.base.Engine`, :class:`teamrl.learner.base.Learner`).
"""

from __future__ import annotations

from pathlib import Path

from teamrl import hardware
from teamrl.config.schema import Config
from teamrl.runtime.base import Runtime

__all__ = ["Runtime", "build", "prepare"]


def prepare(cfg: Config) -> Config:
    """The config the run uses: ``auto`` devices and dtypes resolved (and logged) here for ``backend: local``;
    with ``backend: ray`` each actor resolves its own model on its own hardware."""
    return hardware.resolve_config(cfg) if cfg.backend == "local" else cfg


def build(cfg: Config, run_dir: str | Path) -> Runtime:
    """Load or start every model some agent uses, on the configured backend."""
    if cfg.backend == "ray":
        from teamrl.runtime.distributed import backend  # optional dependency: imported only when asked for

        return backend.build(cfg, Path(run_dir))
    from teamrl.runtime import local

    return local.build(cfg)
