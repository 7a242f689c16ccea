"""Workflows that drive an environment turn by turn: a single agent, or AT-GRPO's tool + plan team.

Every turn, the acting agents are asked through ``team.ask`` and the environment steps on the
chosen action; the turn's reward becomes the reward of the Step that chose it
(``episode.step_rewards``), and an action the environment rejects (``info["invalid"]``) makes that
Step invalid (``algo.format_penalty`` applies). The episode ends when the environment is done or after its
``max_turns`` turns; the final text lists the actions taken (:func:`teamrl.tasks.env.actions_text`),
which the environment's task replays to score the episode.

* ``env_single``: one agent (``planner``) sees the observation and writes an action.
* ``env_team``: AT-GRPO's planning team (arXiv 2510.11062). The tool agent writes a small Python
  program that prints an action; the program runs in the sandbox (:mod:`teamrl.sandbox`), never in
  this process. The tool's reward is the environment's reward for that printed action, tried on a
  copy of the state (the environment does not advance). The plan agent then sees the observation,
  the program, its output and the action it printed, and writes the action that steps the
  environment; its reward is that turn's reward.
* ``env_single_tree`` / ``env_team_tree``: the same teams with AT-GRPO's tree-structured sampling.
  At each turn each agent samples ``branch`` candidates from the same state; each candidate is
  tried on its own copy of the state and rewarded; the episode continues from the best candidate
  (the first of the highest rewards, as ``numpy.argmax``). The candidates' Steps share
  ``tree`` (the episode), ``agent_call`` (the turn) and ``parent`` (the step the state came from),
  so the ``at_grpo`` estimator's groups (prompt, tree, agent, turn) are exactly the K candidates of
  one agent at one turn from one state. Differences from the PettingLLMs code: docs/fidelity.md.

Rewards of ``env_team`` (the workflow option ``rewards``):

* ``teamrl`` (default): each agent's Step gets its own step reward once: the tool's printed action on a
  copy of the state, the plan's action on the state; a reply without an action gets the environment's
  penalty (−1 in the shipped environments).
* ``at_grpo``: as PettingLLMs' code assigns them (:func:`at_grpo_rewards`): the tool gets its local
  reward (its action on a copy, ``no_action_reward`` when it printed none) plus the step reward of its
  paired plan reply (a team term); the plan gets its step reward counted twice (``no_action_reward`` +
  the step reward for a reply without an action). Under tree sampling the plan's candidate i reads the
  tool's candidate i (program and output), as each PettingLLMs copy's plan agent reads that copy's tool,
  so every tool candidate has its paired plan reply.

Turn order of ``env_team`` (the workflow option ``turn_order``):

* ``same_turn`` (default, :func:`drive`): the tool acts first and the plan reads its program of the same turn;
  under tree sampling the best plan candidate by the environment's reward continues.
* ``pettingllms`` (:func:`~teamrl.domains.environments.pettingllms_order.drive_pettingllms`): as PettingLLMs' engine,
  both agents reply from the state before the turn (the plan reads the tool's program of the previous turn), then
  both step; under tree sampling the tool's rewards pick the continuing copy and every plan candidate gets that
  copy's plan reward.

Left out: conversation history across turns (each prompt is built from the current state, as in
PettingLLMs), and environments with several players acting against each other.
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from teamrl.domains.environments.env_steps import (
    SHOWN,
    RunProgram,
    ToolReport,
    at_grpo_rewards,
    best_index,
    credit,
    extract_program,
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
from teamrl.domains.environments.pettingllms_order import drive_pettingllms
from teamrl.tasks.base import Problem, Task
from teamrl.tasks.env import Environment, EnvTask, Turn, actions_text
from teamrl.team.agents import Parsed
from teamrl.team.registry import register_workflow
from teamrl.team.team import Reply, Team

__all__ = ["EnvSingleConfig", "EnvTeamConfig", "at_grpo_rewards", "best_index", "env_single", "env_team",
           "extract_program"]


@dataclass(kw_only=True)
class EnvSingleConfig:
    """Options of ``env_single``: the agent that acts."""

    agent: str = "planner"
    """The agent that writes each action."""
    action_prefix: str = ""
    """Text the acting agent's reply starts with, e.g. '#### [' (its tokens join the prompt and are not trained;
    the parsed reply is this text + what the model wrote). Lets a small model that never writes the format
    on its own produce actions; empty: the model writes the whole reply (PettingLLMs)."""
    branch: ClassVar[int] = 1
    tree_sampling: ClassVar[bool] = False
    needs_environment: ClassVar[bool] = True

    @property
    def agents(self) -> tuple[str, ...]:
        return (self.agent,)

    @property
    def per_step_rewards(self) -> bool:
        """Every turn carries its own reward (Shapley credit would not override it)."""
        return True


@dataclass(kw_only=True)
class EnvTeamConfig:
    """Options of ``env_team``: the plan agent, the tool agent and the sandbox limits of its programs."""

    planner: str = "planner"
    """The agent that writes the action stepping the environment."""
    tool: str = "tool"
    """The agent that writes a program printing an action (run in the sandbox)."""
    action_prefix: str = ""
    """Text the plan agent's reply starts with, e.g. '#### [' (see env_single.action_prefix)."""
    program_prefix: str = ""
    """Text the tool agent's reply starts with, e.g. '```python\\n' (its tokens join the prompt and are not trained)."""
    program_seconds: float = 5.0
    """Wall-clock limit of one program run in the sandbox."""
    rewards: Literal["teamrl", "at_grpo"] = "teamrl"
    """Who gets which reward each turn. teamrl: each agent its own step reward once (the tool's printed action on a
    copy of the state, the plan's action on the state; the environment's penalty, -1, without an action). at_grpo:
    as PettingLLMs' code (docs/fidelity.md): the tool gets its action's reward on a copy plus the step reward of
    its paired plan reply (a local and a team term), the plan its step reward twice (no_action_reward + the step
    reward without an action); under tree sampling plan candidate i reads tool candidate i."""
    no_action_reward: float = -2.0
    """rewards: at_grpo: the plan's term for a reply without an action, and the tool's local term when its program
    printed none (PettingLLMs: -2, plan_agent.py:85-86, tool_agent.py:125-126)."""
    tool_no_action_from_env: bool = False
    """rewards: at_grpo: the tool's local term without a printed action is the environment's reward for no action
    instead of no_action_reward (PettingLLMs on Sudoku, where tool_agent.py:125 applies -2 only to Plan-Path and
    Sokoban and its state gives -1)."""
    turn_order: Literal["same_turn", "pettingllms"] = "same_turn"
    """same_turn: the tool acts first and the plan reads the tool's program and output of the same turn (under tree
    sampling the best plan candidate continues). pettingllms: as PettingLLMs' engine (multi_agents_execution_engine.py
    :535-829; docs/fidelity.md): both reply from the state before the turn, so the plan reads the tool's program of
    the previous turn (none at the first), then both step; under tree sampling the tool's rewards pick the copy that
    continues, every plan candidate gets that copy's plan reward, and the plan replies of a turn that ends the
    episode are not trained on."""
    branch: ClassVar[int] = 1
    tree_sampling: ClassVar[bool] = False
    needs_environment: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.planner == self.tool:
            raise ValueError(f"planner and tool are both {self.planner!r}; name two different agents")
        if self.program_seconds <= 0:
            raise ValueError(f"program_seconds {self.program_seconds} must be > 0")
        if self.rewards not in ("teamrl", "at_grpo"):
            raise ValueError(f"rewards {self.rewards!r} is not one of teamrl, at_grpo")
        if self.turn_order not in ("same_turn", "pettingllms"):
            raise ValueError(f"turn_order {self.turn_order!r} is not one of same_turn, pettingllms")

    @property
    def agents(self) -> tuple[str, ...]:
        return (self.tool, self.planner)

    @property
    def per_step_rewards(self) -> bool:
        return True


