"""PettingLLMs' turn order for AT-GRPO's tool + plan team (``workflow.env_team.turn_order: pettingllms``).

PettingLLMs' engine (pettingllms-ai/PettingLLMs @ a054fb18, ``pettingllms/trainer/multi_agents_execution_engine.py``;
line numbers below are that file's) runs one turn in three phases:

1. **Every reply from the state before the turn.** Each agent's ``update_from_env`` builds its prompt from the
   state and its reply is generated, the tool agent's, then the plan agent's (``turn_order`` tool, plan:
   ``config/stateful/stateful_L1_prompt.yaml:56-58``), before anyone steps (tree sampling: :535-546, :716-724;
   one sample per problem: :256-265, :364-370). The plan agent reads the tool's program, its output and its action
   from the state (``multi_agent_env/stateful/agents/plan_agent.py:60-62``), which the tool writes when it steps
   (``agents/tool_agent.py:115-120``): the previous turn's tool, empty at the first turn
   (``stateful/env_state.py:17-20``).
2. **Steps in turn order** (:727-758; :373-404): the tool's program runs and its action is tried on a copy of the
   state (``tool_agent.py:122-128``); the plan's action steps the state (``plan_agent.py:79-92``).
3. **Rewards** (:760-829; :406-459): each agent's ``calculate_reward`` adds the state's reward after both steps
   (``tool_agent.py:135-136``, ``plan_agent.py:95-96``; with ``rewards: at_grpo``,
   :func:`~teamrl.domains.environments.env_steps.at_grpo_rewards`).

Under tree sampling the episode holds K copies of one state, and candidate i of each agent acts on copy i. Phase 3
runs agent by agent in turn order, and after each agent every copy becomes a copy of the one where that agent's
reward is highest (``np.argmax``, :801-826). So:

* the tool's rewards pick the copy that continues (its candidate i's reward includes plan candidate i's step);
* the plan agent's rewards are then read from the agents of that copy: all K plan candidates get the reward of the
  plan candidate on the continuing copy (their AT-GRPO group holds K equal rewards, so zero advantages);
* when the continuing copy is done, the loop stops before the plan agent's rewards (:828-829), so the plan
  candidates of the last turn are not trained on (here their Steps are dropped from the episode).

With one sample per problem (``env_team``), both agents' rewards are assigned and the episode ends when the state is
done (:461-475). The other order, ``same_turn`` (teamrl's default), is
:func:`~teamrl.domains.environments.env_team.drive`.
"""

from __future__ import annotations

import asyncio
import copy

from teamrl.domains.environments.env_steps import (
    SHOWN,
    RunProgram,
    ToolReport,
    at_grpo_rewards,
    best_index,
    credit,
    mark_rejected,
    no_code,
    own_plan_prompt,
    parse_tool,
    program_action,
    run_program,
    sample,
    state_prompt,
    tool_ask,
    user,
)
from teamrl.tasks.base import Problem
from teamrl.tasks.env import Environment, Turn, actions_text
from teamrl.team.agents import Parsed
from teamrl.team.team import Reply, Team

__all__ = ["drive_pettingllms", "plan_rewards_by_tool"]


def plan_rewards_by_tool(tool_rewards: list[float], plan_rewards: list[float]) -> tuple[int, list[float]]:
    """The continuing copy (the first of the tool's highest rewards) and the reward each plan candidate gets: that
    copy's plan reward, K times (PettingLLMs re-selects the copies after the tool's rewards, engine :801-826).

    >>> plan_rewards_by_tool([3.0, -1.0], [4.0, 2.0])
    (0, [4.0, 4.0])
    """
    i = best_index(tool_rewards)
    return i, [plan_rewards[i]] * len(plan_rewards)


