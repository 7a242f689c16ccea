"""Credit assignment before normalization: Shapley values of a team's agents, and the overlong penalty.

Shapley credit (SHARP, https://arxiv.org/abs/2602.08335). The players are the agents of one
episode; ``v(S)`` is the outcome the team reaches when only the agents in coalition ``S``
contribute (the others are masked: removed from the team history or replaced by a neutral
reply). Agent i is credited its average marginal contribution:

    phi_i = sum over S subset of N without i of |S|! (n - |S| - 1)! / n! * (v(S + {i}) - v(S))

Properties (tested): efficiency, sum_i phi_i = v(N) - v({}); symmetry, two agents with equal
marginal contributions to every coalition get equal credit; null player, an agent whose
presence never changes v gets 0.

Exact values need v on all 2**n coalitions. For larger teams, permutation sampling: draw M
orderings of the agents (seeded), walk each ordering adding one agent at a time, and average
each agent's marginal contribution. The estimate is unbiased and every ordering is efficient
on its own, so the sampled credits still sum exactly to v(N) - v({}).

Functions here are pure: a value function over coalitions (frozensets of player indices) in,
credits out. How v is obtained (re-scoring an answer, re-running a workflow) lives in
``teamrl/train/credit.py``; see ``docs/credit.md``.

Also here: DAPO's soft overlong penalty (https://arxiv.org/abs/2503.14476), a per-step reward
term for replies that run into their token limit; and MARTI's ``reward_alloc`` shaping of a search
tree's node rewards (MARS2, https://arxiv.org/abs/2602.07848), in its two versions
(:func:`shape_tree_rewards`; docs/fidelity.md gives the files, lines and commits).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

__all__ = [
    "REWARD_ALLOCS",
    "coalitions_needed",
    "overlong_penalty",
    "sample_orderings",
    "shape_tree_rewards",
    "shapley_values",
]

REWARD_ALLOCS = ("none", "margin", "tree")
"""MARTI's reward_alloc shapings: none; margin (the MARS2 commit's); tree (MARTI's head)."""

Value = Callable[[frozenset[int]], float]


def sample_orderings(n: int, samples: int, *, seed: int) -> list[tuple[int, ...]]:
    """``samples`` random orderings of players 0..n-1, drawn with ``random.Random(seed)``.

    Args:
        n: number of players, >= 1.
        samples: number of orderings M, >= 1.
        seed: seed of the generator; equal seeds give equal orderings.

    Returns:
        M tuples, each a permutation of range(n).

    >>> sample_orderings(3, 2, seed=0)
    [(0, 2, 1), (2, 1, 0)]
    """
    if n < 1 or samples < 1:
        raise ValueError(f"need n >= 1 players and samples >= 1 orderings, got n={n}, samples={samples}")
    rng = random.Random(seed)
    out = []
    for _ in range(samples):
        order = list(range(n))
        rng.shuffle(order)
        out.append(tuple(order))
    return out


def coalitions_needed(n: int, orderings: Sequence[tuple[int, ...]] | None = None) -> list[frozenset[int]]:
    """The coalitions whose value :func:`shapley_values` reads, each once, smallest first.

    Exact (``orderings`` None): all 2**n subsets. Sampled: every prefix of every ordering
    (the empty and the full coalition included), at most M * (n - 1) + 2 of them.

    >>> [sorted(c) for c in coalitions_needed(2)]
    [[], [0], [1], [0, 1]]
    >>> [sorted(c) for c in coalitions_needed(3, [(2, 0, 1)])]
    [[], [2], [0, 2], [0, 1, 2]]
    """
    if orderings is None:
        return [frozenset(c) for k in range(n + 1) for c in itertools.combinations(range(n), k)]
    seen: dict[frozenset[int], None] = {}
    for order in orderings:
        _check_ordering(order, n)
        for k in range(n + 1):
            seen.setdefault(frozenset(order[:k]), None)
    return sorted(seen, key=lambda c: (len(c), sorted(c)))


def shapley_values(n: int, value: Value, orderings: Sequence[tuple[int, ...]] | None = None) -> list[float]:
    """Shapley value of each of ``n`` players under the coalition value function ``value``.

    Args:
        n: number of players, >= 1.
        value: v(S) for a frozenset S of player indices; called only on
            :func:`coalitions_needed` (n, orderings).
        orderings: None for the exact value (sum over all coalitions), else the orderings of
            permutation sampling (e.g. from :func:`sample_orderings`); the estimate is the mean
            marginal contribution over them.

    Returns:
        [n] credits; they sum to v(all) - v(empty) (exactly, up to float rounding, also when sampled).

    Raises:
        ValueError: n < 1, or an ordering that is not a permutation of range(n).

    Two agents, v({}) = 0, v({0}) = 1, v({1}) = 0, v({0, 1}) = 1 (agent 1 adds nothing):

    >>> v = {frozenset(): 0.0, frozenset({0}): 1.0, frozenset({1}): 0.0, frozenset({0, 1}): 1.0}
    >>> shapley_values(2, v.__getitem__)
    [1.0, 0.0]
    """
    if n < 1:
        raise ValueError(f"need at least one player, got n={n}")
    if orderings is None:
        return _exact(n, value)
    if not orderings:
        raise ValueError("orderings is empty; pass None for exact values or at least one ordering")
    sums = [0.0] * n
    for order in orderings:
        _check_ordering(order, n)
        coalition: frozenset[int] = frozenset()
        before = value(coalition)
        for player in order:
            coalition = coalition | {player}
            after = value(coalition)
            sums[player] += after - before
            before = after
    return [s / len(orderings) for s in sums]


def _exact(n: int, value: Value) -> list[float]:
    """sum over S not containing i of |S|! (n-|S|-1)! / n! (v(S+i) - v(S)), for every i."""
    weight = [math.factorial(k) * math.factorial(n - k - 1) / math.factorial(n) for k in range(n)]
    out = []
    for i in range(n):
        others = [j for j in range(n) if j != i]
        terms = [weight[k] * (value(frozenset(s) | {i}) - value(frozenset(s)))
                 for k in range(n) for s in itertools.combinations(others, k)]
        out.append(math.fsum(terms))
    return out


def _check_ordering(order: tuple[int, ...], n: int) -> None:
    if sorted(order) != list(range(n)):
        raise ValueError(f"ordering {order} is not a permutation of players 0..{n - 1}")


def overlong_penalty(lengths: Tensor, max_lengths: Tensor, *, buffer: int, penalty: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment (https://arxiv.org/abs/2503.14476) as a reward term <= 0.

    With L the reply length, L_max its token limit and e = L_max - buffer:
    0 when L <= e; -penalty * (L - e) / buffer when e < L <= L_max; -penalty when L > L_max.
    ``buffer=0`` turns the term off (all zeros).

    Args:
        lengths: [N] reply lengths in tokens.
        max_lengths: [N] token limit of each reply (the agent's ``max_new_tokens``).
        buffer: the soft zone before the limit, in tokens; 0 <= buffer <= min(max_lengths).
        penalty: the largest penalty, >= 0.

    Returns:
        [N] float64 penalties (<= 0), to be added to the rewards.

    Raises:
        ValueError: mismatched shapes, a negative buffer or penalty, or a buffer longer than a limit.

    >>> overlong_penalty(torch.tensor([10, 14, 16]), torch.tensor([16, 16, 16]), buffer=4)
    tensor([ 0.0000, -0.5000, -1.0000], dtype=torch.float64)
    """
    if lengths.shape != max_lengths.shape or lengths.dim() != 1:
        raise ValueError(f"lengths {list(lengths.shape)} and max_lengths {list(max_lengths.shape)} must both be [N]")
    if buffer < 0 or not 0.0 <= penalty < float("inf"):
        raise ValueError(f"buffer ({buffer}) and penalty ({penalty}) must be >= 0 and finite")
    if buffer == 0 or lengths.numel() == 0:
        return torch.zeros(lengths.shape, dtype=torch.float64)
    if int(max_lengths.min()) < buffer:
        raise ValueError(f"overlong buffer {buffer} is longer than a reply limit {int(max_lengths.min())}; "
                         f"use a buffer <= the smallest max_new_tokens")
    expected = (max_lengths - buffer).to(torch.float64)  # [N]
    over = (lengths.to(torch.float64) - expected).clamp(min=0.0) / buffer  # [N]
    return over.clamp(max=1.0) * -penalty + 0.0  # + 0.0 turns -0.0 into 0.0


def shape_tree_rewards(rewards: Tensor, tree_ids: Tensor, parents: Tensor, *, method: str, alpha: float = 0.5,
                       beta: float = 0.5) -> Tensor:
    """MARTI's ``reward_alloc`` shaping of search-tree node rewards (MARS2, https://arxiv.org/abs/2602.07848).

    The rows of one tree (one ``tree_ids`` value) are its nodes in creation order; ``parents[i]`` is the
    row of node i's parent (an earlier row of the same tree), -1 for a child of the root. With r the raw
    node rewards:

    - ``margin`` (the MARS2 commit's ``margin`` shaping): the k-th node of a tree (k >= 1) gets
      r_k + alpha * (r_k - mean(r_0, ..., r_{k-1})), the mean over the tree's earlier nodes; the first node
      keeps r_0. ``beta`` is unused.
    - ``tree`` (MARTI's head, ``tree_reward_shaping_unified``): a node with siblings (nodes of the same
      parent) and a parent node gets r + alpha * (r - b), b = (1 - beta) * p + beta * s, where p is the
      parent's shaped reward and s the mean of its siblings' raw rewards (leave-one-out); b = p for an
      only child, b = s for a child of the root; an only child of the root keeps r.
    - ``none``: r.

    Args:
        rewards: [N] raw node rewards.
        tree_ids: [N] integer tree of each row.
        parents: [N] row of each node's parent, or -1.
        method: one of ``REWARD_ALLOCS``.
        alpha: weight of the margin, >= 0 (MARTI's default 0.5).
        beta: ``tree``: weight of the siblings in the baseline, in [0, 1] (MARTI's default 0.5).

    Returns:
        [N] float64 shaped rewards.

    Raises:
        ValueError: mismatched shapes, an unknown method, alpha < 0, beta outside [0, 1], or a parent that
            is not an earlier row of the same tree.

    >>> r = torch.tensor([0.0, 1.0, 1.0]); t = torch.zeros(3, dtype=torch.long); p = torch.tensor([-1, -1, 0])
    >>> shape_tree_rewards(r, t, p, method="margin").tolist()  # 1 + .5 (1 - 0); 1 + .5 (1 - (0 + 1) / 2)
    [0.0, 1.5, 1.25]
    >>> shape_tree_rewards(r, t, p, method="tree").tolist()  # siblings 0, 1: 0 + .5 (0 - 1), 1 + .5 (1 - 0); 1 + .5 (1 - (-.5))
    [-0.5, 1.5, 1.75]
    """
    if not (rewards.shape == tree_ids.shape == parents.shape) or rewards.dim() != 1:
        raise ValueError(f"rewards {list(rewards.shape)}, tree_ids {list(tree_ids.shape)} and parents "
                         f"{list(parents.shape)} must all be [N]")
    if method not in REWARD_ALLOCS:
        raise ValueError(f"method {method!r} is not a reward_alloc shaping; choose one of {list(REWARD_ALLOCS)}")
    if not (alpha >= 0 and 0 <= beta <= 1):
        raise ValueError(f"alpha {alpha} must be >= 0 and beta {beta} in [0, 1]")
    raw = rewards.to(torch.float64).tolist()
    tree, parent = tree_ids.tolist(), parents.tolist()
    for i, p in enumerate(parent):
        if p != -1 and not (0 <= p < i and tree[p] == tree[i]):
            raise ValueError(f"row {i}: parent {p} must be -1 or an earlier row of the same tree")
    if method == "none":
        return torch.tensor(raw, dtype=torch.float64)
    out = list(raw)
    if method == "margin":
        seen: dict[int, list[float]] = {}
        for i, r in enumerate(raw):
            earlier = seen.setdefault(tree[i], [])
            if earlier:
                out[i] = r + alpha * (r - sum(earlier) / len(earlier))
            earlier.append(r)
        return torch.tensor(out, dtype=torch.float64)
    siblings: dict[tuple[int, int], list[int]] = {}
    for i, p in enumerate(parent):
        siblings.setdefault((tree[i], p), []).append(i)
    for i, r in enumerate(raw):  # row order: a parent is shaped before its children read it
        mine = siblings[(tree[i], parent[i])]
        s = (sum(raw[j] for j in mine) - r) / (len(mine) - 1) if len(mine) > 1 else None
        p = out[parent[i]] if parent[i] >= 0 else None
        if p is None and s is None:
            continue
        base = (1 - beta) * p + beta * s if p is not None and s is not None else (p if p is not None else s)
        out[i] = r + alpha * (r - base)
    return torch.tensor(out, dtype=torch.float64)
