"""The random player of ``game_vs_random`` on games whose observation describes its moves instead of listing them:
it finds a random legal move through the game's own legality check (a candidate played on a copy of the game)."""

from __future__ import annotations

import copy
import random
import re

import pytest

from teamrl.domains.environments.games import GameVsRandomConfig
from teamrl.tasks.base import build_task
from tests.conftest import REPO
from tests.team.test_games import _rollout

pytest.importorskip("textarena")


def _connect_four():
    task = build_task("textarena_two_player", {"env_id": "ConnectFour-v0", "n_train": 2, "n_test": 4, "max_turns": 42})
    env = task.make_env()
    env.reset(task.problems("train")[0])
    return task, env


def test_connect_four_lists_no_moves_and_the_random_player_finds_legal_ones():
    _, env = _connect_four()
    assert "[col 4]" in env.last_observation and "Available" not in env.last_observation  # described, not listed
    rng = random.Random(0)
    moves = [env.random_move(rng) for _ in range(40)]
    assert all(m is not None and re.fullmatch(r"\[col [0-6]\]", m) for m in moves)  # columns 0-6 only, no 7-10
    assert len(set(moves)) >= 5  # spread over the columns, not the text's two examples ('[col 4]', '[col 1]')
    for move in moves[:5]:  # each is one TextArena accepts
        trial = copy.deepcopy(env)
        assert trial.step_game(move) == (False, False)


def test_the_random_player_never_plays_a_full_column():
    _, env = _connect_four()
    for _ in range(6):  # both seats drop into column 0 until it is full (6 rows)
        turn = env.step("[col 0]")
        assert not turn.done and not turn.info.get("invalid")
    rng = random.Random(1)
    moves = {env.random_move(rng) for _ in range(30)}
    assert "[col 0]" not in moves and moves <= {f"[col {c}]" for c in range(1, 7)}
    assert env.step("[col 0]").info.get("invalid")  # TextArena itself rejects it: the check above is not vacuous


def test_game_vs_random_plays_connect_four_to_the_end_in_both_seats(tokenizer):
    ro, _ = _rollout(tokenizer, "game_vs_random", GameVsRandomConfig(), ["[col 3]"], ("player_0",),
                     env_id="ConnectFour-v0", max_turns=42)
    problems = ro.task.problems("test")
    episodes = ro.collect(problems, 1, progress=False)
    assert {int(p.meta["seed"]) % 2 for p in problems} == {0, 1}
    assert all(ep.error is None and ep.info["outcome"] in ("win", "draw", "loss") for ep in episodes)
    # the agent always drops into column 3; once it is full its move is rejected (one retry, then it loses),
    # so every game ends before the turn limit, having had the random player move in between
    assert all(ep.info["turns"] < 42 for ep in episodes)
    assert all(ep.info["turns"] > len(ep.steps) for ep in episodes)  # the random player moved too


def test_a_game_whose_random_player_finds_no_move_is_refused_in_one_line_before_any_model_loads(tmp_path):
    # Santorini lists the first mover's moves ('[N2B3A4B5]', unquoted); the second mover's observation lists none
    # and its squares are capitals (B3), which the candidates do not vary: no candidate is accepted after 1 move
    from teamrl.config.schema import load_config
    from teamrl.train.trainer import Trainer

    config = REPO / "configs" / "tictactoe_selfplay.yaml"
    cfg = load_config(str(config), [f"run_dir={tmp_path / 'run'}", "task.textarena_two_player.env_id=SantoriniBaseFixed-v0",
                                    "models.main.path=/nonexistent/model", "train.save_every=0", "train.steps=2"])
    with pytest.raises(ValueError) as err:  # before any model loads: the path above is never read
        Trainer(cfg, progress=False)
    text = str(err.value)
    assert "\n" not in text and text.startswith("eval.workflow game_vs_random: TextArena game 'SantoriniBaseFixed-v0': "
                                                "the random player found no move the game accepts after 1 move(s)")
    assert text.endswith("play it against an agent (workflow.game_vs_random.opponent: opponent) or pick another game")