async def drive_pettingllms(team: Team, problem: Problem, env: Environment, *, planner: str, tool: str, branch: int,
                            tree: bool, program_seconds: float = 5.0, runner: RunProgram = run_program,
                            action_prefix: str = "", program_prefix: str = "", rewards: str = "teamrl",
                            no_action_reward: float = -2.0, tool_no_action_from_env: bool = False) -> str:
    """Run one episode of the tool + plan team in PettingLLMs' turn order (module docstring); returns the actions.

    Arguments as :func:`~teamrl.domains.environments.env_team.drive`. The tool's ``branch`` candidates are asked
    first, then the plan's (PettingLLMs' sequential mode, ``parallel: false``), both from the state before the turn.
    """
    obs, feedback, actions, parent, turns = env.reset(problem), "", [], -1, 0
    act = lambda text: Parsed(env.parse_action(text), valid=env.parse_action(text) is not None)  # noqa: E731
    report: ToolReport | None = None  # the continuing copy's tool output, from the previous turn
    for turn in range(env.max_turns):
        view = state_prompt(obs, feedback, turn, env)
        marks = (turn, [parent] * branch) if tree else None  # every candidate starts from the same state
        tools = await sample(team, tool, [user(tool_ask(env, view, turn))] * branch, parse_tool, marks, program_prefix)
        plans = await sample(team, planner, [user(_plan_ask(env, view, turn, report))] * branch, act, marks,
                             action_prefix)
        reports = await _run_tools(env, tools, program_seconds, runner)
        tried = [copy.deepcopy(env).step(r.action) for r in reports]  # each tool's action on a copy of its copy
        copies = [copy.deepcopy(env) for _ in plans] if branch > 1 else [env]
        stepped: list[Turn] = [c.step(r.value if r.valid else None) for c, r in zip(copies, plans)]
        mark_rejected(team, plans, stepped)
        tool_rewards, plan_rewards = _rewards(reports, tried, stepped, plans, rewards, no_action_reward,
                                              tool_no_action_from_env)
        credit(team, tools, tool_rewards)
        i, plan_rewards = plan_rewards_by_tool(tool_rewards, plan_rewards)
        if tree and stepped[i].done:  # the engine stops before the plan's rewards (:828-829): not trained on
            _drop(team, plans)
        else:
            credit(team, plans, plan_rewards)
        env, obs, report, turns = copies[i], stepped[i].observation, reports[i], turn + 1
        parent = plans[i].step if tree else parent
        feedback = str(stepped[i].info.get("message", ""))
        actions.append(plans[i].value if plans[i].valid else None)
        if stepped[i].done:
            break
    team.episode.info.update(turns=turns, success=bool(env.success))
    return actions_text(actions)


def _plan_ask(env: Environment, view: str, turn: int, report: ToolReport | None) -> str:
    """The plan's prompt: the environment's own, else the state and the tool's program of the last turn with what it
    printed (none at turn 0)."""
    own = own_plan_prompt(env, turn, report)
    if own is not None:
        return own
    if report is None:
        return view
    return (f"{view}\nThe tool agent's program of the last turn:\n```python\n{report.program[:SHOWN]}```\n"
            f"It printed: {report.output[:SHOWN]!r}\nCheck it and write your own action.")


async def _run_tools(env: Environment, tools: list[Reply], seconds: float, runner: RunProgram) -> list[ToolReport]:
    """Each tool candidate's program run in the sandbox (together, in the order asked) and the action it printed."""
    outputs = list(await asyncio.gather(*(runner(r.value, seconds) if r.value else no_code() for r in tools)))
    return [ToolReport(r.value or "", out, program_action(env, out)) for r, out in zip(tools, outputs)]


def _rewards(reports: list[ToolReport], tried: list[Turn], stepped: list[Turn], plans: list[Reply], rewards: str,
             no_action_reward: float, from_env: bool) -> tuple[list[float], list[float]]:
    """Candidate i's tool and plan rewards on copy i: their own step rewards (``teamrl``), or PettingLLMs'
    assignment (``at_grpo``: the tool's local term + the plan's step, the plan's step twice)."""
    if rewards != "at_grpo":
        return [t.reward for t in tried], [s.reward for s in stepped]
    pairs = [at_grpo_rewards(t.reward if r.action is not None or from_env else None, s.reward, p.valid,
                             no_action_reward=no_action_reward)
             for r, t, s, p in zip(reports, tried, stepped, plans)]
    return [a for a, _ in pairs], [b for _, b in pairs]


def _drop(team: Team, plans: list[Reply]) -> None:
    """Remove this turn's plan Steps from the episode (the last Steps: the plan is asked after the tool)."""
    steps = sorted(r.step for r in plans if r.step >= 0)
    if steps:
        assert steps == list(range(len(team.episode.steps) - len(steps), len(team.episode.steps)))
        del team.episode.steps[steps[0]:]
