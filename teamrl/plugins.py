"""Plug-ins: the packages that register tasks, workflows and scoring stages, found through entry points.

A package registers by naming a module, or a function ``register(kind)``, under the entry-point group
``teamrl.plugins`` of its ``pyproject.toml``::

    [project.entry-points."teamrl.plugins"]
    my_tasks = "my_package.teamrl_tasks"          # a module: imported once, it registers on import
    my_domain = "my_package.domain:register"      # a function: called with "tasks" or "workflows"

teamrl's own domains and its agent-program workflow are registered the same way (teamrl's
``pyproject.toml``), so the core names none of them: :func:`load_plugins` is the one hook through which the
task and workflow registries find everything that is not the core's.
"""

from __future__ import annotations

import importlib.metadata
import types
from typing import Literal

__all__ = ["GROUP", "load_plugins"]

GROUP = "teamrl.plugins"
_done: set[tuple[str, str]] = set()


def load_plugins(kind: Literal["tasks", "workflows"]) -> None:
    """Load every ``teamrl.plugins`` entry point for ``kind`` (idempotent): import a module entry point, call a
    function entry point with ``kind``. A plug-in that fails to load raises one ImportError naming it."""
    points = importlib.metadata.entry_points(group=GROUP)
    if not any(p.value.startswith("teamrl.") for p in points):
        raise ImportError("teamrl's own plug-ins (its domains) are not registered: teamrl runs from a source tree "
                          "that was not installed; install it (pip install -e .)")
    for point in sorted(points, key=lambda p: (not p.value.startswith("teamrl."), p.name)):
        if (point.value, kind) in _done:
            continue
        _done.add((point.value, kind))
        try:
            found = point.load()
            if callable(found) and not isinstance(found, types.ModuleType):
                found(kind)
        except Exception as exc:
            _done.discard((point.value, kind))
            raise ImportError(f"teamrl plug-in {point.name!r} ({point.value}) failed to load: "
                              f"{type(exc).__name__}: {exc}") from exc
