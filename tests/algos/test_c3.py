"""C3's credit (teamrl.algos.c3) against a transcription of EIT-EAST-Lab/C3 @ 628185b, and by hand.

The reference functions below follow the original line by line: ``c3/credit/c3/provider.py`` (``_baseline_loo``
:81-89, ``_baseline_full_mean`` :92-96, ``compute``'s reward_only branch :493-506), ``c3/algorithms/utils.py``
(``group_mean_std`` :132-164) with its use in ``openrlhf/trainer/ppo_utils/experience_maker.py`` :1761-1765, and
``c3/analysis/metrics.py`` (``_baseline_loo``, ``credit_var``, ``_rankdata_average_ties``, ``_pearsonr``,
``credit_fidelity``, ``influence_mi``)."""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter

import numpy as np
import pytest
import torch

from teamrl.algos import c3


# ---------------------------------------------------------------- the transcription
def ref_provider(node_rewards: list[list[float]], baseline_mode: str) -> list[torch.Tensor]:
    out = []
    for rewards in node_rewards:
        n = len(rewards)
        if n <= 1:
            adv = torch.zeros((n,), dtype=torch.float32)
        else:
            r = torch.tensor(rewards, dtype=torch.float32)
            if baseline_mode == "loo":
                base = (r.sum() - r) / float(n - 1)
            else:
                base = r.mean().expand_as(r)
            adv = r - base
        out.append(adv)
    return out


def ref_group_mean_std(x: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-8):
    uniq, inv = torch.unique(group_ids.to(torch.long), sorted=True, return_inverse=True)
    g = uniq.shape[0]
    sums = torch.zeros((g,), dtype=x.dtype).scatter_add_(0, inv, x)
    cnts = torch.zeros((g,), dtype=x.dtype).scatter_add_(0, inv, torch.ones_like(x))
    means = sums / cnts.clamp_min(1.0)
    diffs = x - means[inv]
    vsums = torch.zeros((g,), dtype=x.dtype).scatter_add_(0, inv, diffs * diffs)
    vars_ = vsums / cnts.clamp_min(1.0)
    return means[inv], torch.sqrt(vars_ + eps)[inv]


def ref_normalized(node_rewards: list[list[float]], baseline_mode: str) -> torch.Tensor:
    scalar = torch.cat(ref_provider(node_rewards, baseline_mode)).float()
    ids = torch.tensor([g for g, rs in enumerate(node_rewards) for _ in rs])
    m2, s2 = ref_group_mean_std(scalar, ids)
    return (scalar - m2) / s2.clamp_min(1e-8)


def ref_loo_np(values: np.ndarray) -> np.ndarray:
    n = int(values.size)
    if n <= 1:
        return values.astype(np.float64, copy=True)
    w = np.ones((n,), dtype=np.float64)
    sw, sv = float(np.sum(w)), float(np.sum(w * values))
    return np.array([(sv - w[j] * values[j]) / (sw - w[j]) for j in range(n)])


def ref_credit_var(bar_r: list[float]) -> float:
    r = np.asarray(bar_r, dtype=np.float64)
    if r.size <= 1:
        return 0.0
    a = r - ref_loo_np(r)
    return float(np.var(a, ddof=0))


def ref_rank(x: np.ndarray) -> np.ndarray:
    n = int(x.size)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty((n,), dtype=np.float64)
    i = 0
    while i < n:
        j = i
        while j + 1 < n and x[order[j + 1]] == x[order[i]]:
            j += 1
        ranks[order[i: j + 1]] = (i + 1 + j + 1) / 2.0
        i = j + 1
    return ranks


def ref_fidelity(a: list[float], d: list[float]) -> float:
    if len(a) < 2:
        return 0.0
    ra, rd = ref_rank(np.asarray(a)), ref_rank(np.asarray(d))
    a0, b0 = ra - ra.mean(), rd - rd.mean()
    da, db = float(np.dot(a0, a0)), float(np.dot(b0, b0))
    if da <= 0.0 or db <= 0.0:
        return 0.0
    return max(-1.0, min(1.0, float(np.dot(a0, b0) / math.sqrt(da * db))))


def ref_influence(ys_by_j: list[list[str]], top_k: int = 64, alpha: float = 1.0) -> float:
    n_j = len(ys_by_j)
    if n_j <= 1:
        return 0.0
    sym_by_j, total = [], Counter()
    n_by_j = np.zeros((n_j,), dtype=np.float64)
    for j, ys in enumerate(ys_by_j):
        syms = [hashlib.sha1(c3.canonical(y).encode("utf-8")).hexdigest()[:16] for y in ys]
        sym_by_j.append(syms)
        total.update(syms)
        n_by_j[j] = float(len(syms))
    t = float(np.sum(n_by_j))
    if t <= 0.0:
        return 0.0
    vocab = [s for s, _ in total.most_common(top_k)]
    bins = vocab + ["OTHER"]
    index = {y: i for i, y in enumerate(bins)}
    v = len(bins)
    p_j = n_by_j / t
    counts = np.zeros((n_j, v))
    for j in range(n_j):
        for sy in sym_by_j[j]:
            counts[j, index[sy if sy in set(vocab) else "OTHER"]] += 1.0
    p_y_j = (counts + alpha) / np.maximum(n_by_j[:, None] + alpha * v, 1e-12)
    p_y = np.maximum(np.sum(p_j[:, None] * p_y_j, axis=0), 1e-300)
    ratio = np.maximum(p_y_j, 1e-300) / p_y[None, :]
    return max(0.0, float(np.sum(p_j[:, None] * p_y_j * np.log(ratio))))


