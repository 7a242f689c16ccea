"""teamrl.algos.advantages against the reference code it follows: the Dr. MAS code's GRPO baseline and MAGRPO's single-turn baseline (CoMLRL)."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from teamrl.algos.advantages import (
    apply_format_penalty,
    compute_advantages,
    get_estimator,
    group_ids_for,
)
from tests.algos.advhelpers import FAST, close, run_preset

# ---------------------------------------------------------------- the Dr. MAS code's GRPO baseline


def drmas_code_reference(scores, prompts, agents, episodes, per_agent: bool, eps: float = 1e-6):
    """The episode-level normalization of the Dr. MAS code, written with plain Python loops.

    Each call's score is its reward minus its own format penalty. A trajectory (the calls of one
    episode, or of one agent in one episode when ``per_agent``) is scored by the mean of its
    calls' scores; every call of the trajectory gets (trajectory mean - mean of the group's
    trajectory means) / (unbiased std of those means + eps). Groups of one trajectory are left
    out here (the code gives the raw score, teamrl 0; see docs/advantages.md).
    """
    traj: dict[tuple, list[float]] = {}
    for s, p, a, e in zip(scores, prompts, agents, episodes):
        traj.setdefault((p, a if per_agent else None, e), []).append(s)
    means = {k: sum(v) / len(v) for k, v in traj.items()}
    groups: dict[tuple, list[float]] = {}
    for (p, a, _), m in means.items():
        groups.setdefault((p, a), []).append(m)
    out = []
    for p, a, e in zip(prompts, agents, episodes):
        key = (p, a if per_agent else None)
        xs = groups[key]
        if len(xs) < 2:
            out.append(None)
            continue
        mu = sum(xs) / len(xs)
        sd = math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1))
        out.append((means[(p, key[1], e)] - mu) / (sd + eps))
    return out


@st.composite
def per_agent_table(draw):
    """Random per-agent rewards with format penalties; agents act 1-3 times per episode."""
    prompts, agents, episodes, rewards, valid = [], [], [], [], []
    ep = 0
    for p in range(draw(st.integers(1, 3))):
        for _ in range(draw(st.integers(2, 5))):
            for a in range(draw(st.integers(1, 3))):
                for _ in range(draw(st.integers(1, 3))):
                    prompts.append(p)
                    agents.append(a)
                    episodes.append(ep)
                    rewards.append(draw(st.sampled_from((0.0, 0.25, 1.0, 3.0))))
                    valid.append(draw(st.booleans()))
            ep += 1
    return prompts, agents, episodes, rewards, valid


@settings(max_examples=60, deadline=None)
@given(per_agent_table(), st.sampled_from((0.1, 0.5)))
def test_episode_unit_matches_the_drmas_code(table, penalty):
    prompts, agents, episodes, rewards, valid = table
    r = apply_format_penalty(torch.tensor(rewards, dtype=torch.float64), torch.tensor(valid), penalty=penalty)
    p, a, e = torch.tensor(prompts), torch.tensor(agents), torch.tensor(episodes)
    for name, per_agent in (("grpo", False), ("agent_episode", True)):
        est = get_estimator(name)
        g = group_ids_for(est.scope, prompt_ids=p, agent_ids=a, turn_ids=torch.zeros_like(p))
        ours = compute_advantages(r, g, e, unit=est.unit, center=est.center, scale=est.scale)
        ref = drmas_code_reference(r.tolist(), prompts, agents, episodes, per_agent)
        groups_sd = {}
        for i, x in enumerate(ref):
            if x is None:
                assert ours[i] == 0.0  # group of one trajectory: teamrl's documented difference
            else:
                groups_sd.setdefault(int(g[i]), []).append(i)
        for rows in groups_sd.values():
            vals = [ref[i] for i in rows]
            if max(vals) - min(vals) < 1e-9:  # tied trajectory means: teamrl gives exactly 0
                assert all(ours[i] == 0.0 for i in rows)
            else:
                torch.testing.assert_close(ours[rows], torch.tensor(vals, dtype=ours.dtype), rtol=1e-6, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(per_agent_table(), st.sampled_from(("grpo", "agent_episode")))
def test_episode_unit_advantages_are_bounded(table, name):
    # every row of a group takes one of its n samples' z-scores, so |A| <= (n - 1) / sqrt(n)
    prompts, agents, episodes, rewards, valid = table
    r = apply_format_penalty(torch.tensor(rewards, dtype=torch.float64), torch.tensor(valid), penalty=0.1)
    p, a, e = torch.tensor(prompts), torch.tensor(agents), torch.tensor(episodes)
    est = get_estimator(name)
    g = group_ids_for(est.scope, prompt_ids=p, agent_ids=a, turn_ids=torch.zeros_like(p))
    out = compute_advantages(r, g, e, unit=est.unit, center=est.center, scale=est.scale)
    for gid in g.unique():
        rows = g == gid
        n = len(set(e[rows].tolist()))
        assert out[rows].abs().max() <= (n - 1) / math.sqrt(n) + 1e-9


# ---------------------------------------------------------------- MAGRPO's single-turn baseline (CoMLRL)


def magrpo_code_reference(joint_rewards: list[float]) -> list[float]:
    """CoMLRL's ``_compute_loss_with_gradients`` (comlrl/trainers/magrpo.py:1425-1432 at 5db17bb, with
    LLM_Collab_Code_Generation@9331ca2's single-turn HumanEval config): one prompt's K joint rewards, the same
    for every agent; advantage = reward - their mean, clamped to [-10, 10]; no standard deviation."""
    mean = sum(joint_rewards) / len(joint_rewards)
    return [min(10.0, max(-10.0, r - mean)) for r in joint_rewards]


@FAST
@given(st.lists(st.lists(st.sampled_from([0.0, 0.4, 1.0, 1.5, 2.0, 2.5, 3.25, 4.0]), min_size=2, max_size=6),
                min_size=1, max_size=4))
def test_dr_grpo_on_a_code_pair_batch_matches_the_magrpo_code(prompts_rewards):
    # rows as code_pair gives them: per prompt K episodes, each with an aux and a main row holding the joint reward
    rewards, episodes, agents, turns, prompts, ref = [], [], [], [], [], []
    for p, joint in enumerate(prompts_rewards):
        expected = magrpo_code_reference(joint)
        for k, r in enumerate(joint):
            for agent in (0, 1):
                rewards.append(r)
                episodes.append(len(episodes) // 2)
                agents.append(agent)
                turns.append(0)
                prompts.append(p)
                ref.append(expected[k])
    out = run_preset("dr_grpo", rewards, episodes, agents, turns, prompts)
    torch.testing.assert_close(out, torch.tensor(ref, dtype=out.dtype), rtol=0, atol=1e-12)
    # a hand-computed prompt: joint rewards 4, 2.5, 1, 0.5 (mean 2): both agents' rows get 2, 0.5, -1, -1.5
    close(run_preset("dr_grpo", [4, 4, 2.5, 2.5, 1, 1, 0.5, 0.5], [0, 0, 1, 1, 2, 2, 3, 3], [0, 1] * 4, [0] * 8),
          [2, 2, 0.5, 0.5, -1, -1, -1.5, -1.5])
