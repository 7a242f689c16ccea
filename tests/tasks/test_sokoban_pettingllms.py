"""PettingLLMs' Sokoban (task.sokoban.variant: pettingllms): its rooms per seed, rewards by hand, parsers, prompts."""

from __future__ import annotations

import copy
from collections import deque

import pytest

from teamrl.domains.environments.planning import SokobanConfig, make_sokoban
from teamrl.domains.environments.sokoban_pettingllms import (
    MOVES,
    SokobanPettingLLMs,
    parse_plan_action,
    parse_program_output,
)
from teamrl.domains.environments.sokoban_rooms import RoomError, generate_room
from teamrl.tasks.base import Problem, build_task

# Rooms PettingLLMs' generate_room makes at size 6 (its Sokoban's settings, env_state.py:1313-1324), printed as its
# text_observation prints them; recorded by running that generator for these seeds.
RECORDED = {
    0: "######\n### @#\n## $ #\n#.   #\n#    #\n######",
    1: "######\n#    #\n#@#$ #\n# #  #\n#  . #\n######",
    2: "######\n# @  #\n# $  #\n#    #\n#  . #\n######",
    6399: "######\n#  . #\n#    #\n# $ ##\n# @ ##\n######",
    100000: "######\n###@ #\n###$ #\n#.   #\n#    #\n######",
}


def _env(seed: int, **opts) -> SokobanPettingLLMs:
    env = make_sokoban(SokobanConfig(variant="pettingllms", size=6, **opts))
    assert isinstance(env, SokobanPettingLLMs)
    env.reset(Problem(id="p", question="", answer="", meta={"seed": seed}))
    return env


@pytest.mark.parametrize("seed", sorted(RECORDED))
def test_rooms_are_pettingllms_rooms_for_the_same_seed(seed):
    assert _env(seed).grid() == RECORDED[seed]


def test_rooms_are_deterministic_have_internal_walls_and_boxes_away_from_goals():
    rooms = [generate_room(s) for s in range(40)]
    assert rooms == [generate_room(s) for s in range(40)]
    border = {(r, c) for r in range(6) for c in range(6) if r in (0, 5) or c in (0, 5)}
    assert sum(bool(room.walls - border) for room in rooms) >= 10  # walls inside the room, not only the border
    for room in rooms:
        (box,), (goal,) = room.boxes, room.goals
        assert abs(box[0] - goal[0]) + abs(box[1] - goal[1]) >= 2  # min_box_distance=2 (env_state.py:1321)
        assert room.player not in room.walls | room.boxes


def test_a_room_that_cannot_be_made_is_refused():
    with pytest.raises(RoomError, match="not enough floor"):
        generate_room(6, size=10, boxes=3)  # this seed's walk stamps 4 floor cells (PettingLLMs fails it too)


def _solve(env: SokobanPettingLLMs, limit: int = 50000) -> list[str] | None:
    """A push solution by breadth-first search over (player, boxes)."""
    start = (env.player, frozenset(env.boxes))
    prev: dict = {start: None}
    queue = deque([start])
    while queue and len(prev) < limit:
        player, boxes = queue.popleft()
        if boxes <= env.goals:
            moves, state = [], (player, boxes)
            while prev[state] is not None:
                state, move = prev[state]
                moves.append(move)
            return moves[::-1]
        for move, (dr, dc) in MOVES.items():
            nxt = (player[0] + dr, player[1] + dc)
            if nxt in env.walls:
                continue
            new = set(boxes)
            if nxt in boxes:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if beyond in env.walls or beyond in boxes:
                    continue
                new = (new - {nxt}) | {beyond}
            state = (nxt, frozenset(new))
            if state not in prev:
                prev[state] = ((player, boxes), move)
                queue.append(state)
    return None


def test_every_room_is_solvable_and_its_solution_wins():
    for seed in list(range(60)) + [100000, 100001]:
        env = _env(seed)
        moves = _solve(env)
        assert moves, f"seed {seed}: no solution"
        turn = env.step(moves)
        assert turn.done and env.success and turn.reward > 5  # +10 on the win, +1 onto the goal


def test_the_reward_sum_of_a_scripted_solution_by_hand():
    """Seed 2: player (1, 2), box (2, 2), goal (4, 3); phi = -(distance of the box to the goal), phi0 = -3.

    D  push to (3, 2), phi -2: -0.01 + 0.1 * (0.99 * -2 + 3)  = 0.092
    D  push to (4, 2), phi -1: -0.01 + 0.1 * (0.99 * -1 + 2)  = 0.091
    L  walk (3, 1):            -0.01 + 0.1 * (0.99 * -1 + 1)  = -0.009
    D  walk (4, 1):                                             -0.009
    R  push onto the goal:     -0.01 + 1 + 0.1 * (0 + 1) + 10 = 11.09 (won)
    sum 11.255; moves after the win are not made.
    """
    env = _env(2)
    assert (env.player, env.boxes, set(env.goals)) == ((1, 2), {(2, 2)}, {(4, 3)})
    first = copy.deepcopy(env).step(["D"])
    assert first.reward == pytest.approx(0.092) and not first.done
    turn = env.step(["D", "D", "L", "D", "R", "U", "U"])
    assert turn.reward == pytest.approx(11.255) and turn.done and env.success and env.moves == 5
    assert env.step(["L"]).reward == 0.0  # a finished episode moves no more (env_state.py:1573-1575)


