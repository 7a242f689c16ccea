"""Dynamic sampling (DAPO, https://arxiv.org/abs/2503.14476): which advantage groups carry a signal.

A group whose rewards are all equal has advantage 0 for every member under a group-centred
estimator: it adds nothing to the gradient but still counts in the loss's denominators, diluting
the batch. :func:`informative` marks the groups with reward variance.

Leaves out: how groups are formed (``teamrl.algos.advantages.group_ids_for``) and refilling the
batch with more problems (``teamrl.train.trainer``).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["informative"]


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
