"""Plan-Path, Sokoban and Sudoku: rewards by hand, generated instances solvable, the task's splits and replay scoring."""

from __future__ import annotations

import itertools
from collections import deque

import pytest

from teamrl.domains.environments.planning import (
    MOVES,
    PlanPath,
    PlanPathConfig,
    Sokoban,
    SokobanConfig,
    _bfs,
    parse_moves,
)
from teamrl.domains.environments.sudoku import Sudoku, SudokuConfig
from teamrl.tasks.base import Problem, build_task
from teamrl.tasks.env import actions_text


def test_plan_path_rewards_by_hand():
    env = PlanPath(PlanPathConfig(size=3, wall_ratio=0.0))
    env.reset(Problem(id="p", question="", answer="", meta={"seed": 1}))
    env.free = {(r, c) for r in range(3) for c in range(3)} - {(1, 1)}
    env.pos, env.start, env.goal, env.shortest, env.moves = (0, 0), (0, 0), (0, 2), 2, 0
    # R: -0.01 + 0.99 * (-1) - (-2) = 1.0 ; R: -0.01 + 0.99 * 0 - (-1) = 0.99 ; goal +1, shortest +0.5
    turn = env.step(["R", "R"])
    assert turn.done and env.success and turn.reward == pytest.approx(3.49)
    env.pos, env.moves = (1, 0), 0
    # R into the wall at (1, 1): -0.01 - 0.1 + 0.99 * (-3) - (-3) = -0.08
    turn = env.step(["R"])
    assert not turn.done and env.pos == (1, 0) and turn.reward == pytest.approx(-0.08)
    assert env.step(None).reward == -1.0 and env.step(None).info["invalid"]


def test_plan_path_instances_are_reachable_and_the_shortest_path_solves_them():
    task = build_task("plan_path", {"size": 5, "wall_ratio": 0.3, "n_train": 20, "n_test": 5})
    for problem in task.problems("train"):
        env = task.make_env()
        env.reset(problem)
        assert env.shortest == _bfs(env.free, env.start, env.goal)
        path = _shortest_moves(env)
        assert task.score(problem, actions_text([path])) == 1.0
        assert task.score(problem, actions_text([])) == 0.0


def _shortest_moves(env: PlanPath) -> list[str]:
    prev: dict = {env.start: None}
    queue = deque([env.start])
    while queue:
        cell = queue.popleft()
        for name, (dr, dc) in MOVES.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if nxt in env.free and nxt not in prev:
                prev[nxt] = (cell, name)
                queue.append(nxt)
    moves, cell = [], env.goal
    while prev[cell] is not None:
        cell, name = prev[cell]
        moves.append(name)
    return moves[::-1]


def test_splits_are_disjoint_and_seeded():
    task = build_task("plan_path", {"size": 4, "n_train": 30, "n_test": 10})
    train, test = task.problems("train"), task.problems("test")
    assert len(train) == 30 and len(test) == 10
    assert not {p.question for p in train} & {p.question for p in test}
    again = build_task("plan_path", {"size": 4, "n_train": 30, "n_test": 10})
    assert [p.question for p in again.problems("test")] == [p.question for p in test]


def test_sokoban_push_onto_goal_by_hand():
    env = Sokoban(SokobanConfig(size=5, boxes=1))
    env.reset(Problem(id="p", question="", answer="", meta={"seed": 0}))
    env.player, env.boxes, env.goals = (2, 1), {(2, 2)}, frozenset({(2, 3)})
    turn = env.step(["R"])  # -0.01 per move, +1 box onto its goal, +1 all boxes on goals
    assert turn.done and env.success and turn.reward == pytest.approx(1.99)
    env.player, env.boxes, env.goals = (2, 2), {(2, 3)}, frozenset({(1, 3)})
    turn = env.step(["R", "U"])  # box against the wall: no push, player stays; then up
    assert env.boxes == {(2, 3)} and env.player == (1, 2) and turn.reward == pytest.approx(-0.02)


def _sokoban_solvable(env: Sokoban, limit: int = 20000) -> bool:
    start = (env.player, frozenset(env.boxes))
    seen, queue = {start}, deque([start])
    while queue and len(seen) < limit:
        player, boxes = queue.popleft()
        if boxes == env.goals:
            return True
        for dr, dc in MOVES.values():
            nxt = (player[0] + dr, player[1] + dc)
            if not env._inside(nxt):
                continue
            new = set(boxes)
            if nxt in boxes:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if not env._inside(beyond) or beyond in boxes:
                    continue
                new.remove(nxt)
                new.add(beyond)
            state = (nxt, frozenset(new))
            if state not in seen:
                seen.add(state)
                queue.append(state)
    return False


