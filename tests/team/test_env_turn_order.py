"""PettingLLMs' turn order of the tool + plan team (``turn_order: pettingllms``), hand-worked on count_to."""

from __future__ import annotations

import pytest
import torch

from teamrl.config.sections import AlgoConfig
from teamrl.domains.environments.env_team import EnvTeamConfig, EnvTeamTreeConfig, drive
from teamrl.domains.environments.pettingllms_order import drive_pettingllms, plan_rewards_by_tool
from teamrl.engines.base import SamplingParams
from teamrl.scoring import score_steps
from teamrl.tasks.base import build_task
from teamrl.tasks.env import actions_text
from teamrl.team.agents import get_agent
from teamrl.team.records import Episode
from teamrl.team.team import AgentBinding, Dispatcher, Team
from teamrl.team.workflows import get_workflow
from teamrl.train.rollout import Rollout
from tests.team.test_env_team import CycleEngine, _echo

TOOL_PLUS_1 = "```python\nprint('#### [1]')\n```"
TOOL_PLUS_2 = "```python\nprint('#### [2]')\n```"


def _run(tokenizer, replies: list[str], *, max_turns: int, branch: int, tree: bool, task: str = "count_to",
         problem: int = 0, task_opts: dict | None = None, order=drive_pettingllms, **options):
    """One episode of ``task`` (count_to: target 3) in PettingLLMs' order; the engine answers ``replies`` in the order
    asked (each turn: the ``branch`` tool candidates, then the ``branch`` plan candidates)."""
    async def runner(code: str, seconds: float) -> str:
        return _echo(code)

    eng = CycleEngine(tokenizer, replies)
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    bindings = {a: AgentBinding(get_agent(a), "m", sp, get_agent(a).system_prompt) for a in ("tool", "planner")}
    env_task = build_task(task, {"n_train": problem + 1, "n_test": 1, "max_turns": max_turns, **(task_opts or {})})
    ep = Episode(prompt_index=0, index=0, problem_id="p")
    dispatcher = Dispatcher({"m": eng})
    team = Team(bindings, dispatcher, ep)
    final = dispatcher.run([order(team, env_task.problems("train")[problem], env_task.make_env(), planner="planner",
                                  tool="tool", branch=branch, tree=tree, runner=runner, **options)])[0]
    return ep, eng, final


def test_the_plan_reads_the_tools_program_of_the_previous_turn(tokenizer):
    """One sample, two turns; the tool prints +2, the plan adds 1.

    turn 0 from 0: both asked from count 0 (the plan sees no program); tool +2 on a copy -> local 2; plan +1 -> 1
    turn 1 from 1: the plan sees turn 0's program and its output; tool local 2 (1 + 2 = 3); plan +1 -> 2
    at_grpo: tool 2 + 1 = 3, plan 1 + 1 = 2 each turn (as same_turn: the rewards do not depend on the order here).
    """
    ep, eng, final = _run(tokenizer, [TOOL_PLUS_2, "#### [1]"], max_turns=2, branch=1, tree=False, rewards="at_grpo")
    assert [s.agent for s in ep.steps] == ["tool", "planner"] * 2
    assert ep.step_rewards == {0: 3.0, 1: 2.0, 2: 3.0, 3: 2.0}
    tool0, plan0, tool1, plan1 = eng.prompts
    assert "count 0 of 3" in plan0 and "program" not in plan0  # turn 0: nothing from the tool yet
    assert "count 1" in plan1 and "It printed: '#### [2]'" in plan1 and "print('#### [2]')" in plan1
    assert "program of the last turn" in plan1 and "count 1" in tool1
    assert final == actions_text([1, 1]) and ep.info == {"turns": 2, "success": False}


