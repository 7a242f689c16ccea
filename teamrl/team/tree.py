"""The ``math_tree`` workflow: agents take turns expanding a search tree over one problem (MARS2).

MARS2 (https://arxiv.org/abs/2602.07848) trains several agents inside one shared search tree.
Here, for a math problem:

  * the root is the problem; a node is one agent's candidate solution (one ``team.ask``, so one
    Step of the agent that expanded it);
  * a child refines its parent from the parent's failure feedback: the parent's reply is shown
    with "this answer (X) is wrong" (for math the feedback is the wrong answer itself);
  * nodes are expanded breadth first: the oldest failed node not deeper than ``max_depth - 1``
    gets ``branching`` children, generated concurrently, until ``max_nodes`` nodes exist, no
    failed node is left to refine, or (``stop_on_success``) a node is correct;
  * which agent writes each child: ``round_robin`` (node k by ``agents[k % n]``) or ``bandit``,
    Thompson sampling over agents with a Beta(prior_alpha, prior_beta) prior updated by each of
    the agent's nodes in this tree (success = the node's answer is correct), as in MARS2.

Every node's Step carries ``tree`` (the episode index), ``parent`` (the parent node's step index,
-1 for the root) and ``depth``; the ``tree`` advantage scope (estimator ``tree``) then groups all
nodes of one tree, across agents and depths. With ``reward: node`` each node is rewarded by its
own answer's correctness; the episode's answer is the first correct node's (else the last node's).

The machinery (:func:`grow_tree`, :class:`AgentPicker`, :func:`best_node`) is shared with ``code_tree``
(``code_tree.py``: the same tree on code, each refinement shown its parent's execution feedback).

Node rewards are shaped along parent and sibling links, when configured, in the scoring (``algo.reward_alloc``,
:func:`teamrl.algos.credit.shape_tree_rewards`), not here.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from teamrl.tasks.base import Problem, Task, safe_score
from teamrl.team.agents import Parsed, register_agent
from teamrl.team.registry import register_workflow
from teamrl.team.team import Reply, Team


@register_agent(
    "refiner",
    system_prompt="You are a careful math solver. When an earlier attempt is marked wrong, find its mistake and solve the problem again. State the final answer.",
)
def parse_refinement(text: str) -> Parsed:
    """Default refiner parser: any non-empty reply is valid (the workflow passes a task-aware parser)."""
    return Parsed(text.strip(), valid=bool(text.strip()))


@dataclass(kw_only=True)
class TreeConfig:
    """A search tree's shape, expansion policy and reward (shared by ``math_tree`` and ``code_tree``)."""

    search_tree: ClassVar[bool] = True
    """Its steps are a search tree's nodes (``Step.tree``, ``Step.parent``): MARTI's reward shaping applies."""

    agents: list[str] = field(default_factory=lambda: ["solver", "refiner"])
    """Agents that expand the tree (each must be in the team's agents); the order is the round-robin order."""
    max_nodes: int = 6
    """Most nodes (LLM calls) per tree."""
    max_depth: int = 3
    """Deepest node; 1 = only children of the root (independent attempts, no refinement)."""
    branching: int = 2
    """Children generated, concurrently, each time a node is expanded."""
    expansion: Literal["bandit", "round_robin"] = "bandit"
    """Who writes each child. bandit: Thompson sampling over agents, Beta(prior_alpha, prior_beta) prior
    updated with each agent's node successes in this tree (MARS2). round_robin: node k by agents[k % n]."""
    prior_alpha: float = 1.0
    """Beta prior pseudo-successes of every agent (bandit expansion)."""
    prior_beta: float = 1.0
    """Beta prior pseudo-failures of every agent (bandit expansion)."""
    stop_on_success: bool = True
    """Stop expanding once a node is correct."""
    reward: Literal["node", "tree"] = "node"
    """node: each node's step is rewarded by its own answer's correctness (MARS2's node reward).
    tree: every node gets the episode's reward (some node of the tree is correct)."""
    seed: int = 0
    """Seed of the bandit's draws (combined with the problem id and the episode index)."""

    def __post_init__(self) -> None:
        if not self.agents:
            raise ValueError("agents is empty; name the agents that expand the tree, e.g. [solver, refiner]")
        if len(set(self.agents)) != len(self.agents):
            raise ValueError(f"agents {self.agents} lists an agent twice")
        for key in ("max_nodes", "max_depth", "branching"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} {getattr(self, key)} must be >= 1")
        if self.prior_alpha <= 0 or self.prior_beta <= 0:
            raise ValueError(f"prior_alpha {self.prior_alpha} and prior_beta {self.prior_beta} must be > 0 "
                             f"(Beta(1, 1) is the uniform prior)")
        if self.expansion == "round_robin" and (self.prior_alpha, self.prior_beta) != (1.0, 1.0):
            raise ValueError("prior_alpha and prior_beta are the bandit's prior; expansion: round_robin ignores them "
                             "(use expansion: bandit or remove them)")

    @property
    def per_step_rewards(self) -> bool:
        """Whether episodes carry per-step rewards (which Shapley credit would not override)."""
        return self.reward == "node"


