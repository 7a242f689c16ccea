"""Role-conditioned advantage estimation (RAE, SPIRAL, arXiv 2506.24119): a running baseline per game and role.

In a zero-sum game played against itself, one model plays both seats; the seats win at different rates
(the first mover's edge), so one shared baseline would credit a seat for its seat. RAE keeps one
exponential moving average of the reward per (game, role) across training steps and subtracts it.

SPIRAL's code (spiral-rl/spiral @ a02d0ed8d11c57e0ee4a4096e9881866d69a052b):

* ``spiral/utils.py:18-32``: ``EMA(decay)`` starts at ``value = 0.0``; ``update(x)`` sets
  ``value = decay * value + (1 - decay) * x``; ``get()`` returns ``value``.
* ``train_spiral.py:78-79``: ``use_role_baseline = True``, ``role_baseline_ema_gamma = 0.95``;
  ``158-163``: one EMA per player id (role) of the game.
* ``train_spiral.py:488-493``: for each game, for each player: ``baseline = ema[player].get()`` (read
  *before* the update, "to be unbiased"), then ``ema[player].update(player_reward)``, then
  ``player_reward -= baseline``; every step of that player in that game gets this advantage (``gamma = 1``).
  Games are handled one after another, so a later game of a batch sees the baselines the earlier ones moved.

No division by a standard deviation (SPIRAL's learner uses the shifted return as the advantage).

Left out: SPIRAL's ``filter_zero_adv`` (dropping steps whose advantage is exactly 0) and its discount over a
player's turns (``gamma``, 1 in its runs).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

__all__ = ["role_baseline_advantages"]


def role_baseline_advantages(rewards: Tensor, samples: Sequence[Hashable], keys: Sequence[Hashable],
                             baselines: dict[Hashable, float], *, decay: float = 0.95) -> tuple[Tensor, dict[Hashable, float]]:
    """RAE advantages: each row's reward minus its (game, role) baseline, read before that sample updates it.

    A *sample* is one role's part of one game (its rows: that player's turns); its value is the mean of its
    rows' rewards (the player's terminal reward). Samples are taken in order of first appearance; for each,
    ``b = baselines[key]`` (0 for a new key), every row of the sample gets ``reward - b``, then
    ``baselines[key] = decay * b + (1 - decay) * value``.

    Args:
        rewards: [N] reward of each row.
        samples: [N] the sample (e.g. (episode, agent)) of each row.
        keys: [N] the baseline key (e.g. (game, role)) of each row; rows of one sample share it.
        baselines: the running baselines before this batch (not modified).
        decay: the moving average's decay, 0 < decay < 1 (SPIRAL: 0.95).

    Returns:
        ([N] advantages, the baselines after this batch).

    >>> r = torch.tensor([1.0, 1.0, -1.0, 1.0], dtype=torch.float64)  # game 0: seat a won (two turns), seat b lost; game 1: a won
    >>> adv, b = role_baseline_advantages(r, [(0, "a"), (0, "a"), (0, "b"), (1, "a")], ["a", "a", "b", "a"], {})
    >>> adv.tolist()                                      # baselines start at 0; game 1's a reads 0.05 = 0.05 * 1
    [1.0, 1.0, -1.0, 0.95]
    >>> {k: round(v, 4) for k, v in b.items()}            # a: 0.95 * 0.05 + 0.05 * 1; b: 0.05 * -1
    {'a': 0.0975, 'b': -0.05}
    """
    if not 0.0 < decay < 1.0:
        raise ValueError(f"decay {decay} must be in (0, 1), e.g. 0.95 (SPIRAL's role_baseline_ema_gamma)")
    if not (rewards.dim() == 1 and len(samples) == len(keys) == rewards.numel()):
        raise ValueError(f"rewards {tuple(rewards.shape)}, samples ({len(samples)}) and keys ({len(keys)}) must be "
                         f"one per row")
    rows: dict[Hashable, list[int]] = {}
    for i, sample in enumerate(samples):
        rows.setdefault(sample, []).append(i)
    out = dict(baselines)
    row_baseline = torch.zeros(rewards.numel(), dtype=torch.float64)  # [N]
    r = rewards.to(torch.float64)
    for sample, idx in rows.items():  # in order of first appearance: the order the games were played
        key = keys[idx[0]]
        if any(keys[i] != key for i in idx):
            raise ValueError(f"sample {sample!r} has rows under several keys; one role of one game has one key")
        b = out.get(key, 0.0)
        row_baseline[idx] = b
        value = float(r[idx].mean())
        out[key] = decay * b + (1.0 - decay) * value
    dtype = rewards.dtype if rewards.dtype.is_floating_point else torch.get_default_dtype()
    return (r - row_baseline).to(dtype), out
