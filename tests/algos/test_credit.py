"""Shapley credit and the overlong penalty: hand-computed cases and the Shapley axioms."""

from __future__ import annotations

import doctest
import itertools
import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from teamrl.algos import credit as credit_mod
from teamrl.algos.credit import coalitions_needed, overlong_penalty, sample_orderings, shapley_values

FAST = settings(max_examples=40, deadline=None)


def table(values: dict[str, float]):
    """Value function from {"": v0, "A": ..., "AB": ...} with players A=0, B=1, C=2."""
    lut = {frozenset("ABC".index(ch) for ch in key): v for key, v in values.items()}
    return lut.__getitem__


def test_doctests():
    assert doctest.testmod(credit_mod).failed == 0


def test_two_agents_by_hand():
    # phi_A = 1/2 [(v(A) - v()) + (v(AB) - v(B))] = 1/2 [0.2 + 0.6] = 0.4
    # phi_B = 1/2 [(v(B) - v()) + (v(AB) - v(A))] = 1/2 [0.4 + 0.8] = 0.6
    v = table({"": 0.0, "A": 0.2, "B": 0.4, "AB": 1.0})
    phi = shapley_values(2, v)
    assert phi == pytest.approx([0.4, 0.6], abs=1e-12)
    assert sum(phi) == pytest.approx(1.0)  # efficiency: v(AB) - v()


def test_three_agents_by_hand():
    # v = 0 for singletons and BC, 0.6 for AB and AC, 1 for ABC. Weights |S|=0: 1/3, 1: 1/6, 2: 1/3.
    # phi_A = 1/6 (0.6 - 0) + 1/6 (0.6 - 0) + 1/3 (1 - 0) = 0.1 + 0.1 + 0.3333 = 8/15
    # phi_B = 1/6 (v(AB) - v(A)) + 1/6 (v(BC) - v(C)) + 1/3 (v(ABC) - v(AC)) = 0.1 + 0 + 0.4/3 = 7/30 = phi_C
    v = table({"": 0.0, "A": 0.0, "B": 0.0, "C": 0.0, "AB": 0.6, "AC": 0.6, "BC": 0.0, "ABC": 1.0})
    phi = shapley_values(3, v)
    assert phi == pytest.approx([8 / 15, 7 / 30, 7 / 30], abs=1e-12)
    assert sum(phi) == pytest.approx(1.0)
    assert phi[1] == phi[2]  # symmetry: B and C add the same to every coalition


def test_three_agents_null_player_and_nonzero_empty_value():
    # C never changes the value; v() = 0.5, so the credits sum to v(ABC) - v() = 0.5
    base = {"": 0.5, "A": 1.0, "B": 0.5, "AB": 1.0}
    v = table({**base, **{k + "C": x for k, x in base.items()}})
    phi = shapley_values(3, v)
    # A: 1/2 [(1 - .5) + (1 - .5)] = .5 (B adds nothing either), B: 0, C: 0
    assert phi == pytest.approx([0.5, 0.0, 0.0], abs=1e-12)


@st.composite
def games(draw):
    n = draw(st.integers(1, 5))
    values = draw(st.lists(st.floats(-2, 2, allow_nan=False), min_size=2**n, max_size=2**n))
    lut = {c: values[i] for i, c in enumerate(coalitions_needed(n))}
    return n, lut


@FAST
@given(games())
def test_efficiency_exact_and_sampled(game):
    n, lut = game
    gap = lut[frozenset(range(n))] - lut[frozenset()]
    assert math.fsum(shapley_values(n, lut.__getitem__)) == pytest.approx(gap, abs=1e-9)
    orders = sample_orderings(n, 7, seed=3)
    assert math.fsum(shapley_values(n, lut.__getitem__, orders)) == pytest.approx(gap, abs=1e-9)


@FAST
@given(games(), st.data())
def test_null_player_gets_zero(game, data):
    n, lut = game
    k = data.draw(st.integers(0, n - 1))
    nulled = {c: lut[c - {k}] for c in lut}  # v(S) = v(S without k)
    assert shapley_values(n, nulled.__getitem__)[k] == pytest.approx(0.0, abs=1e-9)
    assert shapley_values(n, nulled.__getitem__, sample_orderings(n, 5, seed=1))[k] == pytest.approx(0.0, abs=1e-9)


