"""teamrl.algos.advantages: every preset on hand-computed batches, the rules at the edges, and input validation."""

from __future__ import annotations

import doctest
import math

import pytest
import torch

from teamrl.algos import advantages as adv_mod
from teamrl.algos.advantages import (
    PRESETS,
    Estimator,
    apply_format_penalty,
    compute_advantages,
    get_estimator,
    group_ids_for,
    register_estimator,
    reward_to_go,
)
from tests.algos.advhelpers import S3, close, run_preset

# The team batch used by the hand-computed tests and docs/advantages.md:
# one prompt, three episodes, agents A=0 and B=1; A acts twice in episode 0.
# row:       0  1  2  3  4  5  6
# episode:   0  0  0  1  1  2  2
# agent:     A  A  B  A  B  A  B
# turn:      0  1  1  0  1  0  1
# reward:    1  1  1  1  0  0  0
TEAM = dict(
    rewards=[1, 1, 1, 1, 0, 0, 0],
    episodes=[0, 0, 0, 1, 1, 2, 2],
    agents=[0, 0, 1, 0, 1, 0, 1],
    turns=[0, 1, 1, 0, 1, 0, 1],
)


# ---------------------------------------------------------------- single-group presets


def test_grpo_single_group():
    # rewards [1,0,1,1], one episode each: mean .75, unbiased std 0.5
    # (1-.75)/.5 = .5 ; (0-.75)/.5 = -1.5
    out = run_preset("grpo", [1, 0, 1, 1], [0, 1, 2, 3], [0] * 4, [0] * 4)
    close(out, [0.5, -1.5, 0.5, 0.5])


def test_rloo_single_group():
    # leave-one-out baselines: row0 mean(0,1,1)=2/3 -> 1/3 ; row1 mean(1,1,1)=1 -> -1
    out = run_preset("rloo", [1, 0, 1, 1], [0, 1, 2, 3], [0] * 4, [0] * 4)
    close(out, [1 / 3, -1.0, 1 / 3, 1 / 3])


def test_dr_grpo_single_group():
    # mean .75, no division: .25, -.75
    out = run_preset("dr_grpo", [1, 0, 1, 1], [0, 1, 2, 3], [0] * 4, [0] * 4)
    close(out, [0.25, -0.75, 0.25, 0.25])


def test_reinforce_pp_batch_std_two_prompts():
    # prompt 0 rewards [1,0] -> centered [.5,-.5]; prompt 1 rewards [2,2] -> tie -> [0,0]
    # batch centered values [.5,-.5,0,0]: mean 0, unbiased var (.25+.25)/3 = 1/6
    # -> std sqrt(1/6) = .408248 ; .5/.408248 = 1.224745
    out = run_preset("reinforce_pp", [1, 0, 2, 2], [0, 1, 2, 3], [0] * 4, [0] * 4, [0, 0, 1, 1])
    close(out, [1.224745, -1.224745, 0.0, 0.0])


# ---------------------------------------------------------------- team batch, every preset


def test_team_grpo():
    # episode means: ep0 (1+1+1)/3=1, ep1 (1+0)/2=.5, ep2 0 -> mean .5, std .5
    # every row of an episode gets its episode's advantage (the Dr. MAS code's GRPO):
    # ep0 (1-.5)/.5 = 1 ; ep1 (.5-.5)/.5 = 0 ; ep2 -1
    close(run_preset("grpo", **TEAM), [1, 1, 1, 0, 0, -1, -1])


def test_team_grpo_step():
    # 7 rows: four 1s, three 0s -> mean 4/7, var (4*(3/7)^2 + 3*(4/7)^2)/6 = 2/7
    # 1 -> (3/7)/sqrt(2/7) = .801784 ; 0 -> -(4/7)/sqrt(2/7) = -1.069045
    hi, lo = (3 / 7) / math.sqrt(2 / 7), -(4 / 7) / math.sqrt(2 / 7)
    close(run_preset("grpo_step", **TEAM), [hi, hi, hi, hi, lo, lo, lo])


def test_team_agent_episode():
    # A samples per episode: ep0 mean(1,1)=1, ep1 1, ep2 0 -> mean 2/3, std sqrt(1/3)
    #   1 -> (1/3)/sqrt(1/3) = .57735 ; 0 -> -(2/3)/sqrt(1/3) = -1.1547
    # B samples: 1, 0, 0 -> mean 1/3, std sqrt(1/3): 1 -> 1.1547 ; 0 -> -.57735
    out = run_preset("agent_episode", **TEAM)
    close(out, [S3, S3, 2 * S3, S3, -S3, -2 * S3, -S3])