def test_tree_sampling_continues_from_the_tools_best_copy_and_gives_every_plan_its_reward(tokenizer):
    """K = 2, two turns; each turn asks tool 0, tool 1, plan 0, plan 1 (candidate i acts on copy i).

    turn 0 from 0: tool 0 prints +1 (local 1), tool 1 has no program (local -2); plan 0 +2 (r 2), plan 1 +1 (r 1)
      at_grpo: tool (1 + 2, -2 + 1) = (3, -1); plan (2 + 2, 1 + 1) = (4, 2); the tool's best is copy 0 (count 2),
      so both plan candidates get copy 0's 4
    turn 1 from 2: tool 0 +1 (local 1), tool 1 -2; plan 0 +2 (count 4 > 3: r -1), plan 1 +1 (count 3: r 1, done)
      tool (1 - 1, -2 + 1) = (0, -1): copy 0 continues (count 4, not done) though copy 1 finished;
      plan (-1 - 1, 1 + 1) = (-2, 2) -> both -2
    at_grpo groups (tree, agent, turn): tool [3, -1] and [0, -1] -> +-0.70711; plan [4, 4] and [-2, -2] -> 0.
    """
    replies = [TOOL_PLUS_1, "no code", "#### [2]", "#### [1]"]
    ep, eng, final = _run(tokenizer, replies, max_turns=2, branch=2, tree=True, rewards="at_grpo")
    assert [s.agent for s in ep.steps] == ["tool", "tool", "planner", "planner"] * 2
    assert ep.step_rewards == {0: 3.0, 1: -1.0, 2: 4.0, 3: 4.0, 4: 0.0, 5: -1.0, 6: -2.0, 7: -2.0}
    assert [s.agent_call for s in ep.steps] == [0] * 4 + [1] * 4
    assert [s.parent for s in ep.steps] == [-1] * 4 + [2] * 4  # turn 1 starts from copy 0 (plan candidate 0)
    assert all("It printed: '#### [1]'" in p for p in eng.prompts[6:8])  # copy 0's tool output of turn 0
    assert final == actions_text([2, 2]) and ep.reward == 0.0 and ep.info["success"] is False
    steps = score_steps([ep], AlgoConfig(estimator="at_grpo"))
    assert torch.allclose(torch.tensor([s.advantage for s in steps]),
                          torch.tensor([0.70711, -0.70711, 0.0, 0.0, 0.70711, -0.70711, 0.0, 0.0]), atol=1e-5)


def test_the_plan_replies_of_a_turn_that_ends_the_episode_are_not_trained_on(tokenizer):
    """K = 2, one turn: tool 0 +1 (local 1), tool 1 none (-2); plan 0 +3 (count 3: r 3, done), plan 1 +1 (r 1).
    tool (1 + 3, -2 + 1) = (4, -1): copy 0 continues and is done, so the engine stops before the plan's rewards."""
    ep, _, final = _run(tokenizer, [TOOL_PLUS_1, "no code", "#### [3]", "#### [1]"], max_turns=2, branch=2,
                        tree=True, rewards="at_grpo")
    assert [s.agent for s in ep.steps] == ["tool", "tool"] and ep.step_rewards == {0: 4.0, 1: -1.0}
    assert final == actions_text([3]) and ep.info == {"turns": 1, "success": True}
    # one sample per problem: the last turn's plan reply keeps its reward (engine :406-475)
    ep, _, _ = _run(tokenizer, [TOOL_PLUS_1, "#### [3]"], max_turns=2, branch=1, tree=False, rewards="at_grpo")
    assert ep.step_rewards == {0: 4.0, 1: 6.0}


def test_teamrl_rewards_in_pettingllms_order(tokenizer):
    """rewards: teamrl: each agent its own step reward; the tool's (1, -1: count_to's penalty without an action)
    still pick copy 0, so both plans get copy 0's 2."""
    ep, _, _ = _run(tokenizer, [TOOL_PLUS_1, "no code", "#### [2]", "#### [1]"], max_turns=1, branch=2, tree=True)
    assert ep.step_rewards == {0: 1.0, 1: -1.0, 2: 2.0, 3: 2.0}