@FAST
@given(st.integers(2, 5), st.lists(st.floats(-2, 2, allow_nan=False), min_size=6, max_size=6), st.data())
def test_symmetric_players_get_equal_credit(n, by_size, data):
    i, j = data.draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=2, unique=True))
    # v depends on |S| and on whether i or j (not both) is in S: swapping i and j changes nothing
    v = lambda c: by_size[len(c)] + 0.3 * ((i in c) + (j in c))  # noqa: E731
    phi = shapley_values(n, v)
    assert phi[i] == pytest.approx(phi[j], abs=1e-12)


@FAST
@given(games())
def test_averaging_over_every_ordering_is_exact(game):
    n, lut = game
    every = list(itertools.permutations(range(n)))
    assert shapley_values(n, lut.__getitem__, every) == pytest.approx(shapley_values(n, lut.__getitem__), abs=1e-9)


def test_sampling_converges_to_exact():
    # 4 players, a non-additive game: exact credits 4.75, 4, 4, 4.75. A marginal contribution lies in
    # [0, 8.5], so its std is <= 4.25 and the mean of 4000 orderings has std <= 0.067: 0.2 is 3 sigma,
    # well below the 0.75 gap between players 0/3 and 1/2.
    v = lambda c: float(len(c) ** 2) + (1.5 if {0, 3} <= c else 0.0)  # noqa: E731
    exact = shapley_values(4, v)
    assert exact == pytest.approx([4.75, 4.0, 4.0, 4.75])
    sampled = shapley_values(4, v, sample_orderings(4, 4000, seed=0))
    assert sampled == pytest.approx(exact, abs=0.2)
    assert sample_orderings(4, 10, seed=5) == sample_orderings(4, 10, seed=5)


def test_sampled_value_reads_only_the_prefixes():
    orders = [(2, 0, 1), (0, 1, 2)]
    needed = set(coalitions_needed(3, orders))
    assert needed == {frozenset(), frozenset({2}), frozenset({0, 2}), frozenset({0}), frozenset({0, 1}),
                      frozenset({0, 1, 2})}
    shapley_values(3, lambda c: (_ for _ in ()).throw(KeyError(c)) if c not in needed else 1.0, orders)


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="not a permutation"):
        shapley_values(3, lambda c: 0.0, [(0, 1)])
    with pytest.raises(ValueError, match="at least one player"):
        shapley_values(0, lambda c: 0.0)
    with pytest.raises(ValueError, match="samples >= 1"):
        sample_orderings(3, 0, seed=0)


def test_overlong_penalty_by_hand():
    # limit 16, buffer 4 -> free up to 12; 13 -> -0.25; 14 -> -0.5; 16 -> -1 (x penalty 0.5)
    out = overlong_penalty(torch.tensor([5, 12, 13, 14, 16]), torch.full((5,), 16), buffer=4, penalty=0.5)
    assert out.tolist() == [0.0, 0.0, -0.125, -0.25, -0.5]
    assert overlong_penalty(torch.tensor([16]), torch.tensor([16]), buffer=0).tolist() == [0.0]
    with pytest.raises(ValueError, match="longer than a reply limit"):
        overlong_penalty(torch.tensor([3]), torch.tensor([4]), buffer=8)


# MARTI's reward_alloc shaping of tree node rewards (docs/fidelity.md).

from teamrl.algos.credit import shape_tree_rewards  # noqa: E402


def _tree():
    """Two trees. Tree 0: nodes a, b children of the root; c, d children of a; e child of c.
    Tree 1: a single node f."""
    rewards = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0, 1.0])
    trees = torch.tensor([0, 0, 0, 0, 0, 1])
    parents = torch.tensor([-1, -1, 0, 0, 2, -1])
    return rewards, trees, parents


def test_margin_shaping_by_hand():
    # tree 0: a keeps 0; b: 1 + .5 (1 - 0) = 1.5; c: 1 + .5 (1 - 1/2) = 1.25; d: 0 + .5 (0 - 2/3) = -1/3;
    # e: 1 + .5 (1 - 2/4) = 1.25. Tree 1: f is its tree's first node, keeps 1.
    out = shape_tree_rewards(*_tree(), method="margin", alpha=0.5)
    assert out.tolist() == pytest.approx([0.0, 1.5, 1.25, -1 / 3, 1.25, 1.0])


