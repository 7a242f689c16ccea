"""Catalogue adapters: reasoning-gym (a task), TextArena and Gymnasium (environments), each on two of its
entries, driven by a tiny random model through the workflows; the verifiers checked on known answers."""

from __future__ import annotations

import importlib.util
import random

import pytest

from teamrl.domains.catalogues.catalogues import require
from teamrl.domains.environments.env_team import EnvSingleConfig
from teamrl.engines.base import SamplingParams
from teamrl.tasks.base import build_task
from teamrl.tasks.env import actions_text
from teamrl.team.agents import get_agent
from teamrl.team.team import AgentBinding, Dispatcher
from teamrl.team.workflows import SingleConfig, get_workflow
from teamrl.train.rollout import Rollout


def needs(module: str):
    return pytest.mark.skipif(importlib.util.find_spec(module) is None,
                              reason=f"{module} is not installed (pip install 'teamrl[...]' or the test extra)")


def tiny_rollout(tokenizer, workflow: str, options, task, agent: str) -> Rollout:
    from teamrl.engines.hf import HFEngine
    from tests.conftest import make_tiny_model

    eng = HFEngine(make_tiny_model(tokenizer), tokenizer, seed=0)
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    bindings = {agent: AgentBinding(get_agent(agent), "m", sp, get_agent(agent).system_prompt)}
    # games such as FrozenLake render boards longer than the tiny model's 512 positions (its rotary embeddings
    # take any position): the context limit is raised as models.<m>.max_context would
    return Rollout(Dispatcher({"m": eng}, context_limits={"m": 4096}), bindings, get_workflow(workflow), options, task)


def test_missing_package_names_its_extra():
    with pytest.raises(ValueError, match=r"^no_such_pkg_xyz is not installed; pip install 'teamrl\[textarena\]'$"):
        require("no_such_pkg_xyz", "textarena")


@needs("reasoning_gym")
@pytest.mark.parametrize("dataset, options", [("mini_sudoku", {}), ("countdown", {"min_numbers": 3, "max_numbers": 3})])
def test_reasoning_gym_splits_verifier_and_a_rollout(tokenizer, dataset, options):
    task = build_task("reasoning_gym", {"dataset": dataset, "options": options, "n_train": 6, "n_test": 3, "seed": 1})
    train, test = task.problems("train"), task.problems("test")
    assert len(train) == 6 and 1 <= len(test) <= 3 and not {p.question for p in train} & {p.question for p in test}
    p = train[0]
    assert task.score(p, f"so <answer>{p.answer}</answer>") == 1.0  # its own verifier accepts the gold answer
    assert task.score(p, "no tags") == 0.0
    (ep, *_) = tiny_rollout(tokenizer, "single", SingleConfig(), task, "solver").collect(train[:1], 2, progress=False)
    assert ep.error is None and 0.0 <= ep.reward <= 1.0 and len(ep.steps) == 1


def test_reasoning_gym_bad_names_and_options():
    pytest.importorskip("reasoning_gym")
    with pytest.raises(ValueError, match="unknown reasoning-gym dataset 'mini_sudok'"):
        build_task("reasoning_gym", {"dataset": "mini_sudok"})
    with pytest.raises(ValueError, match="do not fit dataset 'countdown'"):
        build_task("reasoning_gym", {"dataset": "countdown", "options": {"bogus": 1}})


@needs("textarena")
@pytest.mark.parametrize("env_id", ["GuessTheNumber-v0", "FrozenLake-v0"])
def test_textarena_games_run_turn_by_turn(tokenizer, env_id):
    task = build_task("textarena", {"env_id": env_id, "n_train": 3, "n_test": 2, "max_turns": 3})
    ro = tiny_rollout(tokenizer, "env_single", EnvSingleConfig(), task, "planner")
    (ep,) = ro.collect(task.problems("train")[:1], 1, progress=False)
    assert ep.error is None and 1 <= len(ep.steps) <= 3 and len(ep.step_rewards) == len(ep.steps)
    assert ep.info["turns"] == len(ep.steps)


