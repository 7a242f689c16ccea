"""Sokoban rooms as PettingLLMs generates them: a random-walk room with internal walls, boxes pulled off their goals.

PettingLLMs' Sokoban (pettingllms-ai/PettingLLMs @ a054fb18, ``pettingllms/multi_agent_env/stateful/``) builds each
room with ``utils.py:388-462`` (``generate_room``, the gym-sokoban generator) called at ``env_state.py:1313-1324``
with ``dim=(size, size)``, 0.35 chance to turn, 25 walk steps, one box, 20 tries, search depth 200, boxes at least
2 from their goals, displacement score at least 1, and the room's seed. :func:`generate_room` makes the same room for
the same seed: the same draws in the same order from :class:`random.Random` (for Python's global ``random``, seeded at
``utils.py:411-413``) and :class:`numpy.random.RandomState` (for ``np.random``):

1. **Floor** (``utils.py:465-503``): a direction and a start cell are drawn; for 25 steps the walker turns with
   chance 0.35, moves one cell (kept off the border) and stamps one of five 3×3 floor masks around itself; the
   border is wall. Cells never stamped stay wall, so rooms have internal walls.
2. **Player and goals** (``:506-536``): the player on a random floor cell, then each box's goal on a random free one
   (``np.random.randint``, cells in row-major order); too few floor cells fail the room.
3. **Reverse play** (``:547-661``): from the solved room (each box on its goal), a depth-first search over
   *pulls* (the player steps away from a box behind it and drags it along) visits every state once up to depth
   200 (and 300000 states); a state's score is (number of pull runs of a new box) × (sum of each box's distance to
   its goal, 0 when one is closer than 2, ``:664-688``), 0 when a goal is covered; the first state of the highest
   score is the room. A try scoring below 1 is redrawn from step 1, up to 20 tries; the last try scoring 0 fails.
4. **A last shuffle** (``:336-385``, ``:446-460``): with chance 0.5 (the scores reached here are all above 1.5)
   the player walks up to 3 random steps onto free cells not visited yet, stopping after each with chance 0.5.

Cell codes as the generator's: 0 wall, 1 floor, 2 goal, 3 box on a goal (during the search: a pulled box),
4 box, 5 player.

Left out: the generator's second player and the box-to-goal solution search (``get_shortest_action_path``), which
PettingLLMs' Sokoban does not call.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

__all__ = ["Room", "RoomError", "generate_room"]

WALL, FLOOR, GOAL, PULLED, BOX, PLAYER = 0, 1, 2, 3, 4, 5
_TURNS = [(1, 0), (0, 1), (-1, 0), (0, -1)]  # the walker's directions (utils.py:477)
_MASKS = [  # the floor stamped around the walker (utils.py:469-475)
    ((0, 0, 0), (1, 1, 1), (0, 0, 0)),
    ((0, 1, 0), (0, 1, 0), (0, 1, 0)),
    ((0, 0, 0), (1, 1, 0), (0, 1, 0)),
    ((0, 0, 0), (1, 1, 0), (1, 1, 0)),
    ((0, 0, 0), (0, 1, 1), (0, 1, 0)),
]
_PULLS = [(-1, 0), (1, 0), (0, -1), (0, 1)]  # the search's moves in its order: up, down, left, right (utils.py:715-720)
_MAX_STATES = 300_000
Grid = list[list[int]]
Mapping = dict[tuple[int, int], tuple[int, int]]


class RoomError(ValueError):
    """The generator found no room for this seed (too little floor, or no pull moved a box far enough)."""


@dataclass(frozen=True)
class Room:
    """A generated room: its size, walls, goals, boxes and the player's cell (row, column)."""

    height: int
    width: int
    walls: frozenset[tuple[int, int]]
    goals: frozenset[tuple[int, int]]
    boxes: frozenset[tuple[int, int]]
    player: tuple[int, int]


def generate_room(seed: int, *, size: int = 6, boxes: int = 1, turn_chance: float = 0.35, walk_steps: int = 25,
                  tries: int = 20, depth: int = 200, min_distance: int = 2, min_score: float = 1) -> Room:
    """The room PettingLLMs' ``generate_room`` makes for ``seed`` with these settings (its Sokoban's, by default).

    Args:
        seed: the room's seed (both random generators are seeded with it).
        size: the room's side, border walls included (PettingLLMs' ``env.map_size``).
        boxes: boxes (and goals).
        turn_chance, walk_steps: the floor walker's chance to turn and its steps.
        tries: rooms drawn until one scores ``min_score``.
        depth: the reverse search's depth limit.
        min_distance: a box closer than this to its goal scores 0.
        min_score: the lowest displacement score a room may have.

    Raises :class:`RoomError` when no room is found.

    >>> room = generate_room(0)
    >>> room.player, sorted(room.boxes), sorted(room.goals)
    ((1, 4), [(2, 3)], [(3, 1)])
    """
    py, npr = random.Random(seed), np.random.RandomState(seed)
    mapping: Mapping
    state: Grid
    structure: Grid
    score, mapping, state, structure = 0, {}, [], []
    for _ in range(tries):
        room = _floor(py, size, size, turn_chance, walk_steps)
        _place(room, npr, boxes)
        structure = [[FLOOR if c == PLAYER else c for c in row] for row in room]
        start = [[BOX if c == GOAL else c for c in row] for row in room]
        state, mapping = _reverse_play(start, structure, depth, min_distance)
        state = [[BOX if c == PULLED else c for c in row] for row in state]
        score = _displacement(mapping, min_distance)
        if score >= min_score:
            break
    if score == 0 or score < min_score:
        raise RoomError(f"no Sokoban room for seed {seed} (size {size}, {boxes} boxes): its best score is {score}, "
                        f"below {min_score}; pick another seed or a larger room")
    walk = 0.9 if score <= min_score else 0.7 if score <= min_score * 1.5 else 0.5
    _shuffle_player(state, structure, py, walk)
    cells = [(r, c) for r in range(size) for c in range(size)]
    return Room(size, size, frozenset(p for p in cells if structure[p[0]][p[1]] == WALL),
                frozenset(p for p in cells if structure[p[0]][p[1]] == GOAL),
                frozenset(p for p in cells if state[p[0]][p[1]] in (PULLED, BOX)),
                next(p for p in cells if state[p[0]][p[1]] == PLAYER))