@dataclass(kw_only=True)
class MathTreeConfig(TreeConfig):
    """Options of ``math_tree``: the tree's (:class:`TreeConfig`)."""


class AgentPicker:
    """Chooses the agent of each new node: round robin, or Thompson sampling on Beta posteriors.

    >>> p = AgentPicker(["a", "b"], "round_robin", rng=random.Random(0))
    >>> [p.pick() for _ in range(3)]
    ['a', 'b', 'a']
    """

    def __init__(self, agents: list[str], policy: str, *, rng: random.Random, alpha: float = 1.0,
                 beta: float = 1.0) -> None:
        self.agents, self.policy, self.rng = agents, policy, rng
        self.wins = {a: alpha for a in agents}
        self.losses = {a: beta for a in agents}
        self.picked = 0

    def pick(self) -> str:
        self.picked += 1
        if self.policy == "round_robin":
            return self.agents[(self.picked - 1) % len(self.agents)]
        draws = {a: self.rng.betavariate(self.wins[a], self.losses[a]) for a in self.agents}
        return max(self.agents, key=lambda a: draws[a])

    def update(self, agent: str, success: bool) -> None:
        if success:
            self.wins[agent] += 1
        else:
            self.losses[agent] += 1


@dataclass(frozen=True)
class TreeNode:
    """One node of a search tree: who wrote it, their reply, its score and what its children are shown."""

    agent: str
    reply: Reply
    score: float
    """The node's reward."""
    solved: bool
    """Whether the node solved the problem (then it is not refined, and the bandit counts a success)."""
    depth: int
    """1 = a child of the root."""
    feedback: str
    """The user turn a child of this node sees after the node's reply (why it failed and what to do)."""


Evaluate = Callable[[list[Reply]], list[tuple[float, bool, str]] | Awaitable[list[tuple[float, bool, str]]]]
"""Judges a batch of sibling replies: ``(score, solved, feedback for a child)`` per reply, in order (or a
coroutine returning them)."""


async def grow_tree(team: Team, cfg: TreeConfig, *, seed: str, ask: list[dict[str, str]],
                    parse: Callable[[str], Parsed], evaluate: Evaluate) -> list[TreeNode]:
    """Expand one tree breadth first (see the module docstring) and record every node's Step.

    Args:
        team: the episode's team; each node is one ``team.ask``.
        cfg: the tree's shape, expansion policy and reward mode (``reward: node`` sets ``step_rewards``).
        seed: seed of the bandit's draws.
        ask: the root's messages (the problem); a child sees them, its parent's reply and the parent's feedback.
        parse: the agents' reply parser (format validity).
        evaluate: scores each batch of siblings and says what their children would be shown.

    Returns:
        The nodes in creation order (the order of their Steps).
    """
    picker = AgentPicker(cfg.agents, cfg.expansion, rng=random.Random(seed), alpha=cfg.prior_alpha, beta=cfg.prior_beta)
    frontier: list[tuple[int, int, TreeNode | None]] = [(-1, 0, None)]  # (parent step, parent depth, parent node)
    nodes: list[TreeNode] = []
    while frontier and len(nodes) < cfg.max_nodes:
        parent, depth, node = frontier.pop(0)
        messages = ask if node is None else [*ask, {"role": "assistant", "content": node.reply.text},
                                             {"role": "user", "content": node.feedback}]
        agents = [picker.pick() for _ in range(min(cfg.branching, cfg.max_nodes - len(nodes)))]
        children = await asyncio.gather(*(team.ask(a, messages, parse=parse) for a in agents))
        judged = evaluate(list(children))
        if inspect.isawaitable(judged):
            judged = await judged
        for agent, child, (score, solved, feedback) in zip(agents, children, judged):
            picker.update(agent, solved)
            nodes.append(TreeNode(agent, child, score, solved, depth + 1, feedback))
            if child.step >= 0:  # -1: a masked agent's neutral reply (counterfactual rerun), no Step
                step = team.episode.steps[child.step]
                step.tree, step.parent, step.depth = team.episode.index, parent, depth + 1
                if cfg.reward == "node":
                    team.episode.step_rewards[child.step] = score
            if not solved and depth + 1 < cfg.max_depth:
                frontier.append((child.step, depth + 1, nodes[-1]))
        if cfg.stop_on_success and any(n.solved for n in nodes):
            break
    return nodes


