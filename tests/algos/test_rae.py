"""SPIRAL's role-conditioned advantage estimation: running (game, role) baselines, hand-computed."""

from __future__ import annotations

import pytest
import torch

from teamrl.algos.advantages import compute_advantages, get_estimator
from teamrl.algos.rae import role_baseline_advantages
from teamrl.config.sections import AlgoConfig
from teamrl.scoring import Context, Scorer
from teamrl.scoring.advantages import RunningBaseline
from teamrl.team.records import Episode, Step


def test_baseline_is_read_before_the_update_and_moves_by_one_minus_decay():
    # decay 0.5. step 1: x wins (+1), o loses (-1): baselines 0 -> advantages +1, -1; then x .5, o -.5
    r = torch.tensor([1.0, -1.0], dtype=torch.float64)
    adv, b = role_baseline_advantages(r, [(0, "x"), (0, "o")], ["x", "o"], {}, decay=0.5)
    assert adv.tolist() == [1.0, -1.0] and b == {"x": 0.5, "o": -0.5}
    # step 2: x wins again: 1 - .5 = .5 ; o loses: -1 - (-.5) = -.5 ; then x .75, o -.75
    adv, b2 = role_baseline_advantages(r, [(0, "x"), (0, "o")], ["x", "o"], b, decay=0.5)
    assert adv.tolist() == [0.5, -0.5] and b2 == {"x": 0.75, "o": -0.75}
    assert b == {"x": 0.5, "o": -0.5}  # the input is not modified


def test_games_of_one_batch_are_taken_in_order():
    # decay .5; three games of seat x: +1, -1, +1 -> baselines 0, .5, -.25 ; advantages 1, -1.5, 1.25
    r = torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64)
    adv, b = role_baseline_advantages(r, [0, 1, 2], ["x"] * 3, {}, decay=0.5)
    assert adv.tolist() == [1.0, -1.5, 1.25] and b == {"x": 0.375}


def test_a_players_turns_share_its_games_baseline_and_update_it_once():
    # x moved three times in game 0 (each row its terminal reward 1): one sample, one update
    r = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    adv, b = role_baseline_advantages(r, [0, 0, 0], ["x"] * 3, {"x": 0.2}, decay=0.9)
    assert adv.tolist() == pytest.approx([0.8] * 3) and b["x"] == pytest.approx(0.9 * 0.2 + 0.1 * 1.0)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="decay 1.0 must be in"):
        role_baseline_advantages(torch.zeros(1), [0], ["x"], {}, decay=1.0)
    with pytest.raises(ValueError, match="one per row"):
        role_baseline_advantages(torch.zeros(2), [0], ["x"], {})
    with pytest.raises(ValueError, match="several keys"):
        role_baseline_advantages(torch.zeros(2), [0, 0], ["x", "o"], {})
    with pytest.raises(ValueError, match="running baseline across steps"):
        compute_advantages(torch.zeros(2), torch.zeros(2, dtype=torch.long), torch.arange(2), unit="episode",
                           center="role_ema", scale="none")


def _episode(index: int, rewards: dict[str, float]) -> Episode:
    ep = Episode(prompt_index=index, index=index, problem_id=f"g{index}")
    for agent in rewards:
        ep.steps.append(Step(prompt_index=index, episode=index, agent=agent, agent_call=0, model="m", prompt_ids=[1],
                             response_ids=[2], logprobs=[0.0], temperature=1.0, text="[4]", valid=True))
    ep.agent_rewards = dict(rewards)
    return ep


def test_the_rae_preset_through_the_trainers_scoring():
    est = get_estimator("rae")
    assert (est.scope, est.unit, est.center, est.scale) == ("agent", "episode", "role_ema", "none")
    episodes = [_episode(0, {"player_0": 1.0, "player_1": -1.0}), _episode(1, {"player_0": 1.0, "player_1": -1.0})]
    scorer = Scorer.build(AlgoConfig(estimator="rae", rae_decay=0.95), Context(game="tictactoe"))
    assert isinstance(scorer.advantages, RunningBaseline)
    steps = scorer.rewards_and_advantages(episodes)
    # game 0: baselines 0 -> 1, -1 ; then p0 .05, p1 -.05 ; game 1: 1 - .05 = .95, -1 + .05 = -.95
    assert [round(s.advantage, 6) for s in steps] == [1.0, -1.0, 0.95, -0.95]
    expected = {"tictactoe/player_0": 0.0975, "tictactoe/player_1": -0.0975}
    assert scorer.state_dict()["advantages"]["baselines"] == pytest.approx(expected)
    again = Scorer.build(AlgoConfig(estimator="rae", rae_decay=0.95), Context(game="tictactoe"))
    again.load_state_dict(scorer.state_dict())  # a resumed run goes on from the saved baselines
    assert again.advantages.state_dict() == scorer.advantages.state_dict()
