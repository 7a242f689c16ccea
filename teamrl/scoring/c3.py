"""C3's credit as stages (``algo.estimator: c3`` on a ``rollout.prefix_tree`` rollout; docs/c3.md).

* :class:`NodeReturns` (a ``rewards`` stage, first of all): each tree node's reward becomes the mean of the
  credited rewards of the leaves below it (an episode's leaf is its last call);
* :class:`~teamrl.scoring.advantages.C3Advantages` (the ``advantages`` stage of the ``branch`` scope): the return minus its siblings'
  leave-one-out mean (``center: mean``: their mean), z-scored among the siblings with the population variance and
  ``algo.eps`` inside the square root (``scale: none``: not z-scored); a node without siblings gets 0;
* :func:`tree_metrics`: C3's diagnostics of any estimator's advantages on a prefix-tree rollout, logged every
  step: ``c3/credit_fidelity`` (Spearman of the trained advantage of each candidate against its counterfactual
  effect, the subtree-mean return minus its siblings' mean), ``c3/credit_var`` (the variance of C3's leave-one-out
  credit among siblings), ``c3/influence_mi`` (nats: how much the next call's reply depends on which sibling came
  before it), each also per agent, with the groups' count and size and the advantages' mean and spread.

The formulas are :mod:`teamrl.algos.c3`'s, transcribed from EIT-EAST-Lab/C3 @ 628185b.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import torch

from teamrl.algos import c3 as c3_lib
from teamrl.scoring.advantages import C3Advantages
from teamrl.scoring.rewards import RewardTerm, credit
from teamrl.scoring.stages import Context, register_stage
from teamrl.team.records import Episode, Step

__all__ = ["NodeReturns", "node_returns", "tree_metrics"]


def _leaves(episodes: list[Episode]) -> tuple[list[tuple[int, ...]], list[float], list[int]]:
    """Each finished episode's leaf: the path of its last call, its credited reward, its problem."""
    paths, rewards, prompts = [], [], []
    for ep in episodes:
        if ep.error is None and ep.steps:
            paths.append(ep.steps[-1].branch)
            rewards.append(credit(ep, len(ep.steps) - 1))
            prompts.append(ep.prompt_index)
    return paths, rewards, prompts


def node_returns(episodes: list[Episode], steps: list[Step]) -> list[float]:
    """The mean credited reward of the leaves below each of ``steps`` (nodes of their problems' prefix trees)."""
    paths, rewards, prompts = _leaves(episodes)
    out = [0.0] * len(steps)
    for prompt in sorted({s.prompt_index for s in steps}):
        rows = [i for i, s in enumerate(steps) if s.prompt_index == prompt]
        mine = [k for k, q in enumerate(prompts) if q == prompt]
        values = c3_lib.subtree_means([steps[i].branch for i in rows], [paths[k] for k in mine],
                                      [rewards[k] for k in mine])
        for i, v in zip(rows, values):
            out[i] = v
    return out


@register_stage
@dataclass
class NodeReturns(RewardTerm):
    """A prefix-tree node's reward: the mean reward of the leaves below it (C3's node return)."""

    name = "c3_node_returns"
    order = -10  # before the format penalty, which then applies to the node's own reply

    @classmethod
    def active(cls, algo: Any) -> bool:
        return C3Advantages.active(algo)

    @classmethod
    def build(cls, algo: Any, ctx: Context) -> NodeReturns:
        return cls()

    def apply(self, episodes: list[Episode], steps: list[Step], rewards: torch.Tensor) -> torch.Tensor:
        if any(not s.branch for s in steps):
            raise ValueError("algo.estimator c3 scores the nodes of a prefix tree; set rollout.prefix_tree")
        return torch.tensor(node_returns(episodes, steps), dtype=rewards.dtype)


def tree_metrics(episodes: list[Episode], steps: list[Step], *, top_k: int = 64) -> dict[str, float]:
    """C3's diagnostics of the scored ``steps`` of a prefix-tree rollout (see the module's docstring); {} when no
    step is a tree node."""
    nodes = [s for s in steps if s.branch]
    if not nodes:
        return {}
    returns = node_returns(episodes, nodes)
    by_group: dict[tuple[int, tuple[int, ...]], list[int]] = {}
    for i, s in enumerate(nodes):
        by_group.setdefault((s.prompt_index, s.branch[:-1]), []).append(i)
    vocab = [s.text for s in nodes if len(s.branch) > 1]
    pairs: dict[str, list[tuple[float, float]]] = {"": []}
    var: dict[str, list[float]] = {"": []}
    mi: dict[str, list[float]] = {"": []}
    sizes = []
    for (prompt, _parent), rows in by_group.items():
        sizes.append(len(rows))
        if len(rows) < 2:
            continue
        agent = nodes[rows[0]].agent
        r = [returns[i] for i in rows]
        mean = sum(r) / len(r)
        for who in ("", agent):
            pairs.setdefault(who, []).extend((nodes[i].advantage, v - mean) for i, v in zip(rows, r))
            var.setdefault(who, []).append(c3_lib.credit_var(r))
        nxt = [[nodes[k].text for k in by_group.get((prompt, nodes[i].branch), [])] for i in rows]  # its children
        if any(nxt):
            for who in ("", agent):
                mi.setdefault(who, []).append(c3_lib.influence_mi(nxt, vocab, top_k=top_k))
    adv = [s.advantage for s in nodes]
    out = {"c3/groups": float(len(sizes)), "c3/group_size_mean": statistics.fmean(sizes),
           "c3/adv_mean": statistics.fmean(adv), "c3/adv_std": statistics.pstdev(adv)}
    for who, found in pairs.items():
        key = f"c3/{who}/" if who else "c3/"
        out[key + "credit_fidelity"] = c3_lib.spearman([a for a, _ in found], [d for _, d in found])
        out[key + "credit_var"] = statistics.fmean(var[who]) if var.get(who) else 0.0
        if mi.get(who):
            out[key + "influence_mi"] = statistics.fmean(mi[who])
    return out
