"""Workflow semantics, checked with a scripted engine that replays fixed replies.

The scripted engine stands in for a model so that each control-flow branch is hit exactly; it
tokenizes with the real tokenizer, so Steps carry real ids.
"""

from __future__ import annotations

import pytest

from teamrl.domains.math.arith import ArithConfig, ArithTask
from teamrl.engines.base import GenOutput, GenRequest, SamplingParams
from teamrl.tasks.base import Problem
from teamrl.team.agents import Parsed, get_agent, register_agent
from teamrl.team.records import Episode
from teamrl.team.team import AgentBinding, Dispatcher, Team
from teamrl.team.workflows import MathTeamConfig, get_workflow, parse_verdict
from teamrl.train.rollout import Rollout
from tests.scripted import ScriptedEngineBase


class ScriptedEngine(ScriptedEngineBase):
    """Answers each call with the next reply of the agent whose system prompt it sees."""

    def __init__(self, tokenizer, replies: dict[str, list[str]]):
        super().__init__(tokenizer)
        self.replies = {k: list(v) for k, v in replies.items()}
        self.batches: list[int] = []

    def generate(self, requests: list[GenRequest], on_progress=None) -> list[GenOutput]:
        self.batches.append(len(requests))
        outs = []
        for r in requests:
            prompt = self.tokenizer.decode(r.prompt_ids)
            agent = "verifier" if "You are a strict verifier" in prompt else "solver"
            text = self.replies[agent].pop(0) if len(self.replies[agent]) > 1 else self.replies[agent][0]
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            outs.append(GenOutput(ids, [-0.5] * len(ids), text, "stop"))
        return outs


def _rollout(tokenizer, replies, cfg: MathTeamConfig, workflow: str = "math_team") -> tuple[Rollout, ScriptedEngine]:
    eng = ScriptedEngine(tokenizer, replies)
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    bindings = {a: AgentBinding(get_agent(a), "m", sp, get_agent(a).system_prompt) for a in ("solver", "verifier")}
    return Rollout(Dispatcher({"m": eng}), bindings, get_workflow(workflow), cfg, ArithTask(ArithConfig())), eng


PROBLEM = Problem(id="p", question="What is 2 + 3?", answer="5")


def test_approve_ends_after_one_round(tokenizer):
    ro, _ = _rollout(tokenizer, {"solver": ["5"], "verifier": ["yes"]}, MathTeamConfig(max_loops=3))
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    assert [(s.agent, s.agent_call) for s in ep.steps] == [("solver", 0), ("verifier", 0)]
    assert ep.reward == 1.0 and ep.final == "5"


def test_reject_sends_solver_again_until_max_loops(tokenizer):
    ro, _ = _rollout(tokenizer, {"solver": ["4", "6", "7"], "verifier": ["no"]}, MathTeamConfig(max_loops=3))
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    assert [(s.agent, s.agent_call) for s in ep.steps] == [
        ("solver", 0), ("verifier", 0), ("solver", 1), ("verifier", 1), ("solver", 2), ("verifier", 2)]
    assert ep.final == "7" and ep.reward == 0.0  # the last answer stands, approved or not
    # the retry prompt shows the solver its previous answer
    assert "4" in tokenizer.decode(ep.steps[2].prompt_ids)


