"""Group-normalized advantages for multi-agent LLM teams.

A *step* is one LLM call and one row of the batch. An advantage is a step's
reward normalized within a *group* of comparable steps. Four knobs define an
estimator:

- ``scope``: which rows are comparable (the key that defines a group).
- ``unit``: what one sample of a group is, a step or a whole episode.
- ``center``: the baseline subtracted from a row's reward.
- ``scale``: what the centered reward is divided by.

Named presets cover GRPO, Dr. MAS (https://arxiv.org/abs/2602.08847),
AT-GRPO, MAGRPO, RLOO, Dr. GRPO, REINFORCE++, MARS2's tree groups and SPIRAL's RAE
(:mod:`teamrl.algos.estimators`, re-exported here); see ``docs/advantages.md``.

Shape legend: N steps (rows).
"""

from __future__ import annotations

import torch
from torch import Tensor

from teamrl.algos.estimators import (
    CENTERS,
    PRESETS,
    SCALES,
    SCOPES,
    UNITS,
    Estimator,
    check_choice,
    get_estimator,
    register_estimator,
)
from teamrl.algos.groups import _check_ids, _check_rewards, _dense_ids, group_ids_for

__all__ = [
    "CENTERS",
    "PRESETS",
    "SCALES",
    "SCOPES",
    "UNITS",
    "Estimator",
    "apply_format_penalty",
    "compute_advantages",
    "get_estimator",
    "group_ids_for",
    "register_estimator",
    "reward_to_go",
]

# Key columns that define a group for each scope. "tree" keeps the prompt in
# the key so that tree ids numbered per prompt never merge two prompts.
# Sample values of a group that differ by at most this many units in the last
# place of the reward dtype (relative to the group's largest |reward|) count
# as equal, so rounding noise never gets divided by eps.
_TIE_ULPS = 16.0


def _segment_sum(values: Tensor, segments: Tensor, num: int) -> Tensor:
    """Per-segment sums, accumulated in (segment, value) order so that equal
    multisets give equal sums whatever the row order."""
    order = torch.argsort(values, stable=True)
    order = order[torch.argsort(segments[order], stable=True)]
    out = torch.zeros(num, dtype=values.dtype, device=values.device)
    return out.index_add_(0, segments[order], values[order])  # [num]


def _segment_extreme(values: Tensor, segments: Tensor, num: int, reduce: str) -> Tensor:
    """Per-segment ``amin`` or ``amax`` of ``values``."""
    fill = float("inf") if reduce == "amin" else float("-inf")
    out = torch.full((num,), fill, dtype=values.dtype, device=values.device)
    return out.scatter_reduce_(0, segments, values, reduce=reduce)  # [num]


def _samples(
    r: Tensor, groups: Tensor, episode_ids: Tensor, unit: str
) -> tuple[Tensor, Tensor, Tensor]:
    """The samples of every group.

    Returns (sample of each row [N], sample values [S], group of each sample [S]).
    An episode sample is the mean of its rows in the group, computed as
    min + mean(r - min) so equal rows give exactly their common value.
    """
    if unit == "step":
        return torch.arange(r.numel(), device=r.device), r, groups
    pair = _dense_ids(torch.stack([groups, episode_ids.long()], dim=1))  # [N]
    num = int(pair.max()) + 1
    count = _segment_sum(torch.ones_like(r), pair, num)  # [S]
    low = _segment_extreme(r, pair, num, "amin")  # [S]
    value = low + _segment_sum(r - low[pair], pair, num) / count  # [S]
    sample_group = torch.zeros(num, dtype=torch.long, device=r.device)
    sample_group.scatter_(0, pair, groups)  # [S]
    return pair, value, sample_group