@pytest.mark.parametrize("boxes", [1, 2])
def test_sokoban_instances_are_solvable_and_unsolved(boxes):
    task = build_task("sokoban", {"size": 6, "boxes": boxes, "n_train": 10, "n_test": 3})
    for problem in task.problems("train"):
        env = task.make_env()
        env.reset(problem)
        assert len(env.boxes) == boxes and env.boxes != set(env.goals)
        assert _sokoban_solvable(env)


def test_sudoku_blanks_have_a_solution_and_givens_are_kept():
    task = build_task("sudoku", {"size": 4, "blanks": 3, "n_train": 10, "n_test": 3})
    for problem in task.problems("train"):
        env = task.make_env()
        env.reset(problem)
        holes = [(r, c) for r in range(4) for c in range(4) if env.given[r][c] == 0]
        assert len(holes) == 3
        solution = None
        for digits in itertools.product(range(1, 5), repeat=3):
            grid = [row[:] for row in env.given]
            for (r, c), d in zip(holes, digits):
                grid[r][c] = d
            probe = Sudoku(SudokuConfig(size=4))
            probe.grid, probe.box = grid, 2
            if probe.success:
                solution = grid
                break
        assert solution is not None
        assert task.score(problem, actions_text([solution])) == 1.0
        bad = [row[:] for row in solution]
        r, c = next((r, c) for r in range(4) for c in range(4) if env.given[r][c])
        bad[r][c] = bad[r][c] % 4 + 1
        assert env.step(bad).reward == -1.0


def test_parsers():
    assert parse_moves('#### ["U", "left"]') == ["U", "L"]
    assert parse_moves("#### []") is None
    env = Sudoku(SudokuConfig())
    assert env.parse_action("#### [[1,2,3,4],[3,4,1,2],[2,1,4,3],[4,3,2,1]]") is not None
    assert env.parse_action("#### [[1,2,3],[3,4,1,2],[2,1,4,3],[4,3,2,1]]") is None


def test_sudoku_fill_steps_as_pettingllms_takes_them():
    """PettingLLMs' Sudoku takes fill steps [row, column, digit] (from 0) as well as the full grid."""
    env = Sudoku(SudokuConfig(size=4, blanks=3))
    env.reset(Problem(id="s", question="", answer="", meta={"seed": 7}))
    holes = [(r, c) for r in range(4) for c in range(4) if env.given[r][c] == 0]
    fits = lambda r, c: [v for v in range(1, 5) if v not in env.grid[r] and all(env.grid[i][c] != v for i in range(4))  # noqa: E731
                         and all(env.grid[i][j] != v for i in range(r - r % 2, r - r % 2 + 2) for j in range(c - c % 2, c - c % 2 + 2))]
    (r0, c0), rest = holes[0], holes[1:]
    first = fits(r0, c0)[0]
    turn = env.step(env.parse_action(f"I fill one. #### [[{r0}, {c0}, {first}]]"))
    assert (turn.reward, turn.done, env.grid[r0][c0]) == (0.0, False, first)  # placed, not solved yet
    assert env.step([[r0, c0, first]]).reward == -1.0  # that cell is filled now
    r, c = next((r, c) for r in range(4) for c in range(4) if env.given[r][c])
    assert env.step([[r, c, env.given[r][c]]]).reward == -1.0  # a given cell
    clash = next(v for v in range(1, 5) if v in env.grid[rest[0][0]])
    assert env.step([[rest[0][0], rest[0][1], clash]]).reward == -1.0  # repeats a digit of its row
    assert env.step([[4, 0, 1]]).reward == -1.0 and env.step([[0, 0, 5]]).reward == -1.0  # off the grid, not a digit
    steps = []
    for r, c in rest:
        v = fits(r, c)[0]
        steps.append([r, c, v])
        env.grid[r][c] = v  # as the env will place them
    for r, c, _ in steps:
        env.grid[r][c] = 0
    turn = env.step(steps)
    assert (turn.reward, turn.done, env.success) == (1.0, True, True)


def test_sudoku_parses_grids_and_fill_steps_only():
    env = Sudoku(SudokuConfig(size=4))
    assert env.parse_action("#### [[0, 2, 3]]") == [[0, 2, 3]]
    assert env.parse_action("#### [[0, 2, 3], [1, 0, 4]]") == [[0, 2, 3], [1, 0, 4]]
    for bad in ("#### [[0, 2]]", "#### [[0, 2, 3, 4, 1]]", "#### []", "#### [[true, 1, 2]]", "#### [[0, 2, 3], [1, 2]]"):
        assert env.parse_action(bad) is None, bad
