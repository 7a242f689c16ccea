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

Left out: MARS2's path-level reward shaping along parent/child/sibling links, and code tasks
(their failure feedback would be the failing check's output).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Literal

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
class MathTreeConfig:
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


def _feedback(parent: Reply, task: Task) -> str:
    """What a child sees about its failed parent (for math: the wrong answer)."""
    said = f"its final answer {parent.value} is wrong" if parent.value is not None else "it gives no final answer"
    return f"This attempt is wrong: {said}. Find the mistake and solve the problem again.\n{task.answer_format}"


async def math_tree(team: Team, problem: Problem, task: Task, cfg: MathTreeConfig) -> str | None:
    """Expand a search tree of candidate solutions over ``problem``; returns the best node's answer."""
    seed = f"{cfg.seed}:{problem.id}:{team.episode.index}"
    picker = AgentPicker(cfg.agents, cfg.expansion, rng=random.Random(seed), alpha=cfg.prior_alpha, beta=cfg.prior_beta)
    ask = [{"role": "user", "content": f"{problem.question}\n{task.answer_format}"}]

    def parse(text: str) -> Parsed:
        ans = task.extract_answer(text)
        return Parsed(ans, valid=ans is not None)

    frontier: list[tuple[int, int, Reply | None]] = [(-1, 0, None)]  # (parent step, parent depth, parent reply)
    nodes: list[tuple[str, Reply, float, int]] = []  # (agent, reply, score, depth)
    while frontier and len(nodes) < cfg.max_nodes:
        parent, depth, reply = frontier.pop(0)
        messages = ask if reply is None else [*ask, {"role": "assistant", "content": reply.text},
                                              {"role": "user", "content": _feedback(reply, task)}]
        agents = [picker.pick() for _ in range(min(cfg.branching, cfg.max_nodes - len(nodes)))]
        children = await asyncio.gather(*(team.ask(a, messages, parse=parse) for a in agents))
        for agent, child in zip(agents, children):
            score = safe_score(task, problem, child.text)
            picker.update(agent, score > 0)
            nodes.append((agent, child, score, depth + 1))
            if child.step >= 0:  # -1: a masked agent's neutral reply (counterfactual rerun), no Step
                step = team.episode.steps[child.step]
                step.tree, step.parent, step.depth = team.episode.index, parent, depth + 1
                if cfg.reward == "node":
                    team.episode.step_rewards[child.step] = score
            if score <= 0 and depth + 1 < cfg.max_depth:
                frontier.append((child.step, depth + 1, child))
        if cfg.stop_on_success and any(n[2] > 0 for n in nodes):
            break
    best = next((n[1] for n in nodes if n[2] > 0), nodes[-1][1])
    team.episode.info.update(nodes=len(nodes), depth=max(n[3] for n in nodes), solved=any(n[2] > 0 for n in nodes),
                             agents={a: sum(n[0] == a for n in nodes) for a in cfg.agents})
    return best.text


register_workflow("math_tree", config=MathTreeConfig, agents=("solver", "refiner"), neutral={})(math_tree)