def _group_stats(
    values: Tensor, groups: Tensor, num: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Sum, count, mean and unbiased std (0 for one sample) of samples per group, each [G]."""
    count = _segment_sum(torch.ones_like(values), groups, num)
    total = _segment_sum(values, groups, num)
    mean = total / count
    squares = _segment_sum((values - mean[groups]) ** 2, groups, num)
    std = (squares / (count - 1).clamp_min(1)).sqrt()
    return total, count, mean, std


def _baseline(
    center: str,
    row_sample: Tensor,
    values: Tensor,
    row_group: Tensor,
    total: Tensor,
    count: Tensor,
    mean: Tensor,
) -> Tensor:
    """Baseline of every row [N] for ``center``."""
    if center == "none":
        return torch.zeros_like(row_group, dtype=values.dtype)
    if center == "mean":
        return mean[row_group]
    own = values[row_sample]  # [N]
    n = count[row_group]  # [N]
    others = (total[row_group] - own) / (n - 1).clamp_min(1)
    return torch.where(n > 1, others, own)


def _tied_groups(
    r: Tensor, row_group: Tensor, values: Tensor, sample_group: Tensor, num: int, ulp: float
) -> Tensor:
    """[G] bool: the group's samples are all equal (up to rounding); true for one sample."""
    spread = _segment_extreme(values, sample_group, num, "amax") - _segment_extreme(
        values, sample_group, num, "amin"
    )
    magnitude = _segment_extreme(r.abs(), row_group, num, "amax")
    return spread <= _TIE_ULPS * ulp * magnitude


def _rescale(centered: Tensor, scale: str, row_std: Tensor, eps: float) -> Tensor:
    """Divide the centered rewards [N] as ``scale`` says."""
    if scale == "none":
        return centered
    if scale == "std":
        return centered / (row_std + eps)
    n = centered.numel()
    ordered = torch.sort(centered).values  # canonical order: row order never changes sums
    deviations = ordered - ordered.sum() / n
    batch_std = (torch.sort(deviations**2).values.sum() / max(n - 1, 1)).sqrt()
    return centered / (batch_std + eps)


def compute_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    episode_ids: Tensor,
    *,
    unit: str,
    center: str,
    scale: str,
    eps: float = 1e-6,
) -> Tensor:
    """Normalize each row's reward within its group (Dr. MAS, https://arxiv.org/abs/2602.08847).

    Samples: with ``unit="step"`` every row of a group is one sample; with
    ``unit="episode"`` every distinct episode in the group is ONE sample whose
    value is the mean of that episode's rewards over its rows in the group.
    A row's advantage is (its sample's value - baseline) / scale: its own
    reward under ``unit="step"``, its episode's mean under ``unit="episode"``
    (every row of an episode gets the same advantage, as in the Dr. MAS code's
    GRPO baseline), where

    - ``center="mean"``: baseline = mean of the group's samples;
      ``"leave_one_out"``: mean of the group's samples other than the row's
      own sample (its episode, or the row itself for unit=step), or the own
      sample's value when the group has one sample; ``"none"``: baseline 0.
    - ``scale="std"``: divide by (unbiased, n-1, std of the group's samples
      + eps); ``"none"``: no division; ``"batch_std"``: divide by (unbiased
      std over all N rows' centered values + eps), as in REINFORCE++.
    - Tie rule: when a group's samples are all equal (up to rounding of the
      reward dtype), which includes a group with a single sample and a group
      with all-equal rewards, every row of the group gets exactly 0.0. It
      applies whenever a group statistic is used (center != "none" or
      scale == "std"); with center="none" and scale in ("none",
      "batch_std") rows keep their raw (batch-scaled) reward.

    Group statistics are accumulated in float64 in a canonical order, so on
    CPU the result is bitwise invariant to row order.

    Args:
        rewards: [N] reward of each row (float or integer), finite.
        group_ids: [N] integer group of each row, e.g. from ``group_ids_for``.
        episode_ids: [N] integer episode (rollout) of each row.
        unit: one of ``UNITS``.
        center: one of ``CENTERS``.
        scale: one of ``SCALES``.
        eps: added to the std before dividing, >= 0.

    Returns:
        [N] advantages, in the rewards' float dtype (default dtype for integers).

    Raises:
        ValueError: unknown knob, non-1-D or mismatched inputs, non-finite
            rewards, or negative eps.

    >>> r = torch.tensor([1.0, 0.0, 1.0, 1.0])  # one group: mean .75, std .5
    >>> g = torch.zeros(4, dtype=torch.long); e = torch.arange(4)
    >>> compute_advantages(r, g, e, unit="episode", center="mean", scale="std")
    tensor([ 0.5000, -1.5000,  0.5000,  0.5000])
    """
    check_choice("unit", unit, UNITS)
    check_choice("center", center, CENTERS)
    check_choice("scale", scale, SCALES)
    if center == "role_ema":
        raise ValueError("center='role_ema' keeps a running baseline across steps; compute it with "
                         "teamrl.algos.rae.role_baseline_advantages")
    _check_rewards(rewards)
    _check_ids("group_ids", group_ids, rewards.numel())
    _check_ids("episode_ids", episode_ids, rewards.numel())
    if not eps >= 0.0:
        raise ValueError(f"eps must be >= 0, got {eps}; use a small positive value like 1e-6")
    floating = rewards.dtype.is_floating_point
    out_dtype = rewards.dtype if floating else torch.get_default_dtype()
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=out_dtype, device=rewards.device)
    r = rewards.to(torch.float64)  # [N]
    row_group = _dense_ids(group_ids.long()[:, None])  # [N]
    num = int(row_group.max()) + 1
    row_sample, values, sample_group = _samples(r, row_group, episode_ids, unit)
    total, count, mean, std = _group_stats(values, sample_group, num)
    own = values[row_sample]  # [N]: the row's reward (unit=step) or its episode's mean in the group
    centered = own - _baseline(center, row_sample, values, row_group, total, count, mean)
    if center == "none" and scale != "std":
        return _rescale(centered, scale, std[row_group], eps).to(out_dtype)
    ulp = torch.finfo(rewards.dtype if floating else torch.float64).eps
    tied = _tied_groups(r, row_group, values, sample_group, num, ulp)[row_group]  # [N]
    centered = torch.where(tied, 0.0, centered)
    scaled = _rescale(centered, scale, std[row_group], eps)
    return torch.where(tied, 0.0, scaled).to(out_dtype)


