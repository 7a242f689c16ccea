"""teamrl.algos.advantages: properties that hold on every generated batch."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from teamrl.algos.advantages import (
    compute_advantages,
    get_estimator,
    group_ids_for,
)
from tests.algos.advhelpers import FAST

# ---------------------------------------------------------------- properties

rewards_st = st.floats(-10, 10, allow_nan=False, width=32)


@st.composite
def joint_team_batch(draw):
    """Every agent acts exactly once per episode; every row carries the episode's reward."""
    n_prompts = draw(st.integers(1, 3))
    n_agents = draw(st.integers(1, 3))
    prompts, agents, episodes, rewards = [], [], [], []
    ep = 0
    for p in range(n_prompts):
        for _ in range(draw(st.integers(1, 5))):
            value = draw(rewards_st)
            for a in range(n_agents):
                prompts.append(p)
                agents.append(a)
                episodes.append(ep)
                rewards.append(value)
            ep += 1
    perm = draw(st.permutations(range(len(rewards))))
    pick = lambda xs: torch.tensor([xs[i] for i in perm])  # noqa: E731
    return pick(prompts), pick(agents), pick(episodes), pick(rewards).float()


@FAST
@given(joint_team_batch())
def test_drmas_equals_grpo_under_joint_reward_once_per_episode(batch):
    p, a, e, r = batch
    z = torch.zeros_like(p)
    outs = []
    for name in ("grpo", "drmas"):
        est = get_estimator(name)
        g = group_ids_for(est.scope, prompt_ids=p, agent_ids=a, turn_ids=z)
        outs.append(compute_advantages(r, g, e, unit=est.unit, center=est.center, scale=est.scale))
    assert torch.equal(outs[0], outs[1])


@st.composite
def grouped_batch(draw, max_rows: int = 24):
    n = draw(st.integers(1, max_rows))
    groups = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    episodes = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    rewards = draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n))
    return (torch.tensor(rewards, dtype=torch.float64), torch.tensor(groups),
            torch.tensor(episodes))


knobs = st.tuples(st.sampled_from(("step", "episode")), st.sampled_from(("mean", "leave_one_out")),
                  st.sampled_from(("std", "none", "batch_std")))


@FAST
@given(st.lists(rewards_st, min_size=1, max_size=4), knobs)
def test_group_of_one_is_zero(values, knob):
    # one sample -> every row 0: a single row (unit=step), or a single episode
    # with several rows (unit=episode)
    unit, center, scale = knob
    if unit == "step":
        values = values[:1]
    n = len(values)
    out = compute_advantages(torch.tensor(values), torch.zeros(n, dtype=torch.long),
                             torch.zeros(n, dtype=torch.long), unit=unit, center=center,
                             scale=scale)
    assert out.tolist() == [0.0] * n


@FAST
@given(rewards_st, st.integers(1, 12), st.data(), knobs)
def test_all_equal_rewards_give_exact_zero(value, n, data, knob):
    unit, center, scale = knob
    episodes = torch.tensor(data.draw(st.lists(st.integers(0, 4), min_size=n, max_size=n)))
    out = compute_advantages(torch.full((n,), value), torch.zeros(n, dtype=torch.long), episodes,
                             unit=unit, center=center, scale=scale)
    assert out.tolist() == [0.0] * n


@FAST
@given(grouped_batch(), st.sampled_from(("std", "none")))
def test_step_mean_sums_to_zero_per_group(batch, scale):
    r, g, e = batch
    out = compute_advantages(r, g, e, unit="step", center="mean", scale=scale)
    sums = torch.zeros(4, dtype=out.dtype).index_add_(0, g, out)
    assert torch.allclose(sums, torch.zeros(4, dtype=out.dtype), atol=1e-9)


@FAST
@given(grouped_batch(), knobs, st.randoms(use_true_random=False))
def test_permuting_rows_permutes_advantages(batch, knob, rnd):
    r, g, e = batch
    unit, center, scale = knob
    perm = list(range(r.numel()))
    rnd.shuffle(perm)
    perm = torch.tensor(perm)
    kw = dict(unit=unit, center=center, scale=scale)
    base = compute_advantages(r, g, e, **kw)
    permuted = compute_advantages(r[perm], g[perm], e[perm], **kw)
    assert torch.equal(permuted, base[perm])


@FAST
@given(grouped_batch(), st.sampled_from(("step", "episode")), st.floats(0.1, 10),
       st.floats(-10, 10))
def test_mean_std_is_affine_invariant(batch, unit, c, d):
    r, g, e = batch
    kw = dict(unit=unit, center="mean", scale="std", eps=1e-12)
    base = compute_advantages(r, g, e, **kw)
    moved = compute_advantages(r * c + d, g, e, **kw)
    assert torch.allclose(moved, base, rtol=1e-6, atol=1e-6)
