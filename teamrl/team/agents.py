"""Agents are roles: a name, a system prompt and a parser that checks the reply's format.

Users add an agent with one decorator on its parser::

    @register_agent("critic", system_prompt="You point out the first mistake in a solution.")
    def parse_critique(text: str) -> Parsed:
        return Parsed(text.strip(), valid=bool(text.strip()))

The workflow decides what the agent sees (its messages); the agent decides how its reply is read.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from teamrl.suggest import did_you_mean


@dataclass(frozen=True)
class Parsed:
    """A parsed reply: the value the workflow uses and whether the format was followed."""

    value: Any
    valid: bool


@dataclass(frozen=True)
class Agent:
    """A role in a team."""

    name: str
    system_prompt: str
    parse: Callable[[str], Parsed]


AGENTS: dict[str, Agent] = {}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def register_agent(name: str, *, system_prompt: str) -> Callable[[Callable[[str], Parsed]], Callable[[str], Parsed]]:
    """Register an agent whose replies are parsed by the decorated function."""
    if not _NAME.match(name):
        raise ValueError(f"agent name {name!r} must be a plain identifier such as 'solver'")

    def deco(parse: Callable[[str], Parsed]) -> Callable[[str], Parsed]:
        if name in AGENTS:
            raise ValueError(f"agent {name!r} is already registered")
        AGENTS[name] = Agent(name, system_prompt, parse)
        return parse

    return deco


def get_agent(name: str) -> Agent:
    """Look up a registered agent; unknown names list the registered ones."""
    if name not in AGENTS:
        raise ValueError(f"unknown agent {name!r}{did_you_mean(name, AGENTS)} "
                         f"(registered: {', '.join(sorted(AGENTS))})")
    return AGENTS[name]
