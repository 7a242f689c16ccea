"""Catalogues: adapters to outside collections of tasks and environments (reasoning-gym, Gymnasium).

They run with the core's ``single`` workflow and the environment workflows.
"""

TASKS: tuple[str, ...] = ("catalogues",)
"""Modules that register this domain's tasks (imported on first lookup)."""
WORKFLOWS: tuple[str, ...] = ()
"""Modules that register this domain's workflows."""