def _check_branch(branch: int) -> None:
    if branch < 2:
        raise ValueError(f"branch {branch} must be >= 2 (candidates per agent per turn); use the workflow without "
                         f"_tree for one sample per turn")


@dataclass(kw_only=True)
class EnvSingleTreeConfig(EnvSingleConfig):
    branch: int = 4  # type: ignore[misc]
    """Candidates each agent samples per turn from the same state (AT-GRPO's K)."""
    tree_sampling: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check_branch(self.branch)


@dataclass(kw_only=True)
class EnvTeamTreeConfig(EnvTeamConfig):
    branch: int = 4  # type: ignore[misc]
    """Candidates each agent samples per turn from the same state (AT-GRPO's K)."""
    tree_sampling: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_branch(self.branch)


def _env_of(task: Task) -> Environment:
    if not isinstance(task, EnvTask):
        raise ValueError(f"this workflow drives an environment, but task {task.name!r} is not one; "
                         f"pick an environment task (e.g. task.name: plan_path)")
    return task.make_env()


async def drive(team: Team, problem: Problem, env: Environment, *, planner: str, tool: str | None, branch: int,
                tree: bool, program_seconds: float = 5.0, runner: RunProgram = run_program,
                action_prefix: str = "", program_prefix: str = "", rewards: str = "teamrl",
                no_action_reward: float = -2.0, tool_no_action_from_env: bool = False) -> str:
    """Run one episode of ``env`` on ``problem``; returns the final text (the actions taken).

    With ``tool``, each turn the tool agent's program runs first (see the module docstring).
    ``branch`` candidates per agent per turn (1 without tree sampling). ``action_prefix`` and
    ``program_prefix`` start the planner's and the tool's replies (:meth:`Team.ask`'s ``prefix``).
    ``rewards``, ``no_action_reward``, ``tool_no_action_from_env``: :class:`EnvTeamConfig`.
    """
    obs, feedback, actions, parent, turns = env.reset(problem), "", [], -1, 0
    act = lambda text: Parsed(env.parse_action(text), valid=env.parse_action(text) is not None)  # noqa: E731
    for turn in range(env.max_turns):
        view = state_prompt(obs, feedback, turn, env)
        views, parents, tool_turn = [view] * branch, [parent] * branch, None
        if tool is not None:
            tool_turn = await _tool_turn(team, env, tool, tool_ask(env, view, turn), branch,
                                         (turn, parents) if tree else None, program_seconds, runner, program_prefix)
            views, parents = _plan_views(env, turn, view, tool_turn, paired=rewards == "at_grpo")
            parents = parents if tree else [parent] * branch
        replies = await sample(team, planner, [user(v) for v in views], act, (turn, parents) if tree else None,
                               action_prefix)
        copies = [copy.deepcopy(env) for _ in replies] if len(replies) > 1 else [env]
        stepped: list[Turn] = [c.step(r.value if r.valid else None) for c, r in zip(copies, replies)]
        mark_rejected(team, replies, stepped)
        plan_rewards = [t.reward for t in stepped]
        if tool_turn is not None and rewards == "at_grpo":
            pairs = [at_grpo_rewards(_local(tool_turn, j, tool_no_action_from_env), t.reward, r.valid,
                                     no_action_reward=no_action_reward)
                     for j, (t, r) in enumerate(zip(stepped, replies))]
            credit(team, tool_turn.replies, [p[0] for p in pairs])
            plan_rewards = [p[1] for p in pairs]
        credit(team, replies, plan_rewards)
        i = best_index([t.reward for t in stepped])  # the environment's reward picks the continuing copy
        env, obs, parent, turns = copies[i], stepped[i].observation, replies[i].step if tree else parent, turn + 1
        feedback = str(stepped[i].info.get("message", ""))
        actions.append(replies[i].value if replies[i].valid else None)
        if stepped[i].done:
            break
    team.episode.info.update(turns=turns, success=bool(env.success))
    return actions_text(actions)