def test_team_drmas():
    # A rows [1,1,1,0] (A counts twice in ep0): mean .75, std .5 -> .5 / -1.5
    # B rows [1,0,0]: mean 1/3, std sqrt(1/3) -> 1.1547 / -.57735
    out = run_preset("drmas", **TEAM)
    close(out, [0.5, 0.5, 2 * S3, 0.5, -S3, -1.5, -S3])


def test_team_unit_and_scope_matter():
    # episode vs step differ for agent A (acts twice in ep0); prompt vs prompt+agent differ
    ep = run_preset("agent_episode", **TEAM)
    st_ = run_preset("drmas", **TEAM)
    glob = run_preset("grpo_step", **TEAM)
    assert not torch.allclose(ep[[0, 1, 3, 5]], st_[[0, 1, 3, 5]])
    assert torch.allclose(ep[[2, 4, 6]], st_[[2, 4, 6]])  # B acts once per episode
    assert not torch.allclose(glob, st_)


def test_team_agent_turn():
    # AT-GRPO's (agent, turn) key without its tree sampling
    # (A, t0) rows ep0,ep1,ep2 = [1,1,0] -> .57735, .57735, -1.1547
    # (A, t1) only row 1 -> group of one -> 0
    # (B, t1) rows [1,0,0] -> 1.1547, -.57735, -.57735
    out = run_preset("agent_turn", **TEAM)
    close(out, [S3, 0.0, 2 * S3, S3, -S3, -2 * S3, -S3])


def test_team_magrpo_groups():
    # turn 0: A rows of ep0, ep1, ep2 -> samples [1,1,0] -> .57735, .57735, -1.1547
    # turn 1: ep0 (A=1, B=1) is one sample of value 1; ep1 B 0; ep2 B 0
    #   -> samples [1,0,0] -> ep0 rows 1.1547 each, others -.57735
    out = run_preset("magrpo", **TEAM)
    close(out, [S3, 2 * S3, 2 * S3, S3, -S3, -2 * S3, -S3])


def test_magrpo_with_reward_to_go():
    # two agents act each turn; the turn's joint reward sits on agent 0's row.
    # ep0: t0 0, t1 1 -> rtg t0 = 1, t1 = 1
    # ep1: t0 1, t1 0 -> rtg t0 = 1, t1 = 0
    # ep2: t0 0, t1 0 -> rtg 0, 0
    episodes = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
    agents = [0, 1, 0, 1] * 3
    turns = [0, 0, 1, 1] * 3
    step_r = torch.tensor([0.0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0])
    rtg = reward_to_go(step_r, torch.tensor(episodes), torch.tensor(turns))
    close(rtg, [1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0])
    out = run_preset("magrpo", rtg.tolist(), episodes, agents, turns)
    # turn 0 samples [1,1,0] -> .57735, .57735, -1.1547 ; turn 1 samples [1,0,0]
    close(out, [S3, S3, 2 * S3, 2 * S3, S3, S3, -S3, -S3, -2 * S3, -2 * S3, -S3, -S3])


def test_team_rloo():
    # samples ep0 1, ep1 .5, ep2 0
    # ep0 rows: 1 - mean(.5, 0) = .75 ; ep1 rows: .5 - mean(1, 0) = 0
    # ep2 rows: 0 - mean(1, .5) = -.75
    close(run_preset("rloo", **TEAM), [0.75, 0.75, 0.75, 0.0, 0.0, -0.75, -0.75])


def test_team_dr_grpo():
    # baseline = mean of episode means (1, .5, 0) = .5 ; no division: ep0 .5, ep1 0, ep2 -.5
    close(run_preset("dr_grpo", **TEAM), [0.5, 0.5, 0.5, 0.0, 0.0, -0.5, -0.5])


def test_team_reinforce_pp():
    # centered as dr_grpo: [.5, .5, .5, 0, 0, -.5, -.5], sum .5, mean 1/14
    # squared deviations: 3*(3/7)^2 + 2*(1/14)^2 + 2*(4/7)^2 = 17/14 ; unbiased var 17/84
    # .5 / sqrt(17/84) = 1.111438
    v = 0.5 / math.sqrt(17 / 84)
    close(run_preset("reinforce_pp", **TEAM), [v, v, v, 0, 0, -v, -v])


def test_every_preset_has_a_team_test():
    tested = {"grpo", "grpo_step", "agent_episode", "drmas", "agent_turn", "magrpo", "rloo",
              "dr_grpo", "reinforce_pp"}
    assert tested <= set(PRESETS)