# ---------------------------------------------------------------- the checks
def random_groups(rng: random.Random) -> list[list[float]]:
    return [[float(rng.choice([0.0, 0.25, 0.5, 1.0])) for _ in range(rng.choice([1, 2, 3, 4, 8]))]
            for _ in range(rng.randint(1, 6))]


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("mode", ["loo", "full_mean"])
def test_sibling_advantages_match_c3s_provider_then_its_group_normalisation(seed, mode):
    groups = random_groups(random.Random(seed))
    ids = torch.tensor([g for g, rs in enumerate(groups) for _ in rs])
    r = torch.tensor([x for rs in groups for x in rs])
    baseline = {"loo": "leave_one_out", "full_mean": "mean"}[mode]
    raw = c3.sibling_advantages(r, ids, baseline=baseline, normalize=False)
    assert torch.allclose(raw.float(), torch.cat(ref_provider(groups, mode)), atol=1e-6)
    ours = c3.sibling_advantages(r, ids, baseline=baseline, eps=1e-8)
    assert torch.allclose(ours.float(), ref_normalized(groups, mode), atol=1e-4)


def test_sibling_advantages_by_hand():
    """Siblings 1, 0, 0, 1 under one parent: LOO a = 1 - 1/3 = 2/3 (x2) and 0 - 2/3 (x2); z-scored: +-1 (their
    population std is 2/3); a lone node gets 0."""
    r, g = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.7]), torch.tensor([0, 0, 0, 0, 1])
    assert c3.sibling_advantages(r, g, normalize=False).tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0])
    assert c3.sibling_advantages(r, g).tolist() == pytest.approx([1.0, -1.0, -1.0, 1.0, 0.0], abs=1e-6)


def test_subtree_means_average_the_leaves_below_each_node():
    """Fanout [2, 2]: leaves (0,0)=1, (0,1)=0, (1,0)=1, (1,1)=1 -> nodes (0,) 0.5 and (1,) 1; a leaf is its own."""
    leaves = [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert c3.subtree_means([(0,), (1,), *leaves], leaves, [1.0, 0.0, 1.0, 1.0]) == [0.5, 1.0, 1.0, 0.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="no leaf"):
        c3.subtree_means([(2,)], leaves, [1.0, 0.0, 1.0, 1.0])


@pytest.mark.parametrize("seed", range(10))
def test_the_diagnostics_match_c3s_analysis(seed):
    rng = random.Random(seed)
    bar_r = [rng.choice([0.0, 0.5, 1.0]) for _ in range(rng.randint(1, 6))]
    assert c3.credit_var(bar_r) == pytest.approx(ref_credit_var(bar_r), abs=1e-12)
    a = [rng.choice([-1.0, 0.0, 0.3, 1.0]) for _ in range(rng.randint(0, 12))]
    d = [rng.choice([-0.5, 0.0, 0.5]) for _ in a]
    assert c3.spearman(a, d) == pytest.approx(ref_fidelity(a, d), abs=1e-12)
    ys = [[rng.choice(["x = 1", "x  =  1", "```\ny\n```", "z"]) for _ in range(rng.randint(0, 4))]
          for _ in range(rng.randint(1, 4))]
    assert c3.influence_mi(ys) == pytest.approx(ref_influence(ys), abs=1e-12)
    assert c3.influence_mi(ys, top_k=1) == pytest.approx(ref_influence(ys, top_k=1), abs=1e-12)


def test_influence_is_zero_when_the_next_reply_ignores_the_candidate_and_positive_when_it_follows_it():
    assert c3.influence_mi([["a", "b"], ["a", "b"], ["a", "b"]]) == pytest.approx(0.0, abs=1e-12)
    # by hand: bins a, b, c, OTHER; p(y|j) = (2 + 1) / (2 + 4) = 1/2 on its own reply, 1/6 elsewhere; p(y) = 5/18 for
    # a, b, c and 1/6 for OTHER: I = 1/2 ln(1.8) + 1/3 ln(0.6)
    assert c3.influence_mi([["a", "a"], ["b", "b"], ["c", "c"]]) == pytest.approx(0.5 * math.log(1.8)
                                                                                  + math.log(0.6) / 3, rel=1e-12)


def test_sibling_groups_key_on_the_problem_and_the_parent_path():
    ids = c3.sibling_groups([0, 0, 0, 0, 1, 1], [(0,), (1,), (0, 0), (0, 1), (0,), (0, 0)])
    assert ids.tolist() == [0, 0, 1, 1, 2, 3]
    with pytest.raises(ValueError, match="outside the prefix tree"):
        c3.sibling_groups([0], [()])
