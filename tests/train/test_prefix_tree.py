"""C3's rollout (rollout.prefix_tree) and credit (algo.estimator c3): the tree's shape and replays, the node returns
and sibling advantages of its steps, the config rules, the diagnostics, and a run on the CPU."""

from __future__ import annotations

import json
import math

import pytest
import torch

from teamrl.algos import c3 as c3_lib
from teamrl.config.sections import AlgoConfig
from teamrl.config.tools import ConfigError
from teamrl.domains.math.arith import ArithConfig, ArithTask
from teamrl.engines.base import GenOutput, GenRequest, SamplingParams
from teamrl.scoring import score_steps
from teamrl.scoring.c3 import node_returns, tree_metrics
from teamrl.tasks.base import Problem
from teamrl.team.agents import get_agent
from teamrl.team.team import AgentBinding, Dispatcher
from teamrl.team.workflows import MathTeamConfig, get_workflow
from teamrl.train.rollout import Rollout
from teamrl.train.trainer import Trainer
from tests.scripted import ScriptedEngineBase
from tests.train.test_trainer import tiny_config

PROBLEMS = [Problem(id="p0", question="What is 2 + 3?", answer="5"), Problem(id="p1", question="What is 1 + 1?", answer="2")]


class Counting(ScriptedEngineBase):
    """The solver's n-th reply answers ``answers[n % len]``; the verifier's n-th reply says ``verdicts[n % len]``."""

    def __init__(self, tokenizer, answers=("5", "4", "2"), verdicts=("yes", "no", "no")):
        super().__init__(tokenizer)
        self.answers, self.verdicts, self.prompts = answers, verdicts, []
        self.count = {"solver": 0, "verifier": 0}

    def generate(self, requests: list[GenRequest], on_progress=None) -> list[GenOutput]:
        outs = []
        for r in requests:
            prompt = self.tokenizer.decode(r.prompt_ids)
            who = "verifier" if "Is the proposed solution correct?" in prompt else "solver"
            n = self.count[who]
            self.count[who] += 1
            self.prompts.append((who, prompt))
            text = f"The answer is {self.answers[n % len(self.answers)]}." if who == "solver" \
                else self.verdicts[n % len(self.verdicts)]
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            outs.append(GenOutput(ids, [-0.5] * len(ids), text, "stop"))
        return outs


def rollout(tokenizer, **engine) -> tuple[Rollout, Counting]:
    eng = Counting(tokenizer, **engine)
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    bindings = {a: AgentBinding(get_agent(a), "m", sp, get_agent(a).system_prompt) for a in ("solver", "verifier")}
    wf = MathTeamConfig(max_loops=2, verify_last=False)  # solver, verifier, and on a reject the solver again
    return Rollout(Dispatcher({"m": eng}), bindings, get_workflow("math_team"), wf, ArithTask(ArithConfig())), eng


def test_a_two_by_three_tree_replays_the_first_call_and_samples_the_rest(tokenizer):
    ro, eng = rollout(tokenizer)
    eps = ro.collect(PROBLEMS, 6, progress=False, tree=(2, 3))
    assert len(eps) == 12 and [ep.index for ep in eps] == list(range(12))
    for g in range(2):
        mine = [ep for ep in eps if ep.prompt_index == g]
        owners, replays = mine[:2], mine[2:]
        assert [s.agent for s in owners[0].steps][:2] == ["solver", "verifier"]
        assert [ep.steps[0].branch for ep in owners] == [(0,), (1,)]
        assert [ep.steps[1].branch for ep in owners] == [(0, 0), (1, 0)]
        # 2 more verifiers under each first answer, which they judge without it being generated again
        assert sorted(ep.steps[0].branch for ep in replays) == [(0, 1), (0, 2), (1, 1), (1, 2)]
        assert all(ep.steps[0].agent == "verifier" for ep in replays)
        for ep in replays:
            owner = owners[ep.steps[0].branch[0]]
            assert owner.steps[0].text in tokenizer.decode(ep.steps[0].prompt_ids)
            if len(ep.steps) > 1:  # rejected: the solver's retry, the rest of this branch
                assert ep.steps[1].agent == "solver" and ep.steps[1].branch == ep.steps[0].branch + (0,)
    # every node generated once: 2 x 2 first answers, 2 x 6 verdicts, and a retry per reject
    retries = sum(1 for ep in eps for s in ep.steps if s.agent == "solver" and s.agent_call == 1)
    assert eng.count == {"solver": 4 + retries, "verifier": 12}
    assert sum(len(ep.steps) for ep in eps) == len(eng.prompts)