def test_at_grpo_groups_one_agents_candidates_at_one_turn_of_one_tree():
    # prompt 0, trees 0 and 1; agent 0 at turns 0 and 1, agent 1 at turn 0: rows of the same
    # (prompt, tree, agent, turn) share a group, nothing else does.
    p = torch.tensor([0, 0, 0, 0, 0, 0, 0])
    tree = torch.tensor([0, 0, 0, 0, 1, 1, 0])
    agent = torch.tensor([0, 0, 1, 1, 0, 0, 0])
    turn = torch.tensor([0, 0, 0, 0, 0, 0, 1])
    est = get_estimator("at_grpo")
    assert (est.scope, est.unit, est.center, est.scale) == ("tree+agent+turn", "step", "mean", "std")
    groups = group_ids_for(est.scope, prompt_ids=p, agent_ids=agent, turn_ids=turn, tree_ids=tree)
    assert groups.tolist() == [0, 0, 1, 1, 2, 2, 3]
    # rewards [1, 0 | .5, .5 | 0, 1 | 7]: group of two -> +-1/sqrt(2)... (1 - .5)/std([1, 0]) = .5/.7071 = .7071
    adv = compute_advantages(torch.tensor([1.0, 0, .5, .5, 0, 1, 7]), groups, torch.arange(7), unit="step",
                             center="mean", scale="std")
    close(adv, [0.7071068, -0.7071068, 0, 0, -0.7071068, 0.7071068, 0])
    with pytest.raises(ValueError, match="tree_ids"):
        group_ids_for("tree+agent+turn", prompt_ids=p, agent_ids=agent, turn_ids=turn)


def test_tree_scope_uses_prompt_and_tree():
    p = torch.tensor([0, 0, 1, 1])
    tree = torch.tensor([5, 5, 5, 7])
    z = torch.zeros(4, dtype=torch.long)
    assert group_ids_for("tree", prompt_ids=p, agent_ids=z, turn_ids=z, tree_ids=tree).tolist() == [
        0, 0, 1, 2
    ]
    with pytest.raises(ValueError, match="tree_ids"):
        group_ids_for("tree", prompt_ids=p, agent_ids=z, turn_ids=z)


def test_group_ids_first_appearance_order():
    p = torch.tensor([3, 1, 3, 2, 1])
    z = torch.zeros(5, dtype=torch.long)
    assert group_ids_for("prompt", prompt_ids=p, agent_ids=z, turn_ids=z).tolist() == [0, 1, 0, 2, 1]


# ---------------------------------------------------------------- rules and edge cases


def test_center_none_keeps_raw_rewards():
    r = torch.tensor([2.0, 2.0, 3.0])
    g = torch.tensor([0, 0, 1])
    out = compute_advantages(r, g, torch.arange(3), unit="step", center="none", scale="none")
    assert out.tolist() == [2.0, 2.0, 3.0]
    # with scale="std" the tie rule applies: group 0 equal, group 1 single -> 0
    out = compute_advantages(r, g, torch.arange(3), unit="step", center="none", scale="std")
    assert out.tolist() == [0.0, 0.0, 0.0]


def test_episode_unit_tied_samples_are_zero():
    # two episodes whose rows differ but whose means are equal (0.5 and 0.5): std 0 -> 0
    r = torch.tensor([1.0, 0.0, 0.5, 0.5])
    out = compute_advantages(
        r, torch.zeros(4, dtype=torch.long), torch.tensor([0, 0, 1, 1]),
        unit="episode", center="mean", scale="std",
    )
    assert out.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_rounding_level_ties_are_zero():
    # float32 means 0.15000000596 vs 0.15000000223 differ only by input rounding
    r = torch.tensor([0.3, 0.0, 0.1, 0.2], dtype=torch.float32)
    out = compute_advantages(
        r, torch.zeros(4, dtype=torch.long), torch.tensor([0, 0, 1, 1]),
        unit="episode", center="mean", scale="std",
    )
    assert out.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_dtypes_and_empty():
    g = torch.zeros(3, dtype=torch.long)
    out = compute_advantages(torch.tensor([1, 0, 1]), g, torch.arange(3), unit="step",
                             center="mean", scale="none")
    assert out.dtype == torch.get_default_dtype()
    out = compute_advantages(torch.tensor([1.0, 0.0], dtype=torch.float16), g[:2],
                             torch.arange(2), unit="step", center="mean", scale="std")
    assert out.dtype == torch.float16
    empty = torch.zeros(0, dtype=torch.long)
    assert compute_advantages(torch.zeros(0), empty, empty, unit="step", center="mean",
                              scale="batch_std").shape == (0,)


