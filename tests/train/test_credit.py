"""Shapley credit on real rollouts: coalition values of the math team, rerun costs, config wiring."""

from __future__ import annotations

import pytest

from teamrl.config.sections import AlgoConfig
from teamrl.scoring import score_steps
from teamrl.scoring.credit import ShapleyCredit
from teamrl.team.workflows import MathTeamConfig
from tests.team.test_workflows import PROBLEM, _rollout


def credit(ro, counterfactual="workflow", **kw) -> ShapleyCredit:
    return ShapleyCredit(ro, counterfactual, exact_max_agents=kw.pop("exact_max_agents", 6), samples=8, seed=0, **kw)


def test_math_team_replay_credits_by_hand(tokenizer):
    # solver 5 (right), verifier "no" (wrong reject), solver 4 (wrong), verifier yes: team reward R = 0.
    # v(both) = 0; v(solver) = score of the first answer 5 = 1; v(verifier) = v() = score("") = 0.
    # phi_solver = 1/2 [(1 - 0) + (0 - 0)] = 0.5; phi_verifier = 1/2 [(0 - 0) + (0 - 1)] = -0.5
    ro, eng = _rollout(tokenizer, {"solver": ["5", "4"], "verifier": ["no", "yes"]}, MathTeamConfig(max_loops=2))
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    calls = len(eng.batches)
    metrics = credit(ro).assign([ep], [PROBLEM], step=0)
    assert ep.reward == 0.0 and ep.info["shapley"] == {"solver": 0.5, "verifier": -0.5}
    assert ep.agent_rewards == {"solver": 0.5, "verifier": -0.5}  # R + phi
    # distinct counterfactual answers "5" and "" are scored once each; no model call
    assert metrics["credit/rescoring_calls"] == 2 and metrics["credit/extra_generations"] == 0
    assert metrics["credit/coalitions"] == 3 and len(eng.batches) == calls
    steps = score_steps([ep], AlgoConfig(estimator="drmas"))
    assert [s.reward for s in steps] == [0.5, -0.5, 0.5, -0.5]


def test_weights_mix_the_team_reward_and_the_credit(tokenizer):
    ro, _ = _rollout(tokenizer, {"solver": ["5"], "verifier": ["yes"]}, MathTeamConfig(max_loops=1))
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    credit(ro, global_weight=0.0, credit_weight=2.0).assign([ep], [PROBLEM], step=0)
    # R = 1; v(solver) = 1 (first answer = final), v(verifier) = v() = 0: phi = (1, 0)
    assert ep.agent_rewards == {"solver": 2.0, "verifier": 0.0}


def test_rerun_generates_counterfactuals_and_counts_them(tokenizer):
    ro, eng = _rollout(tokenizer, {"solver": ["5"], "verifier": ["yes"]}, MathTeamConfig(max_loops=1))
    eps = ro.collect([PROBLEM], 2, progress=False)
    before = sum(eng.batches)
    metrics = credit(ro, "rerun").assign(eps, [PROBLEM, PROBLEM], step=0)
    # per episode: {solver} reruns with the verifier masked ("yes": 1 solver call), {verifier} with the
    # solver masked ("" judged: 1 verifier call), {} with both masked (0 calls)
    assert metrics["credit/extra_generations"] == 4 == sum(eng.batches) - before
    assert metrics["credit/rescoring_calls"] == 2  # "" once per episode; "5" is the episode's own answer
    assert all(len(ep.steps) == 2 for ep in eps)  # counterfactual calls are never trained on
    assert eps[0].info["shapley"] == {"solver": 1.0, "verifier": 0.0}


def test_sampled_credit_for_teams_above_the_exact_limit(tokenizer):
    ro, _ = _rollout(tokenizer, {"solver": ["5", "4"], "verifier": ["no", "yes"]}, MathTeamConfig(max_loops=2))
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    metrics = credit(ro, exact_max_agents=1).assign([ep], [PROBLEM], step=0)
    assert metrics["credit/sampled_episodes"] == 1
    assert sum(ep.info["shapley"].values()) == pytest.approx(0.0)  # efficiency holds per ordering


def test_per_step_rewards_are_rejected(tokenizer):
    ro, _ = _rollout(tokenizer, {"solver": ["5"], "verifier": ["yes"]}, MathTeamConfig(max_loops=1, reward="per_agent"))
    eps = ro.collect([PROBLEM], 1, progress=False)
    with pytest.raises(ValueError, match="per-step rewards"):
        credit(ro).assign(eps, [PROBLEM], step=0)


def test_shapley_and_tree_configs_are_validated():
    from teamrl.config.schema import load_config
    from teamrl.config.tools import ConfigError

    tree = ["workflow.name=math_tree", "agents={solver: {}, refiner: {}}"]
    with pytest.raises(ConfigError, match="has no counterfactual of its own"):
        load_config(None, [*tree, "algo.credit=shapley", "workflow.math_tree.reward=tree"])
    with pytest.raises(ConfigError, match="per-step rewards"):
        load_config(None, ["algo.credit=shapley", "workflow.math_team.reward=per_agent"])
    with pytest.raises(ConfigError, match="did you mean 'shapley'"):
        load_config(None, ["algo.credit=shapely"])
    with pytest.raises(ConfigError, match="add agents.refiner"):
        load_config(None, ["workflow.name=math_tree"])
    with pytest.raises(ConfigError, match="overlong_buffer 100 is longer"):
        load_config(None, ["algo.overlong_buffer=100"])
    load_config(None, [*tree, "algo.credit=shapley", "workflow.math_tree.reward=tree", "algo.shapley.counterfactual=rerun"])