@needs("textarena")
def test_textarena_a_won_game_scores_one():
    task = build_task("textarena", {"env_id": "GuessTheNumber-v0", "n_train": 2, "n_test": 1, "max_turns": 10})
    p = task.problems("train")[0]
    env = task.make_env()
    env.reset(p)
    lo, hi, guesses = 1, 20, []
    while True:  # binary search on the game's hints
        guess = (lo + hi) // 2
        guesses.append(f"[{guess}]")
        turn = env.step(guesses[-1])
        if turn.done:
            break
        lo, hi = (guess + 1, hi) if "higher" in turn.observation[-40:] else (lo, guess - 1)
    assert env.success and turn.reward == 1.0
    assert task.score(p, actions_text(guesses)) == 1.0 and task.score(p, actions_text(["[0]"])) == 0.0


@needs("gymnasium")
@pytest.mark.parametrize("env_id, options, solution", [
    ("FrozenLake-v1", {"is_slippery": False}, ["right", "right", "down", "down", "down", "right"]),
    ("CliffWalking-v1", {}, ["up"] + ["right"] * 11 + ["down"]),
])
def test_gymnasium_text_environments(tokenizer, env_id, options, solution):
    task = build_task("gymnasium", {"env_id": env_id, "options": options, "n_train": 2, "n_test": 1, "max_turns": 20})
    p = task.problems("train")[0]
    env = task.make_env()
    assert "@" in env.reset(p) or "x" in env.reset(p)
    assert task.score(p, actions_text([env.names.index(a) for a in solution])) == 1.0
    ro = tiny_rollout(tokenizer, "env_single", EnvSingleConfig(), task, "planner")
    (ep,) = ro.collect([p], 1, progress=False)
    assert ep.error is None and len(ep.steps) >= 1 and ep.step_rewards


@needs("gymnasium")
def test_gymnasium_refuses_unknown_ids():
    with pytest.raises(ValueError, match="gymnasium cannot make 'FrozenLake-v9'"):
        build_task("gymnasium", {"env_id": "FrozenLake-v9"})


@needs("textarena")
def test_textarena_instances_differ_by_seed():
    # Minesweeper draws its mines after the first move: every first observation is the same empty board
    task = build_task("textarena", {"env_id": "Minesweeper-v0-small", "n_train": 50, "n_test": 5})
    train = task.problems("train")
    assert len({p.meta["seed"] for p in train}) == 50
    assert len({p.question for p in train}) == 1  # told apart by seed, not by what the model first sees
    # the same seed draws the same mines, whatever else uses Python's random in between
    boards = []
    for noise in (0, 1):
        env = task.make_env()
        env.reset(train[0])
        random.seed(noise)
        env.step("[2 2]")
        boards.append(str(env.game.grid))
    assert boards[0] == boards[1]


@needs("textarena")
def test_textarena_keeps_the_callers_random_state():
    task = build_task("textarena", {"env_id": "Minesweeper-v0-small", "n_train": 2, "n_test": 1})
    random.seed(7)
    expected = random.random()
    random.seed(7)
    env = task.make_env()
    env.reset(task.problems("train")[0])
    env.step("[1 1]")
    assert random.random() == expected


@needs("textarena")
def test_textarena_rejected_move_is_an_invalid_step(tokenizer):
    task = build_task("textarena", {"env_id": "FifteenPuzzle-v0", "n_train": 2, "n_test": 1, "max_turns": 3})
    env = task.make_env()
    env.reset(task.problems("train")[0])
    turn = env.step("I would slide a tile")  # no [move]: TextArena's invalid-move signal
    assert turn.info["invalid"] and not turn.done
    # through the workflow: the tiny model's replies hold no [up]/[down]/...: every step is invalid
    ro = tiny_rollout(tokenizer, "env_single", EnvSingleConfig(), task, "planner")
    (ep,) = ro.collect(task.problems("train")[:1], 1, progress=False)
    assert ep.error is None and ep.steps and not any(s.valid for s in ep.steps)


@needs("textarena")
def test_textarena_refusals_name_the_cause():
    from teamrl.domains.environments.textarena import game_cause

    with pytest.raises(ValueError, match="TextArena game 'TicTacToe-v0' does not play with 1 player.*another number of players"):
        build_task("textarena", {"env_id": "TicTacToe-v0", "n_train": 1, "n_test": 1}).problems("train")
    with pytest.raises(ValueError, match="TextArena game 'NoSuchGame-v0' cannot be made"):
        build_task("textarena", {"env_id": "NoSuchGame-v0"})
    assert "NLTK data 'words'" in game_cause(LookupError("Resource 'words' not found.\n  Please use the NLTK Downloader"))
