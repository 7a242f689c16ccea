"""Math: word problems graded by their final answer.

* ``arith``: synthetic integer arithmetic from a seed (:mod:`.arith`).
* ``math``: GSM8K / MATH-style data from files or a Hugging Face dataset, graded with math-verify (:mod:`.math`).

Its teams are the core's built-in workflows (:mod:`teamrl.team.workflows`: ``single``, ``math_team``;
:mod:`teamrl.team.tree`: ``math_tree``), which the other domains reuse.
"""

TASKS: tuple[str, ...] = ("arith", "math")
"""Modules that register this domain's tasks (imported on first lookup)."""
WORKFLOWS: tuple[str, ...] = ()
"""Modules that register this domain's workflows."""
