"""``teamrl train --help-config`` lists what the registries hold, never a hand-kept list."""

from __future__ import annotations

import dataclasses

from teamrl.algos.estimators import PRESETS
from teamrl.config.schema import help_config
from teamrl.config.tools import describe
from teamrl.tasks.base import TASKS, load_builtin_tasks, register_task
from teamrl.team.registry import WORKFLOWS, load_builtin_workflows


def _registered_line(text: str, key: str) -> set[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{key}:"))
    line = next(line for line in lines[start + 1:] if line.strip().startswith("Registered ("))
    return {n.strip() for n in line.split(":", 1)[1].rstrip(".").split(",")}


def test_help_config_names_every_registered_task_workflow_and_estimator() -> None:
    load_builtin_tasks()
    load_builtin_workflows()
    text = help_config()
    assert _registered_line(text, "task.name") == set(TASKS)
    assert _registered_line(text, "workflow.name") == set(WORKFLOWS)
    assert _registered_line(text, "eval.workflow") == set(WORKFLOWS)
    assert _registered_line(text, "algo.estimator") == set(PRESETS)
    assert len(WORKFLOWS) >= 12 and len(TASKS) >= 13  # the domains' registrations were all found


def test_a_task_registered_later_is_listed_too() -> None:
    @dataclasses.dataclass
    class Opts:
        n: int = 1

    @register_task("help_config_probe", config=Opts)
    def _probe(cfg: Opts) -> object:  # pragma: no cover - never built
        raise AssertionError

    try:
        assert "help_config_probe" in _registered_line(help_config(), "task.name")
    finally:
        TASKS.pop("help_config_probe", None)


def test_describe_lists_registered_names_under_the_key() -> None:
    @dataclasses.dataclass
    class C:
        pick: str = "a"
        """Which one."""

    assert describe(C, registered={"pick": ["b", "a"]}).splitlines() == [
        "pick: str = a", "    Which one.", "    Registered (2): a, b."]