def best_node(team: Team, nodes: list[TreeNode], agents: list[str]) -> TreeNode:
    """The episode's answer node (the first that succeeded, else the last) after recording the tree's info."""
    team.episode.info.update(nodes=len(nodes), depth=max(n.depth for n in nodes), solved=any(n.solved for n in nodes),
                             agents={a: sum(n.agent == a for n in nodes) for a in agents})
    return next((n for n in nodes if n.solved), nodes[-1])


def _feedback(parent: Reply, task: Task) -> str:
    """What a child sees about its failed parent (for math: the wrong answer)."""
    said = f"its final answer {parent.value} is wrong" if parent.value is not None else "it gives no final answer"
    return f"This attempt is wrong: {said}. Find the mistake and solve the problem again.\n{task.answer_format}"


async def math_tree(team: Team, problem: Problem, task: Task, cfg: MathTreeConfig) -> str | None:
    """Expand a search tree of candidate solutions over ``problem``; returns the best node's answer."""

    def parse(text: str) -> Parsed:
        ans = task.extract_answer(text)
        return Parsed(ans, valid=ans is not None)

    def evaluate(replies: list[Reply]) -> list[tuple[float, bool, str]]:
        scores = [safe_score(task, problem, r.text) for r in replies]  # a grader error scores 0, never ends the run
        return [(s, s > 0, _feedback(r, task)) for s, r in zip(scores, replies)]

    nodes = await grow_tree(team, cfg, seed=f"{cfg.seed}:{problem.id}:{team.episode.index}",
                            ask=[{"role": "user", "content": f"{problem.question}\n{task.answer_format}"}],
                            parse=parse, evaluate=evaluate)
    return best_node(team, nodes, cfg.agents).reply.text


def tree_calls(options: TreeConfig, task_options: object) -> int:
    """A tree's calls per agent for the memory plan: its ``max_nodes`` spread over its agents (its workflows declare
    ``calls_share_prompt``: every node opens with the problem, which the update computes once per tree).

    >>> tree_calls(TreeConfig(max_nodes=6, agents=["solver", "refiner"]), None), tree_calls(TreeConfig(max_nodes=5), None)
    (3, 3)
    """
    return -(-options.max_nodes // max(1, len(options.agents)))


register_workflow("math_tree", config=MathTreeConfig, agents=("solver", "refiner"), neutral={},
                  calls=tree_calls, calls_share_prompt=True)(math_tree)


def mark_candidates(team: Team, replies: list[Reply], turn: int, parents: list[int]) -> None:
    """Mark the Steps of one turn's candidates (AT-GRPO's tree sampling): ``tree`` = the episode, ``agent_call`` = the
    turn, ``parent`` = the step each candidate's state came from, ``depth`` = turn + 1; the ``at_grpo`` estimator's
    groups (prompt, tree, agent, turn) are then one agent's candidates of that turn."""
    for r, parent in zip(replies, parents):
        if r.step >= 0:
            s = team.episode.steps[r.step]
            s.tree, s.agent_call, s.parent, s.depth = team.episode.index, turn, parent, turn + 1
