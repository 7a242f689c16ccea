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


# SPIRAL's invalid-move rule (train_spiral.py @ a02d0ed: error_allowance 0 at :233, the listed-move check at
# :631-645, rewards {mover: -1.5, other: +0.5} at :317-324)
SPIRAL = {"invalid_move_rewards": (-1.5, 0.5)}


def test_spiral_rule_ends_the_game_at_the_first_invalid_move_with_its_rewards(tokenizer):
    # seat 0 takes 0; seat 1 repeats 0 (not listed): the game ends at once, no retry; seat 1 -1.5, seat 0 +0.5
    ro, _ = _rollout(tokenizer, "game_selfplay", GameSelfPlayConfig(), ["[0]"], ("player_0", "player_1"), **SPIRAL)
    (ep,) = ro.collect(ro.task.problems("train")[:1], 1, progress=False)
    assert [s.valid for s in ep.steps] == [True, False] and ep.info["turns"] == 2
    assert ep.agent_rewards == {"player_0": 0.5, "player_1": -1.5}
    assert ep.info["rewards"] == {0: 0.5, 1: -1.5}


def test_spiral_rule_takes_only_a_listed_move_as_written(tokenizer):
    # '[4] ok' holds the listed move [4] and TextArena plays it; SPIRAL's check wants the move alone: invalid
    problems = None
    for rule, expect in (({}, [True, True]), (SPIRAL, [False])):
        ro, _ = _rollout(tokenizer, "game_selfplay", GameSelfPlayConfig(), ["[4] ok", "[0]"], ("player_0", "player_1"),
                         max_turns=2, **rule)
        problems = problems or ro.task.problems("train")[:1]
        (ep,) = ro.collect(problems, 1, progress=False)
        assert [s.valid for s in ep.steps] == expect
    assert ep.agent_rewards == {"player_0": -1.5, "player_1": 0.5}


def test_spiral_rule_brackets_a_short_bare_move_as_spiral_does():
    # Kuhn Poker: a bare 'check' is read as '[check]', a listed move; the game goes on
    task = build_task("textarena_two_player", {"env_id": "KuhnPoker-v0", "n_train": 1, "n_test": 1, "max_turns": 12,
                                               **SPIRAL})
    env = task.make_env()
    env.reset(task.problems("train")[0])
    first = env.player
    turn = env.step("check")
    assert not turn.done and not turn.info.get("invalid") and env.player == 1 - first
    turn = env.step("raise")  # not listed: the mover gets -1.5, the first mover +0.5
    assert turn.done and turn.info["invalid"] and env.rewards == {1 - first: -1.5, first: 0.5}
    assert turn.reward == -1.5


def test_spiral_rule_replays_to_the_same_outcome_when_scored():
    task = build_task("textarena_two_player", {"env_id": "TicTacToe-v0", "n_train": 4, "n_test": 1, **SPIRAL})
    from teamrl.tasks.env import actions_text
    p0 = next(p for p in task.problems("train") if int(p.meta["seed"]) % 2 == 0)
    p1 = next(p for p in task.problems("train") if int(p.meta["seed"]) % 2 == 1)
    assert task.score(p0, actions_text(["[0]", "[0]"])) == 1.0  # seat 1's invalid move: seat 0 gets +0.5
    assert task.score(p1, actions_text(["[0]", "[0]"])) == 0.0  # seat 1 gets -1.5