def _floor(py: random.Random, h: int, w: int, turn_chance: float, steps: int) -> list[list[int]]:
    """Walls with the floor the random walker stamps (utils.py:465-503)."""
    direction = py.sample(_TURNS, 1)[0]
    r, c = py.randint(1, h - 1), py.randint(1, w - 1)
    room = [[WALL] * w for _ in range(h)]
    for _ in range(steps):
        if py.random() < turn_chance:
            direction = py.sample(_TURNS, 1)[0]
        r, c = max(min(r + direction[0], h - 2), 1), max(min(c + direction[1], w - 2), 1)
        mask = py.sample(_MASKS, 1)[0]
        for i in range(3):
            for j in range(3):
                if mask[i][j]:
                    room[r - 1 + i][c - 1 + j] = FLOOR
    room[0], room[h - 1] = [WALL] * w, [WALL] * w
    for line in room:
        line[0] = line[w - 1] = WALL
    return room


def _place(room: list[list[int]], npr: np.random.RandomState, boxes: int) -> None:
    """The player, then each goal, on a random floor cell (utils.py:506-536)."""
    def free() -> list[tuple[int, int]]:
        return [(r, c) for r, row in enumerate(room) for c, v in enumerate(row) if v == FLOOR]

    cells = free()
    if len(cells) <= boxes + 1:
        raise RoomError(f"not enough floor ({len(cells)} cells) for a player and {boxes} boxes")
    r, c = cells[npr.randint(len(cells))]
    room[r][c] = PLAYER
    for _ in range(boxes):
        cells = free()
        r, c = cells[npr.randint(len(cells))]
        room[r][c] = GOAL


def _displacement(mapping: dict[tuple[int, int], tuple[int, int]], min_distance: int) -> int:
    """Sum of each box's Manhattan distance to its goal; 0 when one is closer than ``min_distance``
    (utils.py:664-688)."""
    total = 0
    for goal, box in mapping.items():
        d = abs(box[0] - goal[0]) + abs(box[1] - goal[1])
        if d < min_distance:
            return 0
        total += d
    return total


def _reverse_play(start: Grid, structure: Grid, depth: int, min_distance: int) -> tuple[Grid, Mapping]:
    """The depth-first search over pulls (utils.py:547-632): the first state of the highest score, and where each
    goal's box is then."""
    goals = [(r, c) for r, row in enumerate(structure) for c, v in enumerate(row) if v == GOAL]
    explored: set[tuple[int, ...]] = set()
    best: list[tuple[float, Grid, Mapping]] = [(-1.0, start, {g: g for g in goals})]

    def visit(state: Grid, mapping: Mapping, runs: int, last: tuple[int, int], ttl: int) -> None:
        ttl -= 1
        if ttl <= 0 or len(explored) >= _MAX_STATES:
            return
        key = tuple(v for row in state for v in row)
        if key in explored:
            return
        score = runs * _displacement(mapping, min_distance) if key.count(GOAL) == len(goals) else 0
        if score > best[0][0]:
            best[0] = (score, [row[:] for row in state], dict(mapping))
        explored.add(key)
        for move in _PULLS:
            nxt, nmap = [row[:] for row in state], dict(mapping)
            pulled = _pull(nxt, structure, nmap, last, move)
            visit(nxt, nmap, runs + (pulled != last), pulled, ttl)

    visit(start, {g: g for g in goals}, 0, (-1, -1), depth)
    return best[0][1], best[0][2]


def _pull(state: Grid, structure: Grid, mapping: Mapping, last: tuple[int, int],
          move: tuple[int, int]) -> tuple[int, int]:
    """Step the player by ``move`` onto a free cell, dragging a box from behind it (utils.py:635-661); returns the
    goal of the box pulled last."""
    r, c = next((r, c) for r, row in enumerate(state) for c, v in enumerate(row) if v == PLAYER)
    nr, nc = r + move[0], c + move[1]
    if state[nr][nc] not in (FLOOR, GOAL):
        return last
    state[r][c], state[nr][nc] = structure[r][c], PLAYER
    br, bc = r - move[0], c - move[1]
    if state[br][bc] in (PULLED, BOX):
        state[r][c], state[br][bc] = PULLED, structure[br][bc]
        for goal, box in mapping.items():
            if box == (br, bc):
                mapping[goal], last = (r, c), goal
    return last


def _shuffle_player(state: Grid, structure: Grid, py: random.Random, chance: float) -> None:
    """With ``chance``, up to 3 random steps of the player onto free cells not visited yet (utils.py:336-385)."""
    if py.random() > chance:
        return
    r, c = next((r, c) for r, row in enumerate(state) for c, v in enumerate(row) if v == PLAYER)
    visited, steps = [(r, c)], 0
    while steps < 3:
        moves = [(r + dr, c + dc) for dr, dc in _PULLS
                 if state[r + dr][c + dc] in (FLOOR, GOAL) and (r + dr, c + dc) not in visited]
        if not moves:
            break
        nr, nc = py.choice(moves)
        state[r][c], state[nr][nc] = structure[r][c], PLAYER
        r, c = nr, nc
        visited.append((r, c))
        steps += 1
        if steps >= 3 or py.random() > 0.5:
            break


