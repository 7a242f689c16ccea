"""Environment workflows on a hand-made environment: turn limit, per-turn rewards, no leaks, AT-GRPO's tree sampling."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
import torch

from teamrl.config.sections import AlgoConfig
from teamrl.domains.environments.env_team import (
    EnvSingleConfig,
    EnvSingleTreeConfig,
    EnvTeamConfig,
    at_grpo_rewards,
    best_index,
    drive,
)
from teamrl.engines.base import GenOutput, GenRequest, SamplingParams
from teamrl.scoring import score_steps
from teamrl.tasks.base import Problem, build_task
from teamrl.tasks.env import ENVS, EnvConfig, Turn, actions_text, register_env
from teamrl.team.agents import get_agent
from teamrl.team.records import Episode
from teamrl.team.team import AgentBinding, Dispatcher, Team
from teamrl.team.workflows import get_workflow
from teamrl.train.rollout import Rollout
from tests.scripted import ScriptedEngineBase


@dataclass(kw_only=True)
class CountConfig(EnvConfig):
    target: int = 3


class CountTo:
    """Reach ``target`` by adding numbers: reward = the step when it stays <= target, else -1; an
    unparseable reply costs -1. Done at ``target``."""

    action_format = "End with #### [k] to add k."

    def __init__(self, cfg: CountConfig) -> None:
        self.target, self.max_turns, self.n = cfg.target, cfg.max_turns, 0

    def reset(self, problem: Problem) -> str:
        self.n = 0
        return f"count {self.n} of {self.target} (seed {problem.meta['seed'] % 7})"

    def parse_action(self, text: str) -> int | None:
        m = re.search(r"####\s*\[(-?\d+)\]", text)
        return int(m.group(1)) if m else None

    def step(self, action: int | None) -> Turn:
        if action is None:
            return Turn(f"count {self.n}", -1.0, False, {"message": "no number", "invalid": True})
        self.n += action
        reward = float(action) if self.n <= self.target else -1.0
        return Turn(f"count {self.n}", reward, self.n == self.target, {"message": f"now {self.n}"})

    @property
    def success(self) -> bool:
        return self.n == self.target


if "count_to" not in ENVS:
    register_env("count_to", config=CountConfig)(CountTo)


class CycleEngine(ScriptedEngineBase):
    """Answers each request with the next reply of ``replies`` (cycling); records the prompts."""

    def __init__(self, tokenizer, replies: list[str]):
        super().__init__(tokenizer)
        self.replies, self.prompts, self.calls = replies, [], 0

    def generate(self, requests: list[GenRequest], on_progress=None) -> list[GenOutput]:
        outs = []
        for r in requests:
            self.prompts.append(self.tokenizer.decode(r.prompt_ids))
            text = self.replies[self.calls % len(self.replies)]
            self.calls += 1
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            outs.append(GenOutput(ids, [-0.5] * len(ids), text, "stop"))
        return outs


def rollout(tokenizer, workflow: str, cfg, replies: list[str], agents=("planner",), **task_opts) -> tuple[Rollout, CycleEngine]:
    eng = CycleEngine(tokenizer, replies)
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    bindings = {a: AgentBinding(get_agent(a), "m", sp, get_agent(a).system_prompt) for a in agents}
    task = build_task("count_to", {"n_train": 4, "n_test": 2, **task_opts})
    return Rollout(Dispatcher({"m": eng}), bindings, get_workflow(workflow), cfg, task), eng


def test_turn_limit_stops_an_unfinished_episode(tokenizer):
    ro, _ = rollout(tokenizer, "env_single", EnvSingleConfig(), ["#### [0]"], max_turns=3)
    (ep,) = ro.collect(ro.task.problems("train")[:1], 1, progress=False)
    assert len(ep.steps) == 3 and ep.info == {"turns": 3, "success": False}
    assert ep.final == actions_text([0, 0, 0]) and ep.reward == 0.0


def test_each_turn_reward_is_its_steps_reward(tokenizer):
    # +1 (reward 1), no number (-1), +2 (reward 2, reaches 3: done)
    ro, _ = rollout(tokenizer, "env_single", EnvSingleConfig(), ["#### [1]", "hmm", "#### [2]"], max_turns=5)
    (ep,) = ro.collect(ro.task.problems("train")[:1], 1, progress=False)
    assert ep.step_rewards == {0: 1.0, 1: -1.0, 2: 2.0}
    assert [s.valid for s in ep.steps] == [True, False, True]
    assert ep.reward == 1.0 and ep.info["turns"] == 3  # the replayed actions [1, None, 2] reach 3
    steps = score_steps([ep], AlgoConfig(estimator="agent_turn"))
    assert [s.reward for s in steps] == [1.0, -1.0, 2.0]


def test_episodes_do_not_share_state(tokenizer):
    # two episodes of one problem run concurrently; each counts on its own environment
    ro, _ = rollout(tokenizer, "env_single", EnvSingleConfig(), ["#### [1]"], max_turns=5)
    eps = ro.collect(ro.task.problems("train")[:1], 2, progress=False)
    for ep in eps:
        assert len(ep.steps) == 3 and ep.final == actions_text([1, 1, 1]) and ep.reward == 1.0


def test_best_index_breaks_ties_by_the_first():
    assert best_index([0.0, 1.0, 1.0]) == 1
    assert best_index([-1.0, -1.0]) == 0


def test_tree_sampling_candidates_groups_and_advantages_by_hand(tokenizer):
    """K = 3 candidates per turn from one state; the episode goes on from the best.

    turn 0 from 0: +1 (r 1), +2 (r 2), none (r -1) -> best +2, count 2
    turn 1 from 2: +1 (r 1, done), +2 (count 4 > 3: r -1), none (r -1) -> best +1, done
    at_grpo groups (tree, agent, turn): [1, 2, -1] and [1, -1, -1]
      group 0: mean 2/3, unbiased var (1/9 + 16/9 + 25/9)/2 = 7/3 -> (1/3, 4/3, -5/3)/1.52753
      group 1: mean -1/3, var (16/9 + 4/9 + 4/9)/2 = 4/3 -> (4/3, -2/3, -2/3)/1.15470
    """
    ro, _ = rollout(tokenizer, "env_single_tree", EnvSingleTreeConfig(branch=3), ["#### [1]", "#### [2]", "no"],
                    max_turns=5)
    (ep,) = ro.collect(ro.task.problems("train")[:1], 1, progress=False)
    assert [s.agent_call for s in ep.steps] == [0, 0, 0, 1, 1, 1]
    assert [s.tree for s in ep.steps] == [ep.index] * 6
    assert [s.parent for s in ep.steps] == [-1, -1, -1, 1, 1, 1]  # turn 1 continues from candidate 1 (+2)
    assert ep.step_rewards == {0: 1.0, 1: 2.0, 2: -1.0, 3: 1.0, 4: -1.0, 5: -1.0}
    assert ep.final == actions_text([2, 1]) and ep.reward == 1.0
    steps = score_steps([ep], AlgoConfig(estimator="at_grpo"))
    expected = [1 / 3 / 1.527525, 4 / 3 / 1.527525, -5 / 3 / 1.527525, 4 / 3 / 1.154701, -2 / 3 / 1.154701,
                -2 / 3 / 1.154701]
    assert torch.allclose(torch.tensor([s.advantage for s in steps]), torch.tensor(expected), atol=1e-5)


def test_team_workflow_shows_the_tool_output_and_credits_the_tool(tokenizer):
    """The tool's program output is tried on a copy (the state does not move); the planner steps it."""
    ran: list[str] = []

    async def runner(code: str, seconds: float) -> str:  # records the program instead of running it
        ran.append(code)
        return "#### [2]"

    eng = CycleEngine(tokenizer, ["```python\nprint('#### [2]')\n```", "#### [3]"])
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    bindings = {a: AgentBinding(get_agent(a), "m", sp, get_agent(a).system_prompt) for a in ("tool", "planner")}
    task = build_task("count_to", {"n_train": 1, "n_test": 1, "max_turns": 2})
    ep = Episode(prompt_index=0, index=0, problem_id="p")
    dispatcher = Dispatcher({"m": eng})
    team = Team(bindings, dispatcher, ep)
    final = dispatcher.run([drive(team, task.problems("train")[0], task.make_env(), planner="planner",
                                              tool="tool", branch=1, tree=False, runner=runner)])[0]
    assert ran == ["print('#### [2]')\n"]
    assert [s.agent for s in ep.steps] == ["tool", "planner"]
    assert ep.step_rewards == {0: 2.0, 1: 3.0}  # the tool's +2 on a copy; the planner's +3 reaches 3
    assert "It printed: '#### [2]'" in eng.prompts[1] and final == actions_text([3])