def test_pettingllms_sokoban_in_pettingllms_order_by_hand(tokenizer):
    """PettingLLMs' Sokoban, seed 2 (player (1, 2), box (2, 2), goal (4, 3)), one sample, two turns, at_grpo; the
    tool prints D D L D R (its prompt and output format are PettingLLMs'), the plan writes #### ["D", "D"].

    turn 0: the tool's solution on a copy: 11.255 (tests/tasks/test_sokoban_pettingllms.py); plan D D: 0.092 +
      0.091 = 0.183 => tool 11.255 + 0.183 = 11.438, plan 2 x 0.183 = 0.366
    turn 1 from player (3, 2), box (4, 2); the plan reads turn 0's program, output and action:
      tool: D, D push against the wall: 2 x (-0.05 + 0.1 * (0.99 * -1 + 1)) = -0.098; L, D: 2 x -0.009; R onto the
      goal and the win: 11.09 => 10.974; plan D D: -0.098 => tool 10.974 - 0.098 = 10.876, plan -0.196
    """
    solution = "```python\nprint('**Actions List**: [\"D\", \"D\", \"L\", \"D\", \"R\"]')\n```"
    ep, eng, final = _run(tokenizer, [solution, '#### ["D", "D"]'], max_turns=2, branch=1, tree=False,
                          task="sokoban", problem=2, task_opts={"variant": "pettingllms", "size": 6},
                          rewards="at_grpo")
    assert [s.agent for s in ep.steps] == ["tool", "planner"] * 2
    assert ep.step_rewards == pytest.approx({0: 11.438, 1: 0.366, 2: 10.876, 3: -0.196})
    tool0, plan0, tool1, plan1 = eng.prompts
    assert "**Actions List**" in tool0 and "Here is code agent's code: .\n" in plan0  # turn 0: no tool yet
    assert "Here is code agent's action: [].\n" in plan0
    assert "Here is code agent's action: ['D', 'D', 'L', 'D', 'R']." in plan1 and "print('**Actions List**" in plan1
    assert final == actions_text([["D", "D"], ["D", "D"]])
    # same_turn: the environment's plan prompt reads the tool's program of the same turn
    _, eng, _ = _run(tokenizer, [solution, '#### ["D", "D"]'], max_turns=1, branch=1, tree=False, task="sokoban",
                     problem=2, task_opts={"variant": "pettingllms", "size": 6}, order=drive)
    assert "Here is code agent's action: ['D', 'D', 'L', 'D', 'R']." in eng.prompts[1]


def test_plan_rewards_by_tool_takes_the_first_of_the_tools_best():
    assert plan_rewards_by_tool([0.0, 1.0, 1.0], [5.0, 6.0, 7.0]) == (1, [6.0, 6.0, 6.0])
    assert plan_rewards_by_tool([-1.0], [2.0]) == (0, [2.0])


def test_the_workflow_option_selects_the_order(tokenizer):
    """env_team_tree with turn_order: pettingllms runs through the rollout as drive_pettingllms does (no programs, so
    no sandbox: both tools -1, copy 0 continues, its plan reached 3, the plan replies are dropped)."""
    eng = CycleEngine(tokenizer, ["no code", "no code", "#### [3]", "#### [1]"])
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    bindings = {a: AgentBinding(get_agent(a), "m", sp, get_agent(a).system_prompt) for a in ("tool", "planner")}
    task = build_task("count_to", {"n_train": 1, "n_test": 1, "max_turns": 2})
    cfg = EnvTeamTreeConfig(branch=2, turn_order="pettingllms", program_seconds=5.0)
    ro = Rollout(Dispatcher({"m": eng}), bindings, get_workflow("env_team_tree"), cfg, task)
    (ep,) = ro.collect(task.problems("train")[:1], 1, progress=False)
    assert [s.agent for s in ep.steps] == ["tool", "tool"] and ep.step_rewards == {0: -1.0, 1: -1.0}
    assert "count 0 of 3" in eng.prompts[2] and "program" not in eng.prompts[2]


def test_an_unknown_turn_order_is_refused():
    with pytest.raises(ValueError, match="turn_order 'tool_first' is not one of same_turn, pettingllms"):
        EnvTeamConfig(turn_order="tool_first")  # type: ignore[arg-type]
