"""The pieces of one turn that the environment workflows share (:mod:`.env_team`, :mod:`.pettingllms_order`).

The ``planner`` and ``tool`` agents and their parsers; the rule that picks the continuing candidate
(:func:`best_index`); PettingLLMs' reward assignment (:func:`at_grpo_rewards`); asking an agent for candidates
(with the tree marks of tree sampling), crediting their Steps, marking the rejected ones; the prompt built from the
state, or the environment's own prompts for the tool and the plan when it has them (:func:`tool_ask`,
:func:`own_plan_prompt`); the sandbox runner of the tool's programs.

Left out: the order in which a team's agents act within a turn (the workflows' drives).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from teamrl.domains.code.code import extract_code
from teamrl.tasks.env import Environment, Turn
from teamrl.team.agents import Parsed, register_agent
from teamrl.team.team import Reply, Team
from teamrl.team.tree import mark_candidates

__all__ = ["SHOWN", "RunProgram", "ToolReport", "at_grpo_rewards", "best_index", "credit", "extract_program",
           "mark_rejected", "no_code", "own_plan_prompt", "parse_plan", "parse_tool", "program_action", "run_program",
           "sample", "state_prompt", "tool_ask", "user"]

SHOWN = 600  # characters of the tool's program and output shown to the plan agent


@register_agent("planner", system_prompt="You solve a puzzle step by step. Read the state and write your next action in the required format.")
def parse_plan(text: str) -> Parsed:
    """Default planner parser: any non-empty reply (workflows pass the environment's action parser)."""
    return Parsed(text.strip(), valid=bool(text.strip()))


@register_agent("tool", system_prompt="You write a short Python program that solves a puzzle and prints the answer.")
def parse_tool(text: str) -> Parsed:
    """A tool reply is valid when it holds a Python code block."""
    code = extract_program(text)
    return Parsed(code, valid=code is not None)


def extract_program(text: str) -> str | None:
    """The program of a tool agent's reply: :func:`teamrl.domains.code.code.extract_code` (its last ```python block, else
    its last bare ``` block), or None.

    >>> extract_program("Here:\\n```python\\nprint(1)\\n```")
    'print(1)\\n'
    >>> extract_program("print(1)") is None
    True
    """
    return extract_code(text)


def best_index(rewards: list[float]) -> int:
    """Index of the candidate the episode continues from: the first of the highest rewards (``numpy.argmax``).

    >>> best_index([0.2, 1.0, 1.0, -1.0])
    1
    """
    return max(range(len(rewards)), key=lambda i: (rewards[i], -i))


def at_grpo_rewards(tool_local: float | None, plan_step: float, plan_acted: bool, *,
                    no_action_reward: float = -2.0) -> tuple[float, float]:
    """The tool's and the plan's reward for one turn as PettingLLMs' code assigns them (AT-GRPO, arXiv 2510.11062).

    PettingLLMs @ a054fb18, ``pettingllms/multi_agent_env/stateful/agents/``: ``tool_agent.py:122-128`` tries the
    tool's action on a copy of the state (−2 when it printed none, on Plan-Path and Sokoban only); ``plan_agent.py:85-88``
    steps the state with the plan's action (−2 when it is empty); after both acted,
    ``trainer/multi_agents_execution_engine.py:760-769`` calls each agent's ``calculate_reward``
    (``tool_agent.py:135-136``, ``plan_agent.py:95-96``), which adds the state's reward after the plan's step.

    Args:
        tool_local: reward of the tool's printed action tried on a copy of the state; None: it printed no action
            (the term is then ``no_action_reward``; PettingLLMs on Sudoku passes its state's reward instead).
        plan_step: the environment's reward for the plan reply's step (the paired reply: same copy of the state).
        plan_acted: whether the plan reply held an action.
        no_action_reward: the term of a reply without an action (PettingLLMs: −2).

    Returns:
        (tool reward, plan reward) = (local + plan_step, (plan_step or no_action_reward) + plan_step).

    >>> at_grpo_rewards(0.5, 1.0, True)       # tool 0.5 + 1.0; plan 1.0 + 1.0
    (1.5, 2.0)
    >>> at_grpo_rewards(None, -1.0, False)    # tool -2 + -1; plan -2 + -1
    (-3.0, -3.0)
    """
    local = no_action_reward if tool_local is None else tool_local
    return local + plan_step, (plan_step if plan_acted else no_action_reward) + plan_step


async def sample(team: Team, agent: str, asks: list[list[dict[str, Any]]], parse: Callable[[str], Parsed],
                 tree: tuple[int, list[int]] | None, prefix: str = "") -> list[Reply]:
    """One reply of ``agent`` to each of ``asks`` (each starting with ``prefix``); under tree sampling their Steps
    are marked with ``tree`` = the episode, ``agent_call`` = the turn and ``parent`` (``tree`` = (turn, the parent
    of each candidate))."""
    replies = list(await asyncio.gather(*(team.ask(agent, m, parse=parse, prefix=prefix) for m in asks)))
    if tree is not None:
        mark_candidates(team, replies, *tree)
    return replies


def credit(team: Team, replies: list[Reply], rewards: list[float]) -> None:
    """Each reply's Step gets its reward (``episode.step_rewards``); a masked agent's reply has no Step."""
    for r, reward in zip(replies, rewards):
        if r.step >= 0:
            team.episode.step_rewards[r.step] = reward


def mark_rejected(team: Team, replies: list[Reply], stepped: list[Turn]) -> None:
    """A reply whose action the environment rejected (``info["invalid"]``) is an invalid Step: the format
    penalty applies, as to a reply without an action."""
    for r, t in zip(replies, stepped):
        if r.step >= 0 and t.info.get("invalid"):
            team.episode.steps[r.step].valid = False


def user(text: str) -> list[dict[str, Any]]:
    """One user message."""
    return [{"role": "user", "content": text}]


def state_prompt(obs: str, feedback: str, turn: int, env: Environment) -> str:
    """The state as the agents see it: the observation, the last action's feedback, the turn and the action format."""
    fb = f"\nLast action: {feedback}" if feedback else ""
    return f"{obs}{fb}\nTurn {turn + 1} of {env.max_turns}. {env.action_format}"


@dataclass(frozen=True)
class ToolReport:
    """What a tool candidate hands the plan agent: its program, what the program printed and the action found in
    that output (None: none)."""

    program: str
    output: str
    action: Any | None


# Optional members of an environment that writes its own team prompts (PettingLLMs' Sokoban does):
# ``tool_prompt(turn) -> str``, ``plan_prompt(turn, report: ToolReport | None) -> str`` (the whole user message
# of each agent) and ``parse_program_output(text) -> action or None`` (the action a tool program printed, when
# the environment reads it differently from a reply).


def tool_ask(env: Environment, view: str, turn: int) -> str:
    """The tool agent's prompt: the environment's own (``tool_prompt``), else the state and what to write."""
    own = getattr(env, "tool_prompt", None)
    if callable(own):
        return str(own(turn))
    return f"{view}\nWrite a Python program that computes this action and prints it in that format."


def own_plan_prompt(env: Environment, turn: int, report: ToolReport | None) -> str | None:
    """The environment's own plan prompt reading ``report`` (``plan_prompt``), or None when it has none."""
    own = getattr(env, "plan_prompt", None)
    return str(own(turn, report)) if callable(own) else None


def program_action(env: Environment, output: str) -> Any | None:
    """The action a tool program printed: the environment's ``parse_program_output``, else its ``parse_action``."""
    parse = getattr(env, "parse_program_output", None)
    return parse(output) if callable(parse) else env.parse_action(output)


RunProgram = Callable[[str, float], Awaitable[str]]


async def run_program(code: str, seconds: float) -> str:
    """Run a model-written program in the sandbox; returns what it printed, or its verdict when it failed.

    Runs go through the rollout's :class:`~teamrl.domains.code.code_exec.RunRound`: those asked between two generation
    batches run at once and come back in the order asked, so the next generation requests (and the sampled
    tokens) do not depend on how long programs take; a seed reproduces a run and resume is exact.
    """
    from teamrl.domains.code.code_exec import run_round

    return await run_round().program(code, seconds)


async def no_code() -> str:
    """What the plan agent is shown for a tool reply without a program (nothing runs)."""
    return "[no program] the reply held no ```python block"
