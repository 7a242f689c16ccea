"""AT-GRPO's planning environments (arXiv 2510.11062): Plan-Path, Sokoban and Sudoku, with difficulty knobs.

Each is an :class:`~teamrl.tasks.env.Environment` registered as a task of the same name; a problem's
``meta['seed']`` draws the instance. Actions are JSON after ``####`` (as in the PettingLLMs prompts):

* ``plan_path``: a grid with walls ``#``, start and goal; an action is a list of moves
  (``#### ["R", "D"]``). Reward per move (PettingLLMs' defaults): −0.01 per move, −0.1 for a move
  into a wall or off the grid (the agent stays), potential shaping 0.99·φ(next) − φ(now) with
  φ = −Manhattan distance to the goal, +1 on reaching the goal and +0.5 more when the whole path
  so far is a shortest one. An action with no move list: −1. Knobs: ``size``, ``wall_ratio``.
* ``sokoban``: a walled room, ``boxes`` boxes and as many goals; an action is a list of moves, the
  player pushes boxes. Reward: −0.01 per move, +1 per box pushed onto a goal, −1 per box pushed off
  one, +1 when all boxes are on goals; no move list: −1. Instances are made by pulling boxes
  backwards from a solved room (``pulls`` random steps), so every instance is solvable. Knobs:
  ``size``, ``boxes``, ``pulls``. ``variant: pettingllms`` is PettingLLMs' Sokoban instead (rooms with
  internal walls, its rewards and step cap ``max_steps``, its prompts:
  :mod:`teamrl.domains.environments.sokoban_pettingllms`).
* ``sudoku``: a ``size``×``size`` grid (4 or 9) with ``blanks`` empty cells (``0``); an action is, as
  PettingLLMs' Sudoku takes either, the full grid (``#### [[1,2,3,4], ...]``) or a list of fill
  steps ``[row, column, digit]`` counted from 0 (``#### [[0, 2, 3]]``), applied in order. Reward: 1
  when the grid is then a valid solution keeping every given digit, else 0, and −1 for an action of
  neither shape, a grid that changes a given, or a fill step into a filled cell, off the grid or
  repeating a digit of its row, column or box (the steps before it stay placed).

Left out: PettingLLMs' other stateful environments (Blocksworld, N-Queens, ...).
"""

from __future__ import annotations

import ast
import json
import random
import re
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from teamrl.domains.environments.sokoban_pettingllms import SokobanPettingLLMs
from teamrl.tasks.base import Problem
from teamrl.tasks.env import EnvConfig, Turn, few_turns_smoke, register_env

__all__ = ["PlanPath", "PlanPathConfig", "Sokoban", "SokobanConfig", "make_sokoban", "parse_json_after"]
# Sudoku, the third of the family, is teamrl.domains.environments.sudoku.

MOVES = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}


def parse_json_after(text: str) -> Any | None:
    """The JSON (or Python literal) list after the last ``####`` of a reply, or None.

    >>> parse_json_after('I go right then down. #### ["R", "D"]')
    ['R', 'D']
    >>> parse_json_after("no marker") is None
    True
    """
    parts = text.rsplit("####", 1)
    if len(parts) < 2:
        return None
    match = re.search(r"\[.*\]", parts[1], re.DOTALL)
    if not match:
        return None
    for load in (json.loads, ast.literal_eval):
        try:
            value = load(match.group(0))
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        return value if isinstance(value, list) else None
    return None


def parse_moves(text: str) -> list[str] | None:
    """A move list ``#### ["U", "R"]`` (letters in any case, also ``UP``/``right``), or None.

    >>> parse_moves('#### ["r", "DOWN"]')
    ['R', 'D']
    >>> parse_moves('#### ["X"]') is None
    True
    """
    value = parse_json_after(text)
    if not value:
        return None
    words = {"UP": "U", "DOWN": "D", "LEFT": "L", "RIGHT": "R"}
    out = []
    for v in value:
        key = str(v).strip().upper()
        key = words.get(key, key)
        if key not in MOVES:
            return None
        out.append(key)
    return out


def _bfs(free: set[tuple[int, int]], start: tuple[int, int], goal: tuple[int, int]) -> int | None:
    """Shortest number of moves from ``start`` to ``goal`` over ``free`` cells, or None when unreachable."""
    dist = {start: 0}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            return dist[cell]
        for dr, dc in MOVES.values():
            nxt = (cell[0] + dr, cell[1] + dc)
            if nxt in free and nxt not in dist:
                dist[nxt] = dist[cell] + 1
                queue.append(nxt)
    return None