def test_action_and_program_prefixes_start_the_replies_and_stay_out_of_training(tokenizer):
    """The prefix ends the prompt (its tokens are not trained); the parsed text is prefix + the model's reply."""
    ran: list[str] = []

    async def runner(code: str, seconds: float) -> str:
        ran.append(code)
        return "#### [1]"

    eng = CycleEngine(tokenizer, ["print('#### [1]')\n```", "2]"])  # the model writes only what follows each prefix
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    bindings = {a: AgentBinding(get_agent(a), "m", sp, get_agent(a).system_prompt) for a in ("tool", "planner")}
    task = build_task("count_to", {"n_train": 1, "n_test": 1, "max_turns": 1})
    ep = Episode(prompt_index=0, index=0, problem_id="p")
    dispatcher = Dispatcher({"m": eng})
    team = Team(bindings, dispatcher, ep)
    final = dispatcher.run([drive(team, task.problems("train")[0], task.make_env(), planner="planner", tool="tool",
                                  branch=1, tree=False, runner=runner, action_prefix="#### [",
                                  program_prefix="```python\n")])[0]
    assert ran == ["print('#### [1]')\n"] and final == actions_text([2])
    assert eng.prompts[0].endswith("```python\n") and eng.prompts[1].endswith("#### [")
    tool, plan = ep.steps
    assert plan.text == "#### [2]" and plan.valid and ep.step_rewards == {0: 1.0, 1: 2.0}
    assert tokenizer.decode(plan.response_ids) == "2]"  # only the model's own tokens are trained on
    assert tokenizer.decode(plan.prompt_ids).endswith("#### [")