def test_large_batch_is_group_local():
    """100k rows in 2,000 groups: each row's advantage depends only on its own group's rows (no
    cross-group leak in the vectorised scatter code), for both units."""
    n = 100_000
    gen = torch.Generator().manual_seed(0)
    r = torch.rand(n, generator=gen, dtype=torch.float64)
    g = torch.randint(0, 2_000, (n,), generator=gen)
    e = g * 100 + torch.randint(0, 10, (n,), generator=gen)  # episodes nest in groups
    low = g < 1_000
    for unit in ("step", "episode"):
        whole = compute_advantages(r, g, e, unit=unit, center="leave_one_out", scale="std")
        assert torch.isfinite(whole).all()
        for part in (low, ~low):
            alone = compute_advantages(r[part], g[part], e[part], unit=unit, center="leave_one_out", scale="std")
            torch.testing.assert_close(whole[part], alone)


# ---------------------------------------------------------------- validation


def test_estimator_validation_lists_options():
    with pytest.raises(ValueError, match="did you mean 'prompt\\+agent'"):
        Estimator("prompt+agnet", "step", "mean", "std")
    with pytest.raises(ValueError, match="choose one of"):
        Estimator("prompt", "turn", "mean", "std")


def test_get_and_register_estimator():
    with pytest.raises(ValueError, match="did you mean 'drmas'"):
        get_estimator("drmass")
    est = Estimator("prompt+agent", "episode", "leave_one_out", "none")
    register_estimator("test_agent_rloo", est)
    try:
        assert get_estimator("test_agent_rloo") is est
        with pytest.raises(ValueError, match="already registered"):
            register_estimator("test_agent_rloo", est)
        with pytest.raises(ValueError, match="already registered"):
            register_estimator("grpo", est)
    finally:
        del PRESETS["test_agent_rloo"]
    with pytest.raises(ValueError, match="Estimator"):
        register_estimator("x", ("prompt", "step", "mean", "std"))  # type: ignore[arg-type]


def test_input_validation():
    g = torch.zeros(3, dtype=torch.long)
    e = torch.arange(3)
    kw = dict(unit="step", center="mean", scale="std")
    with pytest.raises(ValueError, match="finite"):
        compute_advantages(torch.tensor([1.0, float("nan"), 0.0]), g, e, **kw)
    with pytest.raises(ValueError, match="rows but the batch has 3"):
        compute_advantages(torch.zeros(3), g[:2], e, **kw)
    with pytest.raises(ValueError, match="1-D"):
        compute_advantages(torch.zeros(3, 1), g, e, **kw)
    with pytest.raises(ValueError, match="integers"):
        compute_advantages(torch.zeros(3), g.float(), e, **kw)
    with pytest.raises(ValueError, match="unit"):
        compute_advantages(torch.zeros(3), g, e, unit="token", center="mean", scale="std")
    with pytest.raises(ValueError, match="eps"):
        compute_advantages(torch.zeros(3), g, e, eps=-1.0, **kw)


def test_reward_to_go_gamma_and_gaps():
    # turns 0 and 2 in one episode, gamma .5: t0 = 1 + .5^2 * 4 = 2 ; t2 = 4
    # a second agent at turn 0 adds its reward 1 to every row at turn 0
    r = torch.tensor([1.0, 4.0, 1.0, 3.0])
    ep = torch.tensor([0, 0, 0, 1])
    t = torch.tensor([0, 2, 0, 0])
    close(reward_to_go(r, ep, t, gamma=0.5), [3.0, 4.0, 3.0, 3.0])
    close(reward_to_go(r, ep, t, gamma=0.0), [2.0, 4.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="gamma"):
        reward_to_go(r, ep, t, gamma=1.5)


def test_format_penalty():
    out = apply_format_penalty(torch.tensor([1.0, 0.0]), torch.tensor([False, True]), penalty=0.5)
    assert out.tolist() == [0.5, 0.0]
    with pytest.raises(ValueError, match="penalty"):
        apply_format_penalty(torch.tensor([1.0]), torch.tensor([True]), penalty=-1.0)
    with pytest.raises(ValueError, match="bool"):
        apply_format_penalty(torch.tensor([1.0]), torch.tensor([1]), penalty=1.0)


def test_doctests():
    result = doctest.testmod(adv_mod)
    assert result.attempted > 0 and result.failed == 0
