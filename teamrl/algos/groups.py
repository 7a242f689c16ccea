"""Which steps are compared: the group of each row for an advantage scope, and the checks every estimator's inputs pass.

:func:`group_ids_for` turns a scope (``prompt``, ``prompt+agent``, ...) into dense group ids; the estimators of
:mod:`teamrl.algos.advantages` normalize within those groups. Shape legend: N steps (rows).
"""

from __future__ import annotations

import torch
from torch import Tensor

from teamrl.algos.estimators import SCOPES, check_choice

__all__ = ["group_ids_for"]

_SCOPE_KEYS: dict[str, tuple[str, ...]] = {
    "prompt": ("prompt",),
    "prompt+agent": ("prompt", "agent"),
    "prompt+agent+turn": ("prompt", "agent", "turn"),
    "prompt+turn": ("prompt", "turn"),
    "tree": ("prompt", "tree"),
    "tree+agent+turn": ("prompt", "tree", "agent", "turn"),
    "agent": ("agent",),
    "branch": ("prompt", "tree"),
}

def _check_ids(name: str, ids: object, n: int | None) -> None:
    """Raise ValueError unless ``ids`` is a 1-D integer tensor of length ``n``."""
    if not isinstance(ids, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(ids).__name__}")
    if ids.dim() != 1:
        raise ValueError(f"{name} must be 1-D [N], got shape {list(ids.shape)}; flatten it")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"{name} must hold integers, got dtype {ids.dtype}; convert with .long()")
    if n is not None and ids.numel() != n:
        raise ValueError(
            f"{name} has {ids.numel()} rows but the batch has {n}; give one id per row"
        )


def _check_rewards(rewards: object) -> None:
    """Raise ValueError unless ``rewards`` is a finite 1-D real tensor."""
    if not isinstance(rewards, Tensor):
        raise ValueError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {list(rewards.shape)}; flatten it")
    if rewards.dtype.is_complex:
        raise ValueError(f"rewards must be real, got dtype {rewards.dtype}")
    if rewards.dtype.is_floating_point:
        bad = ~torch.isfinite(rewards)
        if bool(bad.any()):
            idx = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"rewards must be finite, got {rewards[idx].item()} at row {idx}; "
                "fix the reward function or replace it with a finite penalty"
            )


def _dense_ids(keys: Tensor) -> Tensor:
    """Dense ids 0..G-1 for the distinct rows of ``keys`` [N, K], in order of first appearance."""
    n = keys.shape[0]
    if n == 0:
        return torch.zeros(0, dtype=torch.long, device=keys.device)
    _, inverse = torch.unique(keys[:, 0], return_inverse=True)  # [N]
    for k in range(1, keys.shape[1]):
        # Combine with the next column's dense id; both are < N, so no overflow.
        _, column = torch.unique(keys[:, k], return_inverse=True)  # [N]
        _, inverse = torch.unique(inverse * n + column, return_inverse=True)  # [N]
    num = int(inverse.max()) + 1
    rows = torch.arange(n, device=keys.device)  # [N]
    first = torch.full((num,), n, dtype=torch.long, device=keys.device)
    first.scatter_reduce_(0, inverse, rows, reduce="amin")  # [G]
    rank = torch.empty_like(first)
    rank[torch.argsort(first)] = torch.arange(num, device=keys.device)
    return rank[inverse]  # [N]


def group_ids_for(
    scope: str,
    *,
    prompt_ids: Tensor,
    agent_ids: Tensor,
    turn_ids: Tensor,
    tree_ids: Tensor | None = None,
) -> Tensor:
    """Dense group ids for a scope: rows sharing the scope's key share an id.

    Keys: ``prompt`` -> (prompt,); ``prompt+agent`` -> (prompt, agent);
    ``prompt+agent+turn`` -> (prompt, agent, turn); ``prompt+turn`` ->
    (prompt, turn); ``tree`` -> (prompt, tree), so tree ids may be numbered
    per prompt or globally; ``tree+agent+turn`` -> (prompt, tree, agent, turn)
    (AT-GRPO: one agent's candidates at one turn of one sampling tree); ``branch`` -> (prompt, tree), the
    tree ids naming a prefix tree's sibling sets (C3).

    Args:
        scope: one of ``SCOPES``.
        prompt_ids: [N] integer id of the prompt (task instance) of each row.
        agent_ids: [N] integer id of the agent that made each call.
        turn_ids: [N] integer turn index of each call within its episode.
        tree_ids: [N] integer id of each row's sibling set in a rollout tree;
            required for the ``tree`` scopes, ignored otherwise.

    Returns:
        [N] int64 ids 0..G-1, numbered in order of first appearance.

    Raises:
        ValueError: unknown scope, ids not 1-D integer tensors of one length,
            or ``scope="tree"`` without ``tree_ids``.

    >>> p = torch.tensor([0, 0, 0, 1]); a = torch.tensor([0, 1, 0, 0])
    >>> group_ids_for("prompt+agent", prompt_ids=p, agent_ids=a, turn_ids=torch.zeros(4, dtype=torch.long))
    tensor([0, 1, 0, 2])
    """
    check_choice("scope", scope, SCOPES)
    _check_ids("prompt_ids", prompt_ids, None)
    n = prompt_ids.numel()
    _check_ids("agent_ids", agent_ids, n)
    _check_ids("turn_ids", turn_ids, n)
    if (scope.startswith("tree") or scope == "branch") and tree_ids is None:
        raise ValueError(
            f"scope={scope!r} needs tree_ids: pass one integer id per row naming its sibling set"
        )
    if tree_ids is not None:
        _check_ids("tree_ids", tree_ids, n)
    columns = {"prompt": prompt_ids, "agent": agent_ids, "turn": turn_ids}
    if tree_ids is not None:
        columns["tree"] = tree_ids
    keys = torch.stack([columns[k].long() for k in _SCOPE_KEYS[scope]], dim=1)  # [N, K]
    return _dense_ids(keys)
