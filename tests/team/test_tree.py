"""The math_tree workflow (MARS2): tree shape, node records, expansion policies, tree-level groups."""

from __future__ import annotations

import random

import pytest

from teamrl.config.sections import AlgoConfig
from teamrl.domains.math.arith import ArithConfig, ArithTask
from teamrl.engines.base import GenOutput, GenRequest, SamplingParams
from teamrl.scoring import score_steps
from teamrl.tasks.base import Problem
from teamrl.team.agents import get_agent
from teamrl.team.team import AgentBinding, Dispatcher
from teamrl.team.tree import AgentPicker, MathTreeConfig
from teamrl.team.workflows import get_workflow
from teamrl.train.rollout import Rollout
from tests.scripted import ScriptedEngineBase

PROBLEM = Problem(id="p", question="What is 2 + 3?", answer="5")


class TreeEngine(ScriptedEngineBase):
    """Replies by agent (told apart by system prompt): the solver always says 4, the refiner 5."""

    def __init__(self, tokenizer, replies: dict[str, str]):
        super().__init__(tokenizer)
        self.replies, self.prompts = replies, []

    def generate(self, requests: list[GenRequest], on_progress=None) -> list[GenOutput]:
        outs = []
        for r in requests:
            prompt = self.tokenizer.decode(r.prompt_ids)
            self.prompts.append(prompt)
            text = self.replies["refiner" if "earlier attempt is marked wrong" in prompt else "solver"]
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            outs.append(GenOutput(ids, [-0.5] * len(ids), text, "stop"))
        return outs


def tree_rollout(tokenizer, cfg: MathTreeConfig, replies=None) -> tuple[Rollout, TreeEngine]:
    eng = TreeEngine(tokenizer, replies or {"solver": "4", "refiner": "5"})
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    bindings = {a: AgentBinding(get_agent(a), "m", sp, get_agent(a).system_prompt) for a in ("solver", "refiner")}
    return Rollout(Dispatcher({"m": eng}), bindings, get_workflow("math_tree"), cfg, ArithTask(ArithConfig())), eng


def test_round_robin_tree_has_the_expected_shape(tokenizer):
    """Branching 2, 6 nodes, depth <= 3; the solver (wrong) and refiner (right) alternate.

    root -> n0 (solver, wrong), n1 (refiner, right); only failed nodes are refined:
    n0 -> n2 (solver, wrong), n3 (refiner, right); n2 -> n4 (solver), n5 (refiner) at depth 3.
    """
    cfg = MathTreeConfig(max_nodes=6, branching=2, max_depth=3, expansion="round_robin", stop_on_success=False)
    ro, eng = tree_rollout(tokenizer, cfg)
    eps = ro.collect([PROBLEM], 2, progress=False)
    assert len(eps) == 2
    for ep in eps:
        assert [s.agent for s in ep.steps] == ["solver", "refiner"] * 3
        assert [s.parent for s in ep.steps] == [-1, -1, 0, 0, 2, 2]
        assert [s.depth for s in ep.steps] == [1, 1, 2, 2, 3, 3]
        assert {s.tree for s in ep.steps} == {ep.index}
        assert ep.step_rewards == {0: 0.0, 1: 1.0, 2: 0.0, 3: 1.0, 4: 0.0, 5: 1.0}
        assert ep.final == "5" and ep.reward == 1.0 and ep.info["nodes"] == 6 and ep.info["depth"] == 3
    # a child sees its parent's reply and the wrong answer as feedback
    # (the first batch holds both trees' root children; the next, children of the wrong answer 4)
    assert not any("is wrong" in p for p in eng.prompts[:4])
    assert all("its final answer 4 is wrong" in p for p in eng.prompts[4:8])


def test_tree_scope_groups_all_nodes_of_one_tree(tokenizer):
    cfg = MathTreeConfig(max_nodes=6, branching=2, max_depth=3, expansion="round_robin", stop_on_success=False)
    ro, _ = tree_rollout(tokenizer, cfg)
    eps = ro.collect([PROBLEM], 2, progress=False)
    steps = score_steps(eps, AlgoConfig(estimator="tree"))
    # one tree = one group of six nodes with rewards 0,1,0,1,0,1: mean .5, unbiased std sqrt(1.5/5)
    a = 0.5 / (0.3 ** 0.5)
    assert [round(s.advantage, 4) for s in steps] == [round(x, 4) for x in [-a, a, -a, a, -a, a] * 2]
    # drmas groups per agent instead: the solver's nodes are all wrong, so its advantages are 0
    steps = score_steps(eps, AlgoConfig(estimator="drmas"))
    assert [s.advantage for s in steps] == [0.0] * 12


def test_stop_on_success_and_node_budget(tokenizer):
    cfg = MathTreeConfig(max_nodes=5, branching=2, expansion="round_robin", stop_on_success=True)
    ro, _ = tree_rollout(tokenizer, cfg)
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    assert len(ep.steps) == 2 and ep.reward == 1.0  # the refiner's first node is right: stop
    ro, _ = tree_rollout(tokenizer, MathTreeConfig(max_nodes=5, branching=2, max_depth=9, expansion="round_robin"),
                         replies={"solver": "4", "refiner": "6"})
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    assert len(ep.steps) == 5 and ep.reward == 0.0 and ep.final == "4"  # budget spent; the last node's answer


def test_tree_reward_mode_gives_every_node_the_tree_outcome(tokenizer):
    cfg = MathTreeConfig(max_nodes=4, expansion="round_robin", stop_on_success=False, reward="tree")
    ro, _ = tree_rollout(tokenizer, cfg)
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    steps = score_steps([ep], AlgoConfig(estimator="tree"))
    assert ep.step_rewards == {} and [s.reward for s in steps] == [1.0] * 4


def test_bandit_prefers_the_agent_that_succeeds():
    picker = AgentPicker(["a", "b"], "bandit", rng=random.Random(0))
    for _ in range(20):
        picker.update("a", False)
        picker.update("b", True)
    # posteriors Beta(1, 21) vs Beta(21, 1): b wins essentially every draw
    assert sum(picker.pick() == "b" for _ in range(200)) >= 198
    fresh = [AgentPicker(["a", "b"], "bandit", rng=random.Random(7)).pick() for _ in range(2)]
    assert fresh[0] == fresh[1]  # seeded


def test_bandit_tree_is_reproducible_and_learns_within_the_tree(tokenizer):
    cfg = MathTreeConfig(max_nodes=12, branching=2, max_depth=12, expansion="bandit", stop_on_success=False, seed=1)
    runs = []
    for _ in range(2):
        ro, _ = tree_rollout(tokenizer, cfg, replies={"solver": "4", "refiner": "6"})  # both always wrong
        [ep] = ro.collect([PROBLEM], 1, progress=False)
        runs.append([s.agent for s in ep.steps])
    assert runs[0] == runs[1] and len(runs[0]) == 12


@pytest.mark.parametrize("kw,match", [({"max_nodes": 0}, "max_nodes 0"), ({"agents": []}, "agents is empty"),
                                      ({"prior_alpha": 0.0}, "prior_alpha"), ({"agents": ["a", "a"]}, "twice"),
                                      ({"expansion": "round_robin", "prior_beta": 2.0}, "round_robin ignores them")])
def test_bad_tree_options_are_rejected(kw, match):
    with pytest.raises(ValueError, match=match):
        MathTreeConfig(**kw)
