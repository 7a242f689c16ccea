"""Code: programs written by the team, run only in the sandbox and scored by tests.

Tasks: ``humaneval`` (:mod:`.humaneval`), ``pyfunc`` (procedural, :mod:`.pyfunc`), ``code_files`` (a user"s
MBPP/APPS/CodeContests/LiveCodeBench files, :mod:`.code_files`); what they share: :mod:`.code` (problems, tests,
verdicts, feedback; :mod:`.code_harness` runs inside the sandbox) and :mod:`.code_task` (scoring).
Workflows: ``code_team`` (AT-GRPO coder + tester), ``code_tree`` (MARS2), ``code_pair`` (MAGRPO); :mod:`.code_exec`
is how they run programs.
"""

TASKS: tuple[str, ...] = ("humaneval", "pyfunc", "code_files")
"""Modules that register this domain's tasks (imported on first lookup)."""
WORKFLOWS: tuple[str, ...] = ("code_team", "code_tree", "code_pair")
"""Modules that register this domain's workflows."""