def reward_to_go(
    rewards: Tensor, episode_ids: Tensor, turn_ids: Tensor, *, gamma: float = 1.0
) -> Tensor:
    """Discounted sum of an episode's step rewards from this step's turn on.

    Row i gets sum over rows j of the same episode with turn_j >= turn_i of
    gamma ** (turn_j - turn_i) * rewards[j]. Rows at the same turn (several
    agents) all count with weight 1, so a joint per-turn reward must sit on
    one row of that turn (or be split across them), not be copied to each.
    Used for MAGRPO (https://arxiv.org/abs/2508.04652) returns.

    Args:
        rewards: [N] step rewards, finite.
        episode_ids: [N] integer episode of each row.
        turn_ids: [N] integer turn of each row; gaps are allowed and discounted.
        gamma: discount in [0, 1].

    Returns:
        [N] reward-to-go in the rewards' float dtype.

    Raises:
        ValueError: mismatched or non-1-D inputs, non-finite rewards, or gamma
            outside [0, 1].

    >>> r = torch.tensor([1.0, 0.0, 2.0]); ep = torch.zeros(3, dtype=torch.long)
    >>> reward_to_go(r, ep, torch.tensor([0, 1, 2]), gamma=0.5)
    tensor([1.5000, 1.0000, 2.0000])
    """
    _check_rewards(rewards)
    _check_ids("episode_ids", episode_ids, rewards.numel())
    _check_ids("turn_ids", turn_ids, rewards.numel())
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}; use 1.0 for no discount")
    out_dtype = rewards.dtype if rewards.dtype.is_floating_point else torch.get_default_dtype()
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=out_dtype, device=rewards.device)
    episode = _dense_ids(episode_ids.long()[:, None])  # [N]
    turns, column = torch.unique(turn_ids.long(), return_inverse=True)  # [K], [N]
    cells = torch.zeros(int(episode.max()) + 1, turns.numel(), dtype=torch.float64,
                        device=rewards.device)  # [E, K]
    cells.index_put_((episode, column), rewards.to(torch.float64), accumulate=True)
    decay = torch.pow(torch.tensor(gamma, dtype=torch.float64), (turns[1:] - turns[:-1]).double())
    for k in range(turns.numel() - 2, -1, -1):
        cells[:, k] += decay[k] * cells[:, k + 1]
    return cells[episode, column].to(out_dtype)  # [N]


def apply_format_penalty(rewards: Tensor, valid: Tensor, *, penalty: float) -> Tensor:
    """Subtract ``penalty`` from the reward of every step whose output was malformed.

    Args:
        rewards: [N] rewards.
        valid: [N] bool, False where the step's output failed to parse.
        penalty: amount subtracted, >= 0.

    Returns:
        [N] rewards - penalty * (~valid), same dtype as a float ``rewards``.

    Raises:
        ValueError: shapes differ, ``valid`` is not bool, or penalty < 0.

    >>> apply_format_penalty(torch.tensor([1.0, 1.0]), torch.tensor([True, False]), penalty=0.5)
    tensor([1.0000, 0.5000])
    """
    _check_rewards(rewards)
    if not isinstance(valid, Tensor) or valid.dtype != torch.bool:
        kind = valid.dtype if isinstance(valid, Tensor) else type(valid).__name__
        raise ValueError(f"valid must be a bool tensor, got {kind}; convert with .bool()")
    if valid.shape != rewards.shape:
        raise ValueError(
            f"valid has shape {list(valid.shape)} but rewards has {list(rewards.shape)}; "
            "give one flag per row"
        )
    if not 0.0 <= penalty < float("inf"):
        raise ValueError(f"penalty must be finite and >= 0, got {penalty}; it is subtracted")
    base = rewards if rewards.dtype.is_floating_point else rewards.to(torch.get_default_dtype())
    return base - penalty * (~valid).to(base.dtype)