@dataclass(kw_only=True)
class PlanPathConfig(EnvConfig):
    size: int = 4
    """Grid side (size × size cells)."""
    wall_ratio: float = 0.2
    """Chance that a cell is a wall (start and goal are always connected)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.size < 2:
            raise ValueError(f"size {self.size} must be >= 2")
        if not 0 <= self.wall_ratio < 0.6:
            raise ValueError(f"wall_ratio {self.wall_ratio} must be in [0, 0.6)")


@register_env("plan_path", config=PlanPathConfig, smoke=few_turns_smoke("plan_path"))
class PlanPath:
    """Grid path planning (PettingLLMs' Plan-Path)."""

    action_format = 'End with #### and a JSON list of moves U, D, L, R, e.g. #### ["R", "D"].'

    def __init__(self, cfg: PlanPathConfig) -> None:
        self.cfg, self.max_turns = cfg, cfg.max_turns
        self.free: set[tuple[int, int]] = set()
        self.pos = self.start = self.goal = (0, 0)
        self.shortest, self.moves = 0, 0

    def reset(self, problem: Problem) -> str:
        rng, n = random.Random(problem.meta["seed"]), self.cfg.size
        while True:
            free = {(r, c) for r in range(n) for c in range(n) if rng.random() >= self.cfg.wall_ratio}
            if len(free) < 2:
                continue
            start, goal = rng.sample(sorted(free), 2)
            shortest = _bfs(free, start, goal)
            if shortest is not None:
                break
        self.free, self.start, self.goal, self.pos, self.shortest, self.moves = free, start, goal, start, shortest, 0
        return self.render()

    def render(self) -> str:
        n = self.cfg.size
        rows = ["".join("A" if (r, c) == self.pos else "G" if (r, c) == self.goal else "." if (r, c) in self.free
                        else "#" for c in range(n)) for r in range(n)]
        return ("Move A to G on this grid (# is a wall, . is free; U is up, D down, L left, R right):\n"
                + "\n".join(rows) + f"\nA is at row {self.pos[0]}, column {self.pos[1]}; G is at row "
                f"{self.goal[0]}, column {self.goal[1]}.")

    def parse_action(self, text: str) -> list[str] | None:
        return parse_moves(text)

    def _phi(self, cell: tuple[int, int]) -> float:
        return -float(abs(cell[0] - self.goal[0]) + abs(cell[1] - self.goal[1]))

    def step(self, action: Any | None) -> Turn:
        if action is None or not isinstance(action, list):
            return Turn(self.render(), -1.0, False, {"message": "no move list found", "invalid": True})
        reward, bumps = 0.0, 0
        for move in action:
            if move not in MOVES:
                return Turn(self.render(), -1.0, False, {"message": f"unknown move {move!r}", "invalid": True})
            dr, dc = MOVES[move]
            nxt = (self.pos[0] + dr, self.pos[1] + dc)
            reward -= 0.01
            self.moves += 1
            if nxt not in self.free:
                reward -= 0.1
                bumps += 1
                nxt = self.pos
            reward += 0.99 * self._phi(nxt) - self._phi(self.pos)
            self.pos = nxt
            if self.pos == self.goal:
                reward += 1.0 + (0.5 if self.moves == self.shortest else 0.0)
                return Turn(self.render(), reward, True, {"message": "reached the goal"})
        msg = f"{len(action)} moves, {bumps} into walls; A is now at row {self.pos[0]}, column {self.pos[1]}"
        return Turn(self.render(), reward, False, {"message": msg})

    @property
    def success(self) -> bool:
        return self.pos == self.goal


@dataclass(kw_only=True)
class SokobanConfig(EnvConfig):
    size: int = 5
    """Room side including the outer wall (size − 2 free cells per row)."""
    boxes: int = 1
    """Boxes (and goals)."""
    pulls: int = 6
    """Random backward steps from the solved room; more pulls, harder instances (variant teamrl)."""
    variant: Literal["teamrl", "pettingllms"] = "teamrl"
    """teamrl: rooms without internal walls made by pulls backward steps; reward -0.01 per move, +1/-1 per box pushed onto/off a goal, +1 on a win, -1 for a reply without a move list. pettingllms: PettingLLMs' Sokoban (docs/environments.md; env_state.py:1219-1662 of its multi_agent_env/stateful/): its generate_room rooms with internal walls (utils.py:388-462), room seed i for training problem i and 100000 + i for test problem i (plus seed; stateful_env.py:103-129), -0.01 per valid and -0.05 per invalid move, +1/-0.5 per box pushed onto/off a goal, potential shaping 0.1 * (0.99 * phi' - phi), +10 on a win and -5 at max_steps moves, and its tool and plan prompts."""
    max_steps: int = 200
    """variant: pettingllms: the step cap: moves of the whole episode (valid or not) after which it ends with -5 (PettingLLMs: 200, env_state.py:1281)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.size < 4:
            raise ValueError(f"size {self.size} must be >= 4 (a wall around at least 2 x 2 free cells)")
        if not 1 <= self.boxes <= (self.size - 2) ** 2 - 2:
            raise ValueError(f"boxes {self.boxes} must be between 1 and {(self.size - 2) ** 2 - 2} for size {self.size}")
        if self.pulls < 1:
            raise ValueError(f"pulls {self.pulls} must be >= 1")
        if self.variant not in ("teamrl", "pettingllms"):
            raise ValueError(f"variant {self.variant!r} is not one of teamrl, pettingllms")
        if self.max_steps < 1:
            raise ValueError(f"max_steps {self.max_steps} must be >= 1")


class Sokoban:
    """Push every box onto a goal (PettingLLMs' Sokoban, generated by backward pulls)."""

    action_format = 'End with #### and a JSON list of moves U, D, L, R, e.g. #### ["U", "L"].'

    def __init__(self, cfg: SokobanConfig) -> None:
        self.cfg, self.max_turns = cfg, cfg.max_turns
        self.player = (1, 1)
        self.boxes: set[tuple[int, int]] = set()
        self.goals: frozenset[tuple[int, int]] = frozenset()

    def _inside(self, cell: tuple[int, int]) -> bool:
        return 1 <= cell[0] <= self.cfg.size - 2 and 1 <= cell[1] <= self.cfg.size - 2

    def reset(self, problem: Problem) -> str:
        rng = random.Random(problem.meta["seed"])
        cells = [(r, c) for r in range(1, self.cfg.size - 1) for c in range(1, self.cfg.size - 1)]
        while True:
            picked = rng.sample(cells, self.cfg.boxes + 1)
            self.goals, self.boxes, self.player = frozenset(picked[1:]), set(picked[1:]), picked[0]
            for _ in range(self.cfg.pulls):  # move backwards; a box behind the player's back follows it
                dr, dc = MOVES[rng.choice("UDLR")]
                nxt = (self.player[0] + dr, self.player[1] + dc)
                if not self._inside(nxt) or nxt in self.boxes:
                    continue
                behind = (self.player[0] - dr, self.player[1] - dc)
                if behind in self.boxes and rng.random() < 0.8:
                    self.boxes.remove(behind)
                    self.boxes.add(self.player)
                self.player = nxt
            if self.boxes != self.goals:
                return self.render()

    def render(self) -> str:
        n = self.cfg.size
        rows = []
        for r in range(n):
            row = ""
            for c in range(n):
                cell = (r, c)
                if not self._inside(cell):
                    row += "#"
                elif cell == self.player:
                    row += "P"
                elif cell in self.boxes:
                    row += "*" if cell in self.goals else "B"
                else:
                    row += "O" if cell in self.goals else "."
            rows.append(row)
        return ("Push every box B onto a goal O (P is you, # a wall, * a box on a goal; U up, D down, L left, "
                "R right; walking into a box pushes it):\n" + "\n".join(rows))

    def parse_action(self, text: str) -> list[str] | None:
        return parse_moves(text)

    def step(self, action: Any | None) -> Turn:
        if action is None or not isinstance(action, list) or any(m not in MOVES for m in action):
            return Turn(self.render(), -1.0, False, {"message": "no move list found", "invalid": True})
        reward = 0.0
        for move in action:
            dr, dc = MOVES[move]
            nxt = (self.player[0] + dr, self.player[1] + dc)
            reward -= 0.01
            if not self._inside(nxt):
                continue
            if nxt in self.boxes:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if not self._inside(beyond) or beyond in self.boxes:
                    continue
                self.boxes.remove(nxt)
                self.boxes.add(beyond)
                reward += float(beyond in self.goals) - float(nxt in self.goals)
                self.player = nxt
                if self.success:
                    return Turn(self.render(), reward + 1.0, True, {"message": "every box is on a goal"})
            self.player = nxt
        on = len(self.boxes & self.goals)
        return Turn(self.render(), reward, False, {"message": f"{on} of {len(self.goals)} boxes on goals"})

    @property
    def success(self) -> bool:
        return self.boxes == set(self.goals)


def make_sokoban(cfg: SokobanConfig) -> Sokoban | SokobanPettingLLMs:
    """The Sokoban of ``cfg.variant``: teamrl's (:class:`Sokoban`) or PettingLLMs' (:class:`SokobanPettingLLMs`)."""
    return SokobanPettingLLMs(cfg) if cfg.variant == "pettingllms" else Sokoban(cfg)


register_env("sokoban", config=SokobanConfig, smoke=few_turns_smoke("sokoban"))(make_sokoban)