@dataclass
class _ToolTurn:
    """The tool's candidates of one turn: replies, what their programs printed, the action each printed (None:
    none) and the turn each action gives on a copy of the state."""

    replies: list[Reply]
    outputs: list[str]
    actions: list[Any | None]
    tried: list[Turn]


async def _tool_turn(team: Team, env: Environment, tool: str, ask: str, branch: int, tree: tuple[int, list[int]] | None,
                     program_seconds: float, runner: RunProgram, program_prefix: str) -> _ToolTurn:
    """The tool's ``branch`` programs, run in the sandbox, each printed action tried on a copy of the state.

    Under ``rewards: teamrl`` each candidate is credited here with its own action's reward; ``at_grpo`` credits
    the tool again once the paired plan replies have stepped (:func:`at_grpo_rewards`)."""
    replies = await sample(team, tool, [user(ask)] * branch, parse_tool, tree, program_prefix)
    outputs = list(await asyncio.gather(*(runner(r.value, program_seconds) if r.value else no_code()
                                          for r in replies)))
    actions = [program_action(env, out) for out in outputs]
    tried = [copy.deepcopy(env).step(a) for a in actions]
    credit(team, replies, [t.reward for t in tried])
    return _ToolTurn(replies, outputs, actions, tried)


def _plan_views(env: Environment, turn: int, view: str, tt: _ToolTurn, *, paired: bool) -> tuple[list[str], list[int]]:
    """The plan candidates' prompts and tree parents: each reads the best tool candidate (teamrl), or candidate i
    reads tool candidate i (``paired``, PettingLLMs' copies); the environment's own plan prompt when it has one."""
    n = len(tt.replies)
    shown = range(n) if paired else [best_index([t.reward for t in tt.tried])] * n
    views = []
    for i in shown:
        own = own_plan_prompt(env, turn, ToolReport(tt.replies[i].value or "", tt.outputs[i], tt.actions[i]))
        views.append(view + _helper(tt, i) if own is None else own)
    return views, [tt.replies[i].step for i in shown]


