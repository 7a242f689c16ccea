"""Environments: agents act turn by turn in a state (the contract: :mod:`teamrl.tasks.env`).

* :mod:`.planning`: AT-GRPO"s Plan-Path, Sokoban and Sudoku; :mod:`.sokoban_pettingllms` (with :mod:`.sokoban_rooms`):
  PettingLLMs' Sokoban, ``task.sokoban.variant: pettingllms``.
* :mod:`.textarena`: TextArena games, single-player and two-player.
* :mod:`.env_team`: the workflows that drive an environment (``env_single``, ``env_team`` and their AT-GRPO tree
  sampling variants), over :mod:`.env_steps` (the pieces of a turn) and :mod:`.pettingllms_order` (PettingLLMs'
  turn order, ``turn_order: pettingllms``).
* :mod:`.games`: two-player games (``game_selfplay``, ``game_vs_random``).
"""

TASKS: tuple[str, ...] = ("planning", "sudoku", "textarena")
"""Modules that register this domain's tasks (imported on first lookup)."""
WORKFLOWS: tuple[str, ...] = ("env_team", "games")
"""Modules that register this domain's workflows."""
