"""The workflow registry: workflows by name, each with the config class of its options.

A workflow module registers itself on import with :func:`register_workflow`; this module imports
no workflow, so registering makes no import cycle. :func:`load_builtin_workflows` imports the core's
(``workflows``, ``tree``) and every plug-in's (:mod:`teamrl.plugins`: the domains' ``search_team``,
``code_team``, ``code_tree``, ``code_pair``, ``env_team``, ``games``, ..., and ``agent_program``) when a
workflow is looked up or a config is validated.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from teamrl.plugins import load_plugins
from teamrl.suggest import did_you_mean

if TYPE_CHECKING:
    from teamrl.tasks.base import Problem, Task
    from teamrl.team.records import Episode
    from teamrl.team.team import Team

__all__ = ["WORKFLOWS", "Capabilities", "Counterfactual", "Workflow", "WorkflowSpec", "get_workflow", "load_builtin_workflows",
           "register_workflow", "workflow_configs"]

Workflow = Callable[["Team", "Problem", "Task", Any], Awaitable["str | None"]]
Counterfactual = Callable[["Team", "Problem", "Task", Any, "Episode", frozenset[str]], Awaitable["str | None"]]
"""``async def f(team, problem, task, cfg, episode, coalition) -> str | None``: the team's final answer
had only the agents in ``coalition`` taken part in ``episode`` (docs/credit.md). ``team`` masks the
other agents with their neutral replies; any ``team.ask`` it makes is extra generation (counted)."""

_CORE_WORKFLOW_MODULES: tuple[str, ...] = ("teamrl.team.workflows", "teamrl.team.tree")
"""The workflows of the core (the domains' and the agent-program workflow are plug-ins: :mod:`teamrl.plugins`)."""


@dataclass(frozen=True)
class Capabilities:
    """What a workflow does with given options, which the scoring stages and the config's rules read
    (:meth:`WorkflowSpec.capabilities`, the one place they are read)."""

    workflow: str = ""
    """The workflow's registered name."""
    tree_sampling: bool = False
    """It samples K candidates per turn from one state and continues from one of them (AT-GRPO's tree sampling)."""
    needs_environment: bool = False
    """It drives an environment task (:class:`~teamrl.tasks.env.EnvTask`)."""
    per_step_rewards: bool = False
    """It records a reward per step (``Episode.step_rewards``), which take precedence over per-agent rewards."""
    search_tree: bool = False
    """Its steps are the nodes of a search tree (``Step.tree``, ``Step.parent``; ``math_tree``, ``code_tree``)."""


@dataclass(frozen=True)
class WorkflowSpec:
    fn: Workflow
    config_cls: type
    """The dataclass of the workflow's options (``workflow.<name>`` in a config file)."""
    agents: tuple[str, ...]
    """Agents the workflow calls; each must be mapped to a model in the team config."""
    counterfactual: Counterfactual | None = None
    """How the workflow evaluates a coalition for Shapley credit (``algo.shapley.counterfactual:
    workflow``); None: only ``rerun`` is available."""
    neutral: dict[str, str] = field(default_factory=dict)
    """Neutral reply standing in for a masked agent (agents not listed: the empty reply)."""
    calls: Callable[[Any, Any], int] | None = None
    """The most calls each agent makes per problem, from the workflow's options and the task's (``calls(options,
    task_options)``); the memory plan sizes a step's update with it. None: not declared (the plan assumes 1 and
    says so)."""
    calls_share_prompt: bool = False
    """Every call of an episode opens with the same prompt (a tree's nodes all start from the problem), so the update
    computes it once per episode; False: each call after the first sees its episode's own state (another agent's reply,
    the environment after a move) and brings a prompt of its own (the memory plan's :func:`teamrl.plan.update_tokens`)."""

    check: Callable[[Any, Any], None] | None = None
    """``check(options, task)``: raises a one-line ValueError when the workflow cannot run on ``task`` with
    ``options`` (a game its random opponent cannot play); the trainer calls it before any model loads."""

    def capabilities(self, name: str, options: Any) -> Capabilities:
        """What the workflow registered as ``name`` does with ``options`` (its options class says it: the
        attributes ``tree_sampling``, ``needs_environment``, ``per_step_rewards`` and ``search_tree``, False when
        absent)."""
        return Capabilities(name, *(bool(getattr(options, key, False))
                                    for key in ("tree_sampling", "needs_environment", "per_step_rewards", "search_tree")))

    def agents_for(self, options: Any) -> tuple[str, ...]:
        """The agents the workflow calls with ``options``: the options' own ``agents`` when they name
        them (a workflow whose team is configurable), else the registered ones."""
        return tuple(getattr(options, "agents", None) or self.agents)


WORKFLOWS: dict[str, WorkflowSpec] = {}


def register_workflow(name: str, *, config: type, agents: tuple[str, ...], counterfactual: Counterfactual | None = None,
                      neutral: dict[str, str] | None = None,
                      calls: Callable[[Any, Any], int] | None = None,
                      calls_share_prompt: bool = False,
                      check: Callable[[Any, Any], None] | None = None) -> Callable[[Workflow], Workflow]:
    """Register ``fn`` under ``name``, with the dataclass of its options and the agents it uses.

    ``counterfactual`` and ``neutral`` define the coalition values of Shapley credit (docs/credit.md). ``calls``:
    the most calls one agent makes per problem, ``calls(options, task_options)`` (the memory plan's update size);
    ``calls_share_prompt``: every call of an episode opens with the same prompt (:attr:`WorkflowSpec.calls_share_prompt`).
    ``check``: :attr:`WorkflowSpec.check`.
    """

    def deco(fn: Workflow) -> Workflow:
        if name in WORKFLOWS:
            raise ValueError(f"workflow {name!r} is already registered")
        WORKFLOWS[name] = WorkflowSpec(fn, config, agents, counterfactual, dict(neutral or {}), calls, calls_share_prompt,
                                      check)
        return fn

    return deco


def load_builtin_workflows() -> None:
    """Import the modules that register the workflows: the core's, then every plug-in's (teamrl's domains and its
    agent-program workflow included, :func:`teamrl.plugins.load_plugins`); idempotent."""
    for module in _CORE_WORKFLOW_MODULES:
        importlib.import_module(module)
    load_plugins("workflows")


def get_workflow(name: str) -> WorkflowSpec:
    """Look up a workflow; unknown names list the registered ones."""
    load_builtin_workflows()
    if name not in WORKFLOWS:
        raise ValueError(f"unknown workflow {name!r}{did_you_mean(name, WORKFLOWS)} "
                         f"(registered: {', '.join(sorted(WORKFLOWS))})")
    return WORKFLOWS[name]


def workflow_configs() -> dict[str, type | None]:
    """The config class of every registered workflow (built-in ones included), by name."""
    load_builtin_workflows()
    return {name: spec.config_cls for name, spec in WORKFLOWS.items()}