def _helper(tt: _ToolTurn, i: int) -> str:
    code = (tt.replies[i].value or "")[:SHOWN]
    return (f"\nA helper program:\n```python\n{code}```\nIt printed: {tt.outputs[i][:SHOWN]!r}"
            f"\nCheck it and write your own action.")


def _local(tt: _ToolTurn, i: int, from_env: bool) -> float | None:
    """The tool candidate's local term for :func:`at_grpo_rewards`: its action's reward on a copy, None when it
    printed no action (unless ``from_env``: then the environment's reward for no action)."""
    return tt.tried[i].reward if tt.actions[i] is not None or from_env else None


async def env_single(team: Team, problem: Problem, task: Task, cfg: EnvSingleConfig) -> str | None:
    """One agent acts in the environment every turn."""
    return await drive(team, problem, _env_of(task), planner=cfg.agent, tool=None, branch=cfg.branch,
                       tree=cfg.tree_sampling, action_prefix=cfg.action_prefix)


async def env_team(team: Team, problem: Problem, task: Task, cfg: EnvTeamConfig) -> str | None:
    """AT-GRPO's tool + plan team acts in the environment every turn, in ``cfg.turn_order``."""
    run = drive_pettingllms if cfg.turn_order == "pettingllms" else drive
    return await run(team, problem, _env_of(task), planner=cfg.planner, tool=cfg.tool, branch=cfg.branch,
                       tree=cfg.tree_sampling, program_seconds=cfg.program_seconds,
                       action_prefix=cfg.action_prefix, program_prefix=cfg.program_prefix, rewards=cfg.rewards,
                       no_action_reward=cfg.no_action_reward, tool_no_action_from_env=cfg.tool_no_action_from_env)


_CALLS = (lambda o, t: t.max_turns * o.branch)  # noqa: E731  (per agent: a call per turn, ``branch`` in a tree)
register_workflow("env_single", config=EnvSingleConfig, agents=("planner",), calls=_CALLS)(env_single)
register_workflow("env_team", config=EnvTeamConfig, agents=("tool", "planner"), calls=_CALLS)(env_team)
register_workflow("env_single_tree", config=EnvSingleTreeConfig, agents=("planner",), calls=_CALLS)(env_single)
register_workflow("env_team_tree", config=EnvTeamTreeConfig, agents=("tool", "planner"),
                  calls=_CALLS)(env_team)
