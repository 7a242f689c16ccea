"""Two-player TextArena games: zero-sum rewards per seat, self-play with the seat in the prompt, a random opponent,
win/draw/loss rates with Wilson intervals."""

from __future__ import annotations

import pytest

from teamrl.domains.environments.games import GameSelfPlayConfig, GameVsRandomConfig
from teamrl.engines.base import SamplingParams
from teamrl.metrics.diagnostics import outcome_rates, wilson
from teamrl.tasks.base import build_task
from teamrl.team.agents import get_agent
from teamrl.team.team import AgentBinding, Dispatcher
from teamrl.team.workflows import get_workflow
from teamrl.train.rollout import Rollout
from tests.team.test_env_team import CycleEngine

pytest.importorskip("textarena")


def _rollout(tokenizer, workflow: str, cfg, replies: list[str], agents: tuple[str, ...], **task) -> tuple[Rollout, CycleEngine]:
    eng = CycleEngine(tokenizer, replies)
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    bindings = {a: AgentBinding(get_agent(a), "m", sp, get_agent(a).system_prompt) for a in agents}
    game = build_task("textarena_two_player", {"env_id": "TicTacToe-v0", "n_train": 4, "n_test": 4, **task})
    return Rollout(Dispatcher({"m": eng}), bindings, get_workflow(workflow), cfg, game), eng


def test_selfplay_rewards_are_zero_sum_per_seat_and_the_seat_is_in_the_prompt(tokenizer):
    # seat 0 takes the top row (0, 1, 2) while seat 1 plays 3 and 4: seat 0 wins
    ro, eng = _rollout(tokenizer, "game_selfplay", GameSelfPlayConfig(), ["[0]", "[3]", "[1]", "[4]", "[2]"],
                       ("player_0", "player_1"))
    (ep,) = ro.collect(ro.task.problems("train")[:1], 1, progress=False)
    assert ep.error is None and [s.agent for s in ep.steps] == ["player_0", "player_1"] * 2 + ["player_0"]
    assert ep.agent_rewards == {"player_0": 1.0, "player_1": -1.0} and ep.info["turns"] == 5
    assert "You play as Player 0" in eng.prompts[0] and "You play as Player 1" in eng.prompts[1]
    assert all(s.valid for s in ep.steps)


def test_a_move_textarena_rejects_is_an_invalid_step(tokenizer):
    # seat 1 repeats the taken square 0: TextArena rejects it (one retry), then seat 1 loses
    ro, _ = _rollout(tokenizer, "game_selfplay", GameSelfPlayConfig(), ["[0]"], ("player_0", "player_1"))
    (ep,) = ro.collect(ro.task.problems("train")[:1], 1, progress=False)
    assert [s.valid for s in ep.steps] == [True, False, False]
    assert ep.agent_rewards == {"player_0": 1.0, "player_1": -1.0}


def test_a_game_past_max_turns_is_a_draw(tokenizer):
    ro, _ = _rollout(tokenizer, "game_selfplay", GameSelfPlayConfig(), ["[0]", "[4]", "[8]"], ("player_0", "player_1"),
                     max_turns=3)
    (ep,) = ro.collect(ro.task.problems("train")[:1], 1, progress=False)
    assert ep.agent_rewards == {"player_0": 0.0, "player_1": 0.0} and ep.info["turns"] == 3


def test_against_the_random_player_the_agent_takes_both_seats_and_outcomes_are_recorded(tokenizer):
    ro, _ = _rollout(tokenizer, "game_vs_random", GameVsRandomConfig(), ["[4]", "[0]", "[8]", "[2]", "[6]"],
                     ("player_0",), max_turns=9)
    problems = ro.task.problems("test")
    episodes = ro.collect(problems, 1, progress=False)
    assert all(ep.error is None and ep.info["outcome"] in ("win", "draw", "loss") for ep in episodes)
    seats = {int(p.meta["seed"]) % 2 for p in problems}
    assert seats == {0, 1}  # four seeds cover both seats here
    for ep in episodes:
        mine = ep.agent_rewards["player_0"]
        assert ep.info["outcome"] == ("win" if mine > 0 else "loss" if mine < 0 else "draw")


def test_two_player_task_replays_a_game_for_its_seat():
    task = build_task("textarena_two_player", {"env_id": "TicTacToe-v0", "n_train": 4, "n_test": 1})
    p = next(p for p in task.problems("train") if int(p.meta["seed"]) % 2 == 0)
    from teamrl.tasks.env import actions_text
    assert task.score(p, actions_text(["[0]", "[3]", "[1]", "[4]", "[2]"])) == 1.0  # seat 0 won
    assert task.score(p, actions_text(["[3]", "[0]", "[4]", "[1]", "[8]", "[2]"])) == 0.0  # seat 1 won


def test_selfplay_refuses_one_agent_for_both_seats():
    with pytest.raises(ValueError, match="two different agents"):
        GameSelfPlayConfig(players=("player_0", "player_0"))


def test_wilson_intervals_and_outcome_rates_by_hand():
    # 0 of 10: centre (0 + 1.96^2/20) / (1 + 1.96^2/10) = .1921/1.3842 = .1388; half the same -> [0, .2775]
    low, high = wilson(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)
    rates = outcome_rates(["win"] * 3 + ["draw"] + ["loss"] * 6)
    assert rates["games"] == 10 and rates["win"]["rate"] == 0.3 and rates["loss"]["count"] == 6
    assert rates["draw"]["low"] < 0.1 < rates["draw"]["high"]


@pytest.mark.slow  # the embedded model: one training step and two evaluations, a few minutes on a busy CPU
def test_tictactoe_selfplay_config_trains_one_step_and_reports_outcomes_against_random(tmp_path):
    import json
    from pathlib import Path

    from teamrl.cli import main

    config = Path(__file__).resolve().parents[2] / "configs" / "tictactoe_selfplay.yaml"
    main(["train", str(config), f"run_dir={tmp_path}", "train.steps=1", "train.save_every=0",
          "rollout.batch_size=2", "eval.problems=4"])
    result = json.loads((tmp_path / "eval_after.json").read_text())
    outcomes = result["outcomes"]
    assert outcomes["games"] == 4
    assert sum(outcomes[k]["count"] for k in ("win", "draw", "loss")) == 4
    assert all(0.0 <= outcomes[k]["low"] <= outcomes[k]["rate"] <= outcomes[k]["high"] <= 1.0
               for k in ("win", "draw", "loss"))
    steps = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert {t["agent"] for ep in steps for t in ep["turns"]} <= {"player_0", "player_1"}