def test_env_single_passes_its_action_prefix(tokenizer):
    ro, eng = rollout(tokenizer, "env_single", EnvSingleConfig(action_prefix="#### ["), ["1]"], max_turns=3)
    (ep,) = ro.collect(ro.task.problems("train")[:1], 1, progress=False)
    assert ep.final == actions_text([1, 1, 1]) and ep.reward == 1.0
    assert all(p.endswith("#### [") for p in eng.prompts)


def test_non_environment_task_is_refused(tokenizer):
    from teamrl.domains.math.arith import ArithConfig, ArithTask
    eng = CycleEngine(tokenizer, ["x"])
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    bindings = {"planner": AgentBinding(get_agent("planner"), "m", sp, "")}
    ro = Rollout(Dispatcher({"m": eng}), bindings, get_workflow("env_single"), EnvSingleConfig(), ArithTask(ArithConfig()))
    with pytest.raises(RuntimeError, match="task 'arith' is not one; pick an environment task"):
        ro.collect([Problem(id="a", question="1+1", answer="2")], 1, progress=False)


def test_team_config_rejects_one_agent_for_both_roles():
    with pytest.raises(ValueError, match="two different agents"):
        EnvTeamConfig(planner="x", tool="x")
    with pytest.raises(ValueError, match="branch"):
        EnvSingleTreeConfig(branch=1)


def test_tool_program_runs_in_the_sandbox(tokenizer):
    """The tool's program runs under the sandbox (not here): its printed action is tried and credited."""
    from teamrl import sandbox

    try:
        sandbox.default_sandbox()
    except sandbox.SandboxUnavailable as exc:
        pytest.skip(f"no sandbox on this machine: {exc}")
    program = "import os\nprint('#### [' + str(1 + 1) + ']', os.getpid())\n"  # pid 1-ish: its own PID namespace
    eng = CycleEngine(tokenizer, [f"```python\n{program}```", "#### [3]"])
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    bindings = {a: AgentBinding(get_agent(a), "m", sp, get_agent(a).system_prompt) for a in ("tool", "planner")}
    task = build_task("count_to", {"n_train": 1, "n_test": 1, "max_turns": 1})
    ep = Episode(prompt_index=0, index=0, problem_id="p")
    dispatcher = Dispatcher({"m": eng})
    team = Team(bindings, dispatcher, ep)
    dispatcher.run([drive(team, task.problems("train")[0], task.make_env(), planner="planner", tool="tool",
                          branch=1, tree=False)])
    assert ep.step_rewards[0] == 2.0
    printed = re.search(r"It printed: '#### \[2\] (\d+)", eng.prompts[1])
    assert printed is not None and int(printed.group(1)) != __import__("os").getpid()


def _echo(code: str) -> str:
    """What ``print('...')`` in ``code`` prints (the tests' stand-in for the sandbox)."""
    m = re.search(r"print\('(.*)'\)", code)
    return m.group(1) if m else ""


def _team_run(tokenizer, replies: list[str], *, max_turns: int, branch: int, tree: bool, **options):
    async def runner(code: str, seconds: float) -> str:
        return _echo(code)

    eng = CycleEngine(tokenizer, replies)
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    bindings = {a: AgentBinding(get_agent(a), "m", sp, get_agent(a).system_prompt) for a in ("tool", "planner")}
    task = build_task("count_to", {"n_train": 1, "n_test": 1, "max_turns": max_turns})
    ep = Episode(prompt_index=0, index=0, problem_id="p")
    dispatcher = Dispatcher({"m": eng})
    team = Team(bindings, dispatcher, ep)
    dispatcher.run([drive(team, task.problems("train")[0], task.make_env(), planner="planner", tool="tool",
                          branch=branch, tree=tree, runner=runner, **options)])
    return ep, eng


