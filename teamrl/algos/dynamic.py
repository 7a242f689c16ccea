"""Which rows of a batch are trained on: DAPO's dynamic sampling and PettingLLMs' group filters.

A group whose rewards are all equal has advantage 0 for every member under a group-centred
estimator: it adds nothing to the gradient but still counts in the loss's denominators, diluting
the batch. :func:`informative` marks the groups with reward variance (DAPO, arXiv 2503.14476).

:func:`filter_groups` is the filter PettingLLMs' trainer (AT-GRPO, arXiv 2510.11062) applies before
its update, ``filter_method`` x ``filter_ratio`` (docs/fidelity.md gives its file and lines):
``mean`` drops the fraction ``ratio`` of groups with the lowest mean reward, ``std`` the fraction
with the lowest range-normalised variance, ``dapo`` every group without reward variance
(:func:`informative`), ``uid`` within every group the fraction of rows farthest from the group's mean.

Leaves out: how groups are formed (``teamrl.algos.advantages.group_ids_for``), refilling the batch
with more problems and recomputing the advantages of what is kept (``teamrl.train.dynamic``).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["GROUP_FILTERS", "filter_groups", "informative"]

GROUP_FILTERS = ("none", "mean", "std", "dapo", "uid")


def informative(rewards: Tensor, groups: Tensor, *, tol: float = 0.0) -> Tensor:
    """Rows whose group's rewards are not all equal (max - min > ``tol``).

    Args:
        rewards: [N] reward of each row.
        groups: [N] integer group id of each row (e.g. from ``group_ids_for``).
        tol: spread at or below which a group counts as uniform (0: exactly equal).

    Returns:
        [N] bool, True for the rows of groups with reward variance.

    Raises:
        ValueError: shape mismatch or a negative ``tol``.

    >>> informative(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5]), torch.tensor([0, 0, 1, 1, 2]))
    tensor([False, False,  True,  True, False])
    """
    if rewards.shape != groups.shape or rewards.dim() != 1:
        raise ValueError(f"rewards {list(rewards.shape)} and groups {list(groups.shape)} must both be [N]")
    if tol < 0:
        raise ValueError(f"tol {tol} must be >= 0")
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=torch.bool)
    g = groups.long()
    n = int(g.max()) + 1
    r = rewards.double()
    hi = torch.full((n,), -torch.inf, dtype=torch.float64).scatter_reduce(0, g, r, "amax")  # [G]
    lo = torch.full((n,), torch.inf, dtype=torch.float64).scatter_reduce(0, g, r, "amin")  # [G]
    return (hi - lo)[g] > tol


def _group_values(r: Tensor, g: Tensor, n: int, method: str) -> Tensor:
    """[G] the value a group is ranked by: its mean (``mean``) or its population variance over its range
    squared (``std``); 0 for a group of one row, and 0 for ``std`` when the range is 0 (PettingLLMs)."""
    count = torch.zeros(n, dtype=torch.float64).index_add_(0, g, torch.ones_like(r))  # [G]
    mean = torch.zeros(n, dtype=torch.float64).index_add_(0, g, r) / count  # [G]
    if method == "mean":
        return torch.where(count > 1, mean, 0.0)
    var = torch.zeros(n, dtype=torch.float64).index_add_(0, g, (r - mean[g]) ** 2) / count  # [G], ddof 0
    hi = torch.full((n,), -torch.inf, dtype=torch.float64).scatter_reduce(0, g, r, "amax")  # [G]
    lo = torch.full((n,), torch.inf, dtype=torch.float64).scatter_reduce(0, g, r, "amin")  # [G]
    spread = hi - lo
    return torch.where((count > 1) & (spread > 0), var / torch.where(spread > 0, spread, 1.0) ** 2, 0.0)


def filter_groups(rewards: Tensor, groups: Tensor, *, method: str, ratio: float) -> Tensor:
    """Rows kept by PettingLLMs' group filter ``method`` with ``ratio`` (its ``filter_method``, ``filter_ratio``).

    - ``mean``: the int(G * ratio) groups of lowest mean reward are dropped (a group of one row counts as
      mean 0); ties keep the order of first appearance, as a stable sort.
    - ``std``: the int(G * ratio) groups of lowest var / range^2 (population variance; 0 for one row or
      a range of 0) are dropped.
    - ``dapo``: every group whose rewards are all equal is dropped (``ratio`` unused).
    - ``uid``: in every group of two or more rows, the int(n * ratio) rows farthest from the group's mean
      (ties: the earlier row first) are dropped.
    - ``none``: every row is kept.

    Args:
        rewards: [N] reward of each row.
        groups: [N] integer group id of each row, numbered 0..G-1 in order of first appearance.
        method: one of ``GROUP_FILTERS``.
        ratio: fraction in [0, 1].

    Returns:
        [N] bool, True for the rows kept.

    Raises:
        ValueError: shape mismatch, an unknown method or a ratio outside [0, 1].

    >>> r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0]); g = torch.tensor([0, 0, 1, 1, 2, 2])  # means .5, 0, 1
    >>> filter_groups(r, g, method="mean", ratio=0.5).tolist()  # int(3 * .5) = 1 group: the lowest mean (group 1)
    [True, True, False, False, True, True]
    >>> filter_groups(torch.tensor([0.0, 1.0, 4.0]), torch.zeros(3, dtype=torch.long), method="uid", ratio=0.5).tolist()
    [True, True, False]
    """
    if rewards.shape != groups.shape or rewards.dim() != 1:
        raise ValueError(f"rewards {list(rewards.shape)} and groups {list(groups.shape)} must both be [N]")
    if method not in GROUP_FILTERS:
        raise ValueError(f"method {method!r} is not a group filter; choose one of {list(GROUP_FILTERS)}")
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"ratio {ratio} must be in [0, 1]")
    if method == "none" or rewards.numel() == 0:
        return torch.ones(rewards.numel(), dtype=torch.bool)
    if method == "dapo":
        return informative(rewards, groups)
    g, r = groups.long(), rewards.double()
    n = int(g.max()) + 1
    if method == "uid":
        return _keep_near_mean(r, g, n, ratio)
    value = _group_values(r, g, n, method)  # [G]
    present = torch.zeros(n, dtype=torch.bool).index_fill_(0, g, True)  # [G]: ids the batch uses
    order = [i for i in sorted(range(n), key=lambda i: float(value[i])) if present[i]]  # stable: first appearance
    dropped = torch.zeros(n, dtype=torch.bool)
    dropped[order[: int(len(order) * ratio)]] = True
    return ~dropped[g]


def _keep_near_mean(r: Tensor, g: Tensor, n: int, ratio: float) -> Tensor:
    """``uid``: in each group of two or more rows, drop the int(rows * ratio) rows farthest from its mean."""
    keep = torch.ones(r.numel(), dtype=torch.bool)
    for group in range(n):
        rows = (g == group).nonzero().flatten().tolist()
        if len(rows) < 2:
            continue
        mean = r[rows].mean()
        far = sorted(rows, key=lambda i: -float((r[i] - mean).abs()))  # stable: the earlier row first on ties
        keep[far[: int(len(rows) * ratio)]] = False
    return keep