@pytest.mark.parametrize("on_invalid,calls", [("approve", 2), ("reject", 4)])
def test_unparseable_verdict_follows_config(tokenizer, on_invalid, calls):
    cfg = MathTeamConfig(max_loops=2, on_invalid_verdict=on_invalid)
    ro, _ = _rollout(tokenizer, {"solver": ["5"], "verifier": ["maybe"]}, cfg)
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    assert len(ep.steps) == calls
    assert [s.valid for s in ep.steps if s.agent == "verifier"] == [False] * (calls // 2)


def test_solver_without_a_number_is_an_invalid_step(tokenizer):
    ro, _ = _rollout(tokenizer, {"solver": ["I do not know"], "verifier": ["yes"]}, MathTeamConfig(max_loops=1))
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    assert ep.steps[0].valid is False and ep.reward == 0.0


def test_calls_of_all_episodes_and_agents_are_batched(tokenizer):
    ro, eng = _rollout(tokenizer, {"solver": ["5"], "verifier": ["yes"]}, MathTeamConfig(max_loops=1))
    eps = ro.collect([PROBLEM, Problem(id="q", question="What is 1 + 1?", answer="2")], 8, progress=False)
    assert len(eps) == 16 and {ep.prompt_index for ep in eps} == {0, 1}
    assert eng.batches == [16, 16]  # one solver batch, one verifier batch, not 32 single calls


def test_verdict_parsing_modes():
    assert parse_verdict("No. It is 6.", mode="strict") == Parsed("reject", True)
    assert parse_verdict("Well, yes", mode="strict").valid is False
    assert parse_verdict("Well, yes", mode="lenient") == Parsed("approve", True)
    assert parse_verdict("", mode="lenient").valid is False
    with pytest.raises(ValueError, match="verdict mode"):
        parse_verdict("yes", mode="loose")


def test_register_agent_rejects_bad_and_duplicate_names():
    with pytest.raises(ValueError, match="plain identifier"):
        register_agent("Solver Two", system_prompt="x")
    with pytest.raises(ValueError, match="already registered"):
        register_agent("solver", system_prompt="x")(lambda t: Parsed(t, True))
    with pytest.raises(ValueError, match="did you mean 'solver'"):
        get_agent("solvr")


def test_unknown_agent_in_workflow_is_a_clear_error(tokenizer):
    eng = ScriptedEngine(tokenizer, {"solver": ["5"]})
    team = Team({}, Dispatcher({"m": eng}), Episode(prompt_index=0, index=0, problem_id="p"))
    import asyncio
    with pytest.raises(ValueError, match="not in the team"):
        asyncio.run(team.ask("critic", [{"role": "user", "content": "hi"}]))


def test_single_workflow_is_one_call(tokenizer):
    from teamrl.team.workflows import SingleConfig

    ro, eng = _rollout(tokenizer, {"solver": ["The answer is 5"], "verifier": ["yes"]}, SingleConfig(), "single")
    eps = ro.collect([PROBLEM], 4, progress=False)
    assert [len(ep.steps) for ep in eps] == [1, 1, 1, 1] and eng.batches == [4]
    assert all(ep.reward == 1.0 and ep.steps[0].agent == "solver" for ep in eps)


def test_a_failing_episode_is_kept_and_the_others_go_on(tokenizer):

    ro, _ = _rollout(tokenizer, {"solver": ["5"], "verifier": ["yes"]}, MathTeamConfig(max_loops=1))
    real = ro.workflow

    async def flaky(team, problem, task, cfg):
        if problem.id == "q":
            await team.ask("solver", [{"role": "user", "content": "hi"}])
            raise ConnectionError("tool at http://127.0.0.1:9 unreachable")
        return await real.fn(team, problem, task, cfg)

    from dataclasses import replace
    ro = replace(ro, workflow=replace(real, fn=flaky))
    eps = ro.collect([PROBLEM, Problem(id="q", question="What is 1 + 1?", answer="2")], 2, progress=False)
    assert [ep.error is None for ep in eps] == [True, True, False, False]
    assert "ConnectionError: tool at http://127.0.0.1:9 unreachable" in eps[2].error
    assert len(eps[2].steps) == 1  # the call made before the failure is kept
    with pytest.raises(RuntimeError, match="all 2 episodes failed") as err:
        ro.collect([Problem(id="q", question="x", answer="2")], 2, progress=False)
    assert isinstance(err.value.__cause__, ConnectionError)


def test_per_agent_reward_credits_each_verdict_against_the_answer_it_judged(tokenizer):
    from teamrl.config.sections import AlgoConfig
    from teamrl.scoring import score_steps

    cfg = MathTeamConfig(max_loops=3, reward="per_agent")
    # episode: solver 4 (wrong), verifier no (right); solver 5 (right), verifier yes (right)
    ro, _ = _rollout(tokenizer, {"solver": ["4", "5"], "verifier": ["no", "yes"]}, cfg)
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    assert [(s.agent, s.agent_call) for s in ep.steps] == [("solver", 0), ("verifier", 0), ("solver", 1), ("verifier", 1)]
    assert ep.reward == 1.0 and ep.step_rewards == {1: 1.0, 3: 1.0}
    steps = score_steps([ep], AlgoConfig(estimator="drmas"))
    assert [s.reward for s in steps] == [1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("replies,final_reward,verdict_rewards", [
    ({"solver": ["4"], "verifier": ["yes"]}, 0.0, {1: 0.0}),  # approved a wrong answer
    ({"solver": ["5"], "verifier": ["no"]}, 1.0, {1: 0.0}),  # rejected a right answer
    ({"solver": ["4"], "verifier": ["no"]}, 0.0, {1: 1.0}),  # rejected a wrong answer
    ({"solver": ["5"], "verifier": ["maybe"]}, 1.0, {1: 0.0}),  # no verdict is never right
])
def test_per_agent_verifier_reward_cases(tokenizer, replies, final_reward, verdict_rewards):
    from teamrl.config.sections import AlgoConfig
    from teamrl.scoring import score_steps

    ro, _ = _rollout(tokenizer, replies, MathTeamConfig(max_loops=1, reward="per_agent"))
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    assert ep.reward == final_reward and ep.step_rewards == verdict_rewards
    steps = score_steps([ep], AlgoConfig(estimator="drmas"))
    assert [s.reward for s in steps] == [final_reward, verdict_rewards[1]]  # the solver keeps the team's reward


def test_joint_reward_records_no_step_rewards(tokenizer):
    ro, _ = _rollout(tokenizer, {"solver": ["4", "5"], "verifier": ["no", "yes"]}, MathTeamConfig(max_loops=3))
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    assert ep.step_rewards == {} and ep.reward == 1.0


def test_per_agent_rewards_in_a_group_give_the_verifier_its_own_advantages(tokenizer):
    """Two episodes of one problem: same team reward 0, but one verifier was right and one wrong."""
    from teamrl.config.sections import AlgoConfig
    from teamrl.scoring import score_steps

    ro, _ = _rollout(tokenizer, {"solver": ["4"], "verifier": ["no", "yes"]}, MathTeamConfig(max_loops=1, reward="per_agent"))
    eps = ro.collect([PROBLEM], 2, progress=False)
    steps = score_steps(eps, AlgoConfig(estimator="drmas"))
    verifier = [(s.reward, round(s.advantage, 4)) for s in steps if s.agent == "verifier"]
    # rewards 1 (rejected the wrong 4) and 0 (approved it): mean 0.5, std 0.7071 -> +/-0.7071
    assert sorted(verifier) == [(0.0, -0.7071), (1.0, 0.7071)]
    assert [s.advantage for s in steps if s.agent == "solver"] == [0.0, 0.0]


@pytest.mark.parametrize("workflow", ["single", "math_team"])
def test_answer_prefix_starts_the_solvers_reply_and_close_ends_it(tokenizer, workflow):
    from teamrl.team.workflows import SingleConfig

    cfg = (SingleConfig(answer_prefix="<answer>", answer_close="</answer>") if workflow == "single" else
           MathTeamConfig(max_loops=2, answer_prefix="<answer>", answer_close="</answer>"))
    ro, eng = _rollout(tokenizer, {"solver": ["5"], "verifier": ["yes"]}, cfg, workflow=workflow)
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    solver = ep.steps[0]
    # the model wrote "5" and ended its turn: the recorded text is prefix + "5" + the close
    assert solver.text == "<answer>5</answer>" and solver.valid and ep.reward == 1.0
    assert tokenizer.decode(solver.prompt_ids).endswith("<answer>")  # the prefix is prompt, not trained on
    assert tokenizer.decode(solver.response_ids) == "5"


def test_dr_mas_rounds_leave_the_last_answer_unjudged(tokenizer):
    """verify_last: false with max_loops 2 runs solver, verifier, solver (Dr. MAS's math orchestra)."""
    ro, _ = _rollout(tokenizer, {"solver": ["4", "5"], "verifier": ["no"]}, MathTeamConfig(max_loops=2, verify_last=False))
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    assert [(s.agent, s.agent_call) for s in ep.steps] == [("solver", 0), ("verifier", 0), ("solver", 1)]
    assert ep.final == "5" and ep.reward == 1.0 and ep.info["loops"] == 2
    ro, _ = _rollout(tokenizer, {"solver": ["5"], "verifier": ["yes"]}, MathTeamConfig(max_loops=2, verify_last=False))
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    assert [s.agent for s in ep.steps] == ["solver", "verifier"]  # an approval still ends the episode