def test_at_grpo_rewards_by_hand():
    # tool: local + the paired plan's step reward; plan: its step reward twice (-2 + it without an action)
    assert at_grpo_rewards(2.0, 1.0, True) == (3.0, 2.0)
    assert at_grpo_rewards(None, -1.0, False) == (-3.0, -3.0)
    assert at_grpo_rewards(-1.0, 0.5, True, no_action_reward=-5.0) == (-0.5, 1.0)
    assert at_grpo_rewards(None, 0.5, True, no_action_reward=-5.0) == (-4.5, 1.0)


def test_at_grpo_reward_assignment_in_the_team_turn_by_turn(tokenizer):
    """count_to (target 3), the tool prints +2, the plan adds 1, two turns.

    turn 0 from 0: tool +2 on a copy -> local 2; plan +1 -> 1, r 1   => tool 2 + 1 = 3, plan 1 + 1 = 2
    turn 1 from 1: tool +2 on a copy -> local 2 (3 <= 3); plan +1 -> 2, r 1 => tool 3, plan 2
    teamrl: each its own step reward once: tool 2, plan 1 every turn.
    """
    replies = ["```python\nprint('#### [2]')\n```", "#### [1]"]
    ep, _ = _team_run(tokenizer, replies, max_turns=2, branch=1, tree=False, rewards="at_grpo")
    assert [s.agent for s in ep.steps] == ["tool", "planner"] * 2
    assert ep.step_rewards == {0: 3.0, 1: 2.0, 2: 3.0, 3: 2.0}
    ep, _ = _team_run(tokenizer, replies, max_turns=2, branch=1, tree=False)
    assert ep.step_rewards == {0: 2.0, 1: 1.0, 2: 2.0, 3: 1.0}


def test_at_grpo_rewards_without_actions(tokenizer):
    """No program and no plan action: tool -2 + the plan's step reward (-1: count_to's penalty), plan -2 + -1;
    with tool_no_action_from_env the tool's local term is the environment's -1 instead (PettingLLMs on Sudoku)."""
    ep, _ = _team_run(tokenizer, ["no code", "hmm"], max_turns=1, branch=1, tree=False, rewards="at_grpo")
    assert ep.step_rewards == {0: -3.0, 1: -3.0}
    ep, _ = _team_run(tokenizer, ["no code", "hmm"], max_turns=1, branch=1, tree=False, rewards="at_grpo",
                      tool_no_action_from_env=True)
    assert ep.step_rewards == {0: -2.0, 1: -3.0}
    ep, _ = _team_run(tokenizer, ["no code", "hmm"], max_turns=1, branch=1, tree=False)  # teamrl: -1 each
    assert ep.step_rewards == {0: -1.0, 1: -1.0}


def test_at_grpo_pairs_tool_and_plan_candidates_under_tree_sampling(tokenizer):
    """K = 2, one turn. Tool 0 prints +1 (local 1), tool 1 has no program (local -2).
    Plan 0 reads tool 0 and adds 2 (r 2); plan 1 reads tool 1 and adds 1 (r 1).
    at_grpo: tool (1 + 2, -2 + 1) = (3, -1); plan (2 + 2, 1 + 1) = (4, 2).
    at_grpo groups: tool [3, -1]: mean 1, unbiased std 2*sqrt(2) -> +-0.70711; plan [4, 2] -> +-0.70711.
    teamrl: both plans read the best tool (0); tool (1, -1), plan (2, 1).
    """
    replies = ["```python\nprint('#### [1]')\n```", "no code", "#### [2]", "#### [1]"]
    ep, eng = _team_run(tokenizer, replies, max_turns=1, branch=2, tree=True, rewards="at_grpo")
    assert [s.agent for s in ep.steps] == ["tool", "tool", "planner", "planner"]
    assert ep.step_rewards == {0: 3.0, 1: -1.0, 2: 4.0, 3: 2.0}
    assert [s.parent for s in ep.steps] == [-1, -1, 0, 1]  # plan candidate i continues tool candidate i
    assert "It printed: '#### [1]'" in eng.prompts[2] and "[no program]" in eng.prompts[3]
    steps = score_steps([ep], AlgoConfig(estimator="at_grpo"))
    assert torch.allclose(torch.tensor([s.advantage for s in steps]),
                          torch.tensor([0.70711, -0.70711, 0.70711, -0.70711]), atol=1e-5)
    ep, eng = _team_run(tokenizer, replies, max_turns=1, branch=2, tree=True)
    assert ep.step_rewards == {0: 1.0, 1: -1.0, 2: 2.0, 3: 1.0}
    assert [s.parent for s in ep.steps] == [-1, -1, 0, 0]
    assert all("It printed: '#### [1]'" in p for p in eng.prompts[2:])


def test_team_config_rejects_an_unknown_reward_assignment():
    with pytest.raises(ValueError, match="rewards 'pettingllms' is not one of teamrl, at_grpo"):
        EnvTeamConfig(rewards="pettingllms")  # type: ignore[arg-type]