def test_node_returns_and_c3_advantages_of_the_scored_tree(tokenizer):
    ro, _ = rollout(tokenizer)
    eps = ro.collect(PROBLEMS[:1], 6, progress=False, tree=(2, 3))
    steps = score_steps(eps, AlgoConfig(estimator="c3", eps=1e-8))
    leaves = {ep.steps[-1].branch: ep.reward for ep in eps}
    for s in steps:
        below = [r for path, r in leaves.items() if path[:len(s.branch)] == s.branch]
        assert s.reward == pytest.approx(sum(below) / len(below))
    by_parent: dict[tuple[int, ...], list] = {}
    for s in steps:
        by_parent.setdefault(s.branch[:-1], []).append(s)
    for sibs in by_parent.values():
        r = torch.tensor([s.reward for s in sibs])
        want = c3_lib.sibling_advantages(r, torch.zeros(len(sibs), dtype=torch.long), eps=1e-8)
        assert [s.advantage for s in sibs] == pytest.approx(want.tolist(), abs=1e-9)
    assert any(abs(s.advantage) > 0.5 for s in steps)  # the answers differ: some credit moves
    assert node_returns(eps, steps) == [s.reward for s in steps]


def test_the_diagnostics_on_a_tree():
    """Two first answers (rewards below: 1, 1 and 0, 0) and their verdicts: C3's credit follows the counterfactual
    effect (fidelity 1), the LOO credit of the first answers varies ((1 - 0)^2 = 1), verdicts that copy their parent
    carry its information (influence > 0)."""
    from teamrl.team.records import Episode, Step

    eps = []
    for i, (path, reward) in enumerate([((0,), 1.0), ((1,), 0.0), ((0, 1), 1.0), ((1, 1), 0.0)]):
        ep = Episode(prompt_index=0, index=i, problem_id="p", reward=reward)
        if len(path) == 1:
            ep.steps.append(Step(0, i, "solver", 0, "m", [1], [2], [-0.1], 1.0, f"a{path[0]}", True, branch=path))
        ep.steps.append(Step(0, i, "verifier", 0, "m", [1], [2], [-0.1], 1.0, f"v{path[0]}", True,
                             branch=path if len(path) == 2 else path + (0,)))
        eps.append(ep)
    steps = score_steps(eps, AlgoConfig(estimator="c3", eps=1e-8))
    m = tree_metrics(eps, steps)
    assert m["c3/solver/credit_fidelity"] == 1.0 and m["c3/solver/credit_var"] == pytest.approx(1.0)
    assert m["c3/solver/influence_mi"] > 0 and m["c3/verifier/credit_var"] == 0.0
    assert m["c3/groups"] == 3 and m["c3/group_size_mean"] == 2


@pytest.mark.parametrize(("extra", "message"), [
    (["algo.estimator=c3"], "set rollout.prefix_tree"),
    (["rollout.prefix_tree=[2,2]"], "the product 4 must equal rollout.group_size 3"),
    (["rollout.prefix_tree=[3,0]"], "integer >= 1"),
    (["rollout.prefix_tree=[3]", "algo.credit=shapley"], "algo.credit"),
    (["rollout.prefix_tree=[3]", "algo.estimator=c3", "algo.dynamic_sampling=true"], "dynamic_sampling"),
    (["rollout.prefix_tree=[3]", "workflow.name=math_tree", "agents.refiner.model=main"], "samples a tree of its own"),
])
def test_config_rules(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(tmp_path, "default", "r", *extra)


def test_one_c3_step_on_a_cpu_trains_and_logs_the_diagnostics(tmp_path, tiny_model_dir):
    cfg = tiny_config(tmp_path, tiny_model_dir, "c3", "algo.estimator=c3", "rollout.group_size=4",
                      "rollout.prefix_tree=[2,2]", "algo.eps=1e-8", "train.steps=1", "eval.before=false",
                      "eval.after=false")
    tr = Trainer(cfg, progress=False)
    tr.train()
    row = json.loads((tmp_path / "c3" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["c3/groups"] >= 4 and math.isfinite(row["c3/credit_fidelity"])
    turns = [t for line in (tmp_path / "c3" / "episodes.jsonl").read_text().splitlines()
             for t in json.loads(line)["turns"]]
    assert turns and all("branch" in t for t in turns)
    assert (tmp_path / "c3" / "checkpoints").is_dir()