def test_tree_shaping_by_hand():
    # a, b: root children, siblings only: a = 0 + .5 (0 - 1) = -.5, b = 1 + .5 (1 - 0) = 1.5
    # c, d: children of a (shaped -.5), siblings of each other; beta .25: b_c = .75 (-.5) + .25 (0) = -.375,
    #   c = 1 + .5 (1.375) = 1.6875; b_d = .75 (-.5) + .25 (1) = -.125, d = 0 + .5 (.125) = .0625
    # e: only child of c (shaped 1.6875): 1 + .5 (1 - 1.6875) = .65625; f: only child of the root, keeps 1
    out = shape_tree_rewards(*_tree(), method="tree", alpha=0.5, beta=0.25)
    assert out.tolist() == [-0.5, 1.5, 1.6875, 0.0625, 0.65625, 1.0]


def _marti_tree(trajectories, local_rewards, gamma, lambda_mix):
    """MARTI's tree_reward_shaping_unified as docs/fidelity.md writes it: in place, float32, sets in order."""
    import numpy as np

    local_rewards = np.asarray(local_rewards, dtype=np.float32)
    for b, traj in enumerate(trajectories):
        index = {node["turn_id"]: t for t, node in enumerate(traj)}
        children: dict[int, list[int]] = {}
        for t, node in enumerate(traj):
            children.setdefault(node["parent_idx"], []).append(t)
        for parent_id, kids in children.items():
            parent = local_rewards[b][index[parent_id]] if parent_id != -1 else None
            rewards = np.array([local_rewards[b][t] for t in kids])
            for t in kids:
                r = local_rewards[b][t]
                sib = (rewards.sum() - r) / (len(kids) - 1) if len(kids) > 1 else None
                if parent is not None and sib is not None:
                    base = (1 - lambda_mix) * parent + lambda_mix * sib
                elif parent is not None or sib is not None:
                    base = parent if parent is not None else sib
                else:
                    continue
                local_rewards[b][t] += gamma * (r - base)
    return local_rewards


def _mars2_margin(local_rewards, alpha):
    """The MARS2 commit's margin shaping as docs/fidelity.md writes it (turn ids 0..T-1, so it starts at 1)."""
    import numpy as np

    raw = np.asarray(local_rewards, dtype=np.float32)
    out = raw.copy()
    for m in range(raw.shape[0]):
        for t in range(1, raw.shape[1]):
            out[m][t] = raw[m][t] + alpha * (raw[m][t] - np.mean(raw[m][:t]))
    return out


def _random_trees(seed: int, trees: int, nodes: int):
    rng = random.Random(seed)
    rewards, tree_ids, parents, trajectories = [], [], [], []
    for t in range(trees):
        traj = []
        for k in range(nodes):
            p = rng.choice([-1, *range(k)]) if k else -1
            traj.append({"turn_id": k, "parent_idx": p})
            rewards.append(float(rng.random() < 0.5))
            tree_ids.append(t)
            parents.append(p + t * nodes if p >= 0 else -1)
        trajectories.append(traj)
    return rewards, tree_ids, parents, trajectories


@pytest.mark.parametrize("alpha, beta", [(0.5, 0.5), (0.3, 0.8), (1.0, 0.0)])
def test_shapings_match_the_marti_code(alpha, beta):
    for seed in range(10):
        rewards, tree_ids, parents, trajectories = _random_trees(seed, trees=3, nodes=7)
        table = [rewards[t * 7:(t + 1) * 7] for t in range(3)]  # MARTI's [trees, nodes] array
        ours = shape_tree_rewards(torch.tensor(rewards), torch.tensor(tree_ids), torch.tensor(parents),
                                  method="tree", alpha=alpha, beta=beta)
        assert ours.tolist() == pytest.approx(_marti_tree(trajectories, table, alpha, beta).flatten().tolist(), abs=1e-6)
        ours = shape_tree_rewards(torch.tensor(rewards), torch.tensor(tree_ids), torch.tensor(parents),
                                  method="margin", alpha=alpha, beta=beta)
        assert ours.tolist() == pytest.approx(_mars2_margin(table, alpha).flatten().tolist(), abs=1e-6)


def test_shaping_checks_its_inputs():
    r, t = torch.zeros(2), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="earlier row"):
        shape_tree_rewards(r, t, torch.tensor([1, -1]), method="tree")
    with pytest.raises(ValueError, match="reward_alloc"):
        shape_tree_rewards(r, t, torch.tensor([-1, 0]), method="quality")
    with pytest.raises(ValueError, match="beta"):
        shape_tree_rewards(r, t, torch.tensor([-1, 0]), method="tree", beta=2.0)