def test_spiral_rule_with_rae_by_hand(tokenizer):
    from teamrl.config.sections import AlgoConfig
    from teamrl.scoring import Context, assign
    from teamrl.scoring.advantages import RunningBaseline

    # game 0: seat 1 repeats square 0 -> (+0.5, -1.5); game 1: seat 0 takes the top row -> (+1, -1)
    ro, _ = _rollout(tokenizer, "game_selfplay", GameSelfPlayConfig(), ["[0]", "[0]"], ("player_0", "player_1"),
                     **SPIRAL)
    (bad,) = ro.collect(ro.task.problems("train")[:1], 1, progress=False)
    ro, _ = _rollout(tokenizer, "game_selfplay", GameSelfPlayConfig(), ["[0]", "[3]", "[1]", "[4]", "[2]"],
                     ("player_0", "player_1"), **SPIRAL)
    (won,) = ro.collect(ro.task.problems("train")[1:2], 1, progress=False)
    won.prompt_index = won.index = 1
    for s in won.steps:
        s.prompt_index = s.episode = 1
    stage = RunningBaseline.build(AlgoConfig(estimator="rae", rae_decay=0.95), Context(game="ttt"))
    steps = assign([bad, won], [], stage)
    # game 0: baselines 0 -> +0.5, -1.5; then p0 .05 * .5 = .025, p1 .05 * -1.5 = -.075
    # game 1: p0 1 - .025 = .975 (three moves), p1 -1 + .075 = -.925 (two moves)
    assert [(s.agent, round(s.advantage, 6)) for s in steps] == [
        ("player_0", 0.5), ("player_1", -1.5),
        ("player_0", 0.975), ("player_1", -0.925), ("player_0", 0.975), ("player_1", -0.925), ("player_0", 0.975)]
    assert stage.baselines == pytest.approx({"ttt/player_0": 0.95 * 0.025 + 0.05, "ttt/player_1": 0.95 * -0.075 - 0.05})


def test_invalid_move_rewards_must_be_two_numbers():
    with pytest.raises(ValueError, match="two finite numbers"):
        build_task("textarena_two_player", {"env_id": "TicTacToe-v0", "invalid_move_rewards": (-1.5,)})


def test_action_close_ends_the_move_at_the_bracket(tokenizer):
    # the model writes '4' and ends its turn: the move is prefix + '4' + the close, '[4]', a listed move
    ro, _ = _rollout(tokenizer, "game_selfplay", GameSelfPlayConfig(action_prefix="[", action_close="]"),
                     ["4"], ("player_0", "player_1"), max_turns=1, **SPIRAL)
    (ep,) = ro.collect(ro.task.problems("train")[:1], 1, progress=False)
    assert ep.steps[0].text == "[4]" and ep.steps[0].valid and ep.final == 'actions: ["[4]"]'
    assert tokenizer.decode(ep.steps[0].prompt_ids).endswith("[")  # the prefix is prompt, not trained on


def test_hide_game_tags_drops_the_tags_from_the_prompt_only(tokenizer):
    for hide in (False, True):
        ro, eng = _rollout(tokenizer, "game_selfplay", GameSelfPlayConfig(hide_game_tags=hide), ["[0]", "[4]"],
                           ("player_0", "player_1"), max_turns=2)
        (ep,) = ro.collect(ro.task.problems("train")[:1], 1, progress=False)
        assert ("[GAME]" in eng.prompts[1]) is not hide and "Current Board:" in eng.prompts[1]
        assert "Available Moves: '[1]'" in eng.prompts[1] and "[Player 0] [0]" in eng.prompts[1]
        assert ep.final == 'actions: ["[0]", "[4]"]'


def test_an_agent_as_the_fixed_opponent(tokenizer):
    # both seats are called; the scripted moves let seat 0 take the top row: a win when the agent holds seat 0
    ro, _ = _rollout(tokenizer, "game_vs_random", GameVsRandomConfig(opponent="opponent"),
                     ["[0]", "[3]", "[1]", "[4]", "[2]"], ("player_0", "opponent"))
    problems = ro.task.problems("test")
    for p in problems:
        (ep,) = ro.collect([p], 1, progress=False)
        seat = int(p.meta["seed"]) % 2
        assert [s.agent for s in ep.steps][:2] == (["player_0", "opponent"] if seat == 0 else ["opponent", "player_0"])
        assert ep.info["outcome"] == ("win" if seat == 0 else "loss")
    assert GameVsRandomConfig(opponent="opponent").agents == ("player_0", "opponent")
    with pytest.raises(ValueError, match="the agent itself"):
        GameVsRandomConfig(opponent="player_0")