def test_invalid_moves_box_off_a_goal_no_list_and_the_step_cap_by_hand():
    env = _env(2)
    # into the wall: -0.05, the player stays; shaping 0.1 * (0.99 * -3 + 3) = 0.003; "UP" is not a move: the same
    turn = env.step(["U", "UP"])
    assert turn.reward == pytest.approx(2 * -0.047) and env.player == (1, 2) and not turn.info.get("invalid")
    assert env.step(None).reward == 0.0 and env.step(None).info["invalid"]  # a reply without a list: nothing moves
    assert env.step([1, 2]).reward == -1.0 and env.moves == 2  # not a list of moves (env_state.py:1577-1582)
    # a box pushed off its goal: -0.01 - 0.5, phi from -2 (boxes 0 and 2 from the goal) to -3 (1 and 2)
    env.walls = frozenset({(r, c) for r in range(6) for c in range(6) if r != 1 or c in (0, 5)})
    env.goals, env.boxes, env.player, env.phi = frozenset({(1, 2)}), {(1, 2), (1, 4)}, (1, 1), -2.0
    assert env.step(["R"]).reward == pytest.approx(-0.01 - 0.5 + 0.1 * (0.99 * -3 + 2))
    # the step cap: the third move ends the episode with -5 (each walk: -0.01 + 0.001 * distance 3 = -0.007)
    env = _env(2, max_steps=3)
    turn = env.step(["L", "R", "L", "R"])
    assert turn.done and not env.success and turn.reward == pytest.approx(3 * -0.007 - 5) and env.moves == 3


def test_plan_replies_and_program_outputs_are_read_as_pettingllms_reads_them():
    assert parse_plan_action('Plan.\n#### ["U", "L"]') == ["U", "L"]
    assert parse_plan_action("#### ['r', 'x']") == ["r", "x"]  # any list: unknown moves cost -0.05 each
    assert parse_plan_action('text #### ["U"]') is None  # #### must start a line
    assert parse_plan_action('#### ["U"] then R') is None  # the list must end the reply
    assert parse_plan_action('#### ["U"]\n#### ["L"]') == ["U"]  # the first #### runs to the end: '#### ["L"]'
    # is then a Python comment
    assert parse_plan_action("#### [1, 2]") == [1, 2]
    assert parse_program_output('**Actions List**: ["U"]\n**Actions List**: ["D", "R"]') == ["D", "R"]
    assert parse_program_output("Actions: ['L']") == ["L"]
    assert parse_program_output("no list here") is None


def test_seeds_are_pettingllms_and_the_splits_may_share_rooms():
    task = build_task("sokoban", {"variant": "pettingllms", "size": 6, "n_train": 3, "n_test": 2})
    assert [p.meta["seed"] for p in task.problems("train")] == [0, 1, 2]
    assert [p.meta["seed"] for p in task.problems("test")] == [100000, 100001]
    assert RECORDED[0] in task.problems("train")[0].question
    again = build_task("sokoban", {"variant": "pettingllms", "size": 6, "n_train": 1, "n_test": 1, "seed": 5})
    assert [p.meta["seed"] for p in again.problems("train")] == [5]
    assert [p.meta["seed"] for p in again.problems("test")] == [100005]
    default = build_task("sokoban", {"size": 6, "n_train": 3, "n_test": 2})  # variant teamrl: drawn seeds
    assert [p.meta["seed"] for p in default.problems("train")] != [0, 1, 2]


def test_prompts_hold_the_state_and_the_tools_report():
    env = _env(2)
    tool, plan = env.tool_prompt(0), env.plan_prompt(0, None)
    assert "**Actions List**" in tool and RECORDED[2] in tool and "Progress: 0/1 boxes on goals" in tool
    assert plan.endswith("Here is code agent's code: .\nHere is code agent's execution output: . "
                         "Here is code agent's action: [].\n")
    assert "Boxes on goals: 0/1" in plan and RECORDED[2] in plan and "#### (e.g., a list of" in plan


def test_unknown_variant_and_step_cap_are_refused():
    with pytest.raises(ValueError, match="variant 'petting' is not one of teamrl, pettingllms"):
        SokobanConfig(variant="petting")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_steps 0 must be >= 1"):
        SokobanConfig(max_steps=0)
