"""Domains: one sub-package per kind of problem a team learns, each holding its tasks and its workflows.

A domain's ``__init__.py`` names the modules that register its tasks (``TASKS``) and its workflows
(``WORKFLOWS``); :func:`builtin_modules` finds every domain here, so adding a domain is one new folder
(plus a config under ``configs/``) and nothing else changes. The core a domain builds on:
:mod:`teamrl.tasks` (the task and environment contracts), :mod:`teamrl.team` (the team handle, agents,
records, the workflow registry), :mod:`teamrl.sandbox` (running model-written code).

This package imports no domain: the registries import the modules it names when a name is first looked up.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Literal

__all__ = ["builtin_modules", "register"]


def builtin_modules(kind: Literal["TASKS", "WORKFLOWS"]) -> tuple[str, ...]:
    """The modules that register the built-in tasks (``"TASKS"``) or workflows (``"WORKFLOWS"``), domain by domain
    in alphabetical order.

    >>> "teamrl.domains.math.arith" in builtin_modules("TASKS")
    True
    """
    found: list[str] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.ispkg:
            domain = importlib.import_module(f"{__name__}.{info.name}")
            found += [f"{domain.__name__}.{m}" for m in getattr(domain, kind, ())]
    return tuple(found)


def register(kind: Literal["tasks", "workflows"]) -> None:
    """The ``teamrl.plugins`` entry point of the built-in domains (:mod:`teamrl.plugins`): import the modules that
    register their tasks (``"tasks"``) or workflows (``"workflows"``)."""
    for module in builtin_modules("TASKS" if kind == "tasks" else "WORKFLOWS"):
        importlib.import_module(module)
