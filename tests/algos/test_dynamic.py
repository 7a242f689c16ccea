from __future__ import annotations

import pytest
import torch

from teamrl.algos.dynamic import informative


def test_uniform_groups_are_dropped_by_hand():
    # groups: 0 -> rewards (1, 1): uniform; 1 -> (0, 1): spread 1; 2 -> (0.5): a single row is uniform
    keep = informative(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5]), torch.tensor([0, 0, 1, 1, 2]))
    assert keep.tolist() == [False, False, True, True, False]


def test_tolerance_and_interleaved_groups():
    rewards = torch.tensor([0.30, 0.10, 0.31, 0.20])
    groups = torch.tensor([0, 1, 0, 1])  # spreads: group 0 -> 0.01, group 1 -> 0.10
    assert informative(rewards, groups).tolist() == [True, True, True, True]
    assert informative(rewards, groups, tol=0.05).tolist() == [False, True, False, True]


def test_empty_and_bad_inputs():
    assert informative(torch.zeros(0), torch.zeros(0, dtype=torch.long)).tolist() == []
    with pytest.raises(ValueError, match="must both be"):
        informative(torch.zeros(3), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="tol"):
        informative(torch.zeros(2), torch.zeros(2, dtype=torch.long), tol=-1.0)
