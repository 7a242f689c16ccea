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


# PettingLLMs' group filters (filter_method x filter_ratio of its trainer; docs/fidelity.md).

from teamrl.algos.dynamic import filter_groups  # noqa: E402


def test_mean_filter_by_hand():
    # groups 0..3: means 0.5, 0, 1, and group 3 a single row of reward 2 that counts as mean 0
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 2.0])
    g = torch.tensor([0, 0, 1, 1, 2, 2, 3])
    # int(4 * 0.5) = 2 groups dropped: the lowest means are group 1 (0) and group 3 (0, a tie kept in order)
    assert filter_groups(r, g, method="mean", ratio=0.5).tolist() == [True, True, False, False, True, True, False]
    # int(4 * 0.3) = 1: group 1 only; int(4 * 0.2) = 0: nothing
    assert filter_groups(r, g, method="mean", ratio=0.3).tolist() == [True, True, False, False, True, True, True]
    assert filter_groups(r, g, method="mean", ratio=0.2).all()


def test_std_filter_by_hand():
    # group 0: (0, 1): var .25, range 1 -> .25; group 1: (0, 0, 3): mean 1, var (1 + 1 + 4)/3 = 2, range 3 -> 2/9;
    # group 2: (5, 5): range 0 -> 0; group 3: one row -> 0
    r = torch.tensor([0.0, 1.0, 0.0, 0.0, 3.0, 5.0, 5.0, 7.0])
    g = torch.tensor([0, 0, 1, 1, 1, 2, 2, 3])
    keep = filter_groups(r, g, method="std", ratio=0.75)  # int(4 * .75) = 3: groups 2, 3 (0) and 1 (2/9)
    assert keep.tolist() == [True, True, False, False, False, False, False, False]
    keep = filter_groups(r, g, method="std", ratio=0.5)  # 2: the two zeros
    assert keep.tolist() == [True, True, True, True, True, False, False, False]


def test_dapo_filter_drops_uniform_groups_whatever_the_ratio():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5])
    g = torch.tensor([0, 0, 1, 1, 2])
    for ratio in (0.1, 1.0):
        assert filter_groups(r, g, method="dapo", ratio=ratio).tolist() == [False, False, True, True, False]


def test_uid_filter_by_hand():
    # group 0: (0, 1, 4): mean 5/3, deviations 5/3, 2/3, 7/3 -> int(3 * .5) = 1 dropped: the 4
    # group 1: (1, 3): mean 2, deviations 1, 1 (a tie: the earlier row goes) -> int(2 * .5) = 1 dropped
    # group 2: one row, kept
    r = torch.tensor([0.0, 1.0, 1.0, 4.0, 3.0, 9.0])
    g = torch.tensor([0, 0, 1, 0, 1, 2])
    assert filter_groups(r, g, method="uid", ratio=0.5).tolist() == [True, True, False, False, True, True]


def _pettingllms_filter(rewards: list[float], keys: list[int], mode: str, ratio: float) -> set[int]:
    """The rows PettingLLMs' ``_assign_consistent_uids`` removes, as docs/fidelity.md writes its loops."""
    groups: dict[int, list[tuple[int, float]]] = {}
    for i, (k, r) in enumerate(zip(keys, rewards)):
        groups.setdefault(k, []).append((i, r))
    remove: set[int] = set()

    def rnv(values):
        rng = max(values) - min(values)
        if rng == 0:
            return 0.0
        m = sum(values) / len(values)
        return sum((v - m) ** 2 for v in values) / len(values) / rng**2

    if mode == "dapo":
        for samples in groups.values():
            if rnv([s[1] for s in samples]) == 0:
                remove |= {s[0] for s in samples}
    elif mode in ("mean", "std"):
        score = {}
        for k, samples in groups.items():
            values = [s[1] for s in samples]
            score[k] = (sum(values) / len(values) if mode == "mean" else rnv(values)) if len(samples) > 1 else 0.0
        for k, _ in sorted(score.items(), key=lambda x: x[1])[: int(len(score) * ratio)]:
            remove |= {s[0] for s in groups[k]}
    else:
        for samples in groups.values():
            if len(samples) > 1:
                m = sum(s[1] for s in samples) / len(samples)
                far = sorted(((s[0], abs(s[1] - m)) for s in samples), key=lambda x: x[1], reverse=True)
                remove |= {i for i, _ in far[: int(len(samples) * ratio)]}
    return remove


@pytest.mark.parametrize("mode", ["mean", "std", "dapo", "uid"])
@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.8])
def test_filters_match_the_pettingllms_loops(mode, ratio):
    gen = torch.Generator().manual_seed(7)
    for _ in range(20):
        n = int(torch.randint(1, 24, (1,), generator=gen))
        groups = torch.randint(0, 6, (n,), generator=gen)
        groups = torch.unique(groups, return_inverse=True)[1]
        order = {}
        for k in groups.tolist():  # renumber in order of first appearance, as group_ids_for does
            order.setdefault(k, len(order))
        groups = torch.tensor([order[k] for k in groups.tolist()])
        rewards = torch.randint(-2, 3, (n,), generator=gen).double() / 2  # ties on purpose
        removed = _pettingllms_filter(rewards.tolist(), groups.tolist(), mode, ratio)
        keep = filter_groups(rewards, groups, method=mode, ratio=ratio)
        assert {i for i in range(n) if not keep[i]} == removed


def test_filter_rejects_bad_arguments():
    with pytest.raises(ValueError, match="group filter"):
        filter_groups(torch.zeros(2), torch.zeros(2, dtype=torch.long), method="median", ratio=0.5)
    with pytest.raises(ValueError, match="ratio"):
        filter_groups(torch.zeros(2), torch.zeros(2, dtype=torch.long), method="mean", ratio=1.5)
