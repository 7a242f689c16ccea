from __future__ import annotations

import random

import pytest
import torch

from teamrl.algos.advantages import get_estimator
from teamrl.config.sections import AlgoConfig, RewardAllocConfig
from teamrl.scoring import Context, score_steps
from teamrl.team.records import Episode, Step


def _episodes(rewards: list[list[float]], agents=("solver", "verifier"), extra_solver_turn: bool = False) -> list[Episode]:
    eps = []
    for g, group in enumerate(rewards):
        for k, r in enumerate(group):
            ep = Episode(prompt_index=g, index=len(eps), problem_id=str(g), reward=r)
            plan = list(agents) + (["solver"] if extra_solver_turn and k % 2 else [])
            turns: dict[str, int] = {}
            for a in plan:
                ep.steps.append(Step(prompt_index=g, episode=ep.index, agent=a, agent_call=turns.get(a, 0), model="m",
                                     prompt_ids=[1], response_ids=[2], logprobs=[-1.0], temperature=1.0, text="",
                                     valid=True))
                turns[a] = turns.get(a, 0) + 1
            eps.append(ep)
    return eps


def test_synchronous_joint_reward_drmas_equals_grpo():
    """Each agent acts once per episode under a joint reward: Dr. MAS reduces exactly to GRPO."""
    rng = random.Random(0)
    rewards = [[float(rng.random() < 0.4) for _ in range(6)] for _ in range(4)]
    a = [s.advantage for s in score_steps(_episodes(rewards), AlgoConfig(estimator="drmas"))]
    b = [s.advantage for s in score_steps(_episodes(rewards), AlgoConfig(estimator="grpo"))]
    assert a == b and any(x != 0 for x in a)


def test_drmas_differs_from_grpo_when_an_agent_acts_more_often():
    rewards = [[1.0, 0.0, 1.0, 0.0, 0.0, 1.0]]
    a = [s.advantage for s in score_steps(_episodes(rewards, extra_solver_turn=True), AlgoConfig(estimator="drmas"))]
    b = [s.advantage for s in score_steps(_episodes(rewards, extra_solver_turn=True), AlgoConfig(estimator="grpo"))]
    assert a != b


def test_format_penalty_hits_only_invalid_steps():
    eps = _episodes([[1.0, 1.0]])
    eps[0].steps[1].valid = False
    steps = score_steps(eps, AlgoConfig(estimator="grpo_step", format_penalty=0.25))
    assert [s.reward for s in steps] == [1.0, 0.75, 1.0, 1.0]
    assert steps[1].advantage < 0 < steps[0].advantage


def test_per_agent_rewards_override_the_joint_reward():
    eps = _episodes([[1.0, 0.0]])
    eps[0].agent_rewards = {"verifier": 0.0}
    steps = score_steps(eps, AlgoConfig(estimator="drmas"))
    assert [s.reward for s in steps] == [1.0, 0.0, 0.0, 0.0]
    assert [s.advantage for s in steps if s.agent == "verifier"] == [0.0, 0.0]


def test_unknown_estimator_is_rejected():
    with pytest.raises(ValueError, match="drmas"):
        score_steps(_episodes([[1.0, 0.0]]), AlgoConfig(estimator="dr_mas"))


def test_step_rewards_take_precedence_over_agent_and_joint_rewards():
    eps = _episodes([[1.0, 0.0]])
    eps[0].agent_rewards = {"verifier": 0.5}
    eps[0].step_rewards = {1: 0.25}  # episode 0's verifier step
    eps[1].step_rewards = {1: 1.0}  # episode 1's verifier step
    steps = score_steps(eps, AlgoConfig(estimator="drmas"))
    assert [s.reward for s in steps] == [1.0, 0.25, 0.0, 1.0]
    # drmas: the verifier's two rows 0.25, 1.0 -> mean 0.625, std 0.5303 -> -/+0.7071
    assert [round(s.advantage, 4) for s in steps if s.agent == "verifier"] == [-0.7071, 0.7071]


def test_tree_scope_groups_by_tree_and_falls_back_to_the_episode():
    # two episodes of one prompt: tree 0 has node rewards 0, 1 and tree 1 has 1, 1
    eps = _episodes([[0.0, 0.0]], agents=("solver", "refiner"))
    for ep, rewards in zip(eps, ([0.0, 1.0], [1.0, 1.0])):
        for i, s in enumerate(ep.steps):
            s.tree, ep.step_rewards[i] = ep.index, rewards[i]
    tree = [round(s.advantage, 4) for s in score_steps(eps, AlgoConfig(estimator="tree"))]
    assert tree == [-0.7071, 0.7071, 0.0, 0.0]  # tree 1 is tied: all zero
    # a prompt-level group mixes both trees: rewards 0, 1, 1, 1 -> mean .75, std .5
    prompt = [s.advantage for s in score_steps(eps, AlgoConfig(estimator="grpo_step"))]
    assert [round(a, 4) for a in prompt] == [-1.5, 0.5, 0.5, 0.5]
    for ep in eps:  # without tree ids every episode is its own tree: same groups here
        for s in ep.steps:
            s.tree = -1
    again = [round(s.advantage, 4) for s in score_steps(eps, AlgoConfig(estimator="tree"))]
    assert again == tree


def test_overlong_penalty_is_added_per_step():
    eps = _episodes([[1.0, 1.0]])
    eps[0].steps[0].response_ids = [2] * 8  # solver limit 8, buffer 4: 8 tokens -> -1 * 0.5
    eps[1].steps[0].response_ids = [2] * 6  # 6 tokens: 2 into the buffer -> -0.5 * 0.5
    steps = score_steps(eps, AlgoConfig(estimator="drmas", overlong_buffer=4, overlong_penalty=0.5),
                        Context(max_tokens={"solver": 8, "verifier": 8}))
    assert [s.reward for s in steps] == [0.5, 1.0, 0.75, 1.0]


def test_reward_alloc_shapes_a_tree_episode_before_the_overlong_penalty():
    """One tree (episode 0) of four nodes: a, b under the root, c under a, d under c; node rewards 0, 1, 1, 1."""
    ep = Episode(prompt_index=0, index=0, problem_id="p", reward=1.0)
    for k, parent in enumerate([-1, -1, 0, 2]):
        ep.steps.append(Step(prompt_index=0, episode=0, agent="solver", agent_call=k, model="m", prompt_ids=[1],
                             response_ids=[2] * (4 if k == 3 else 1), logprobs=[-1.0], temperature=1.0, text="",
                             valid=True, tree=0, parent=parent, depth=0))
    ep.step_rewards = {0: 0.0, 1: 1.0, 2: 1.0, 3: 1.0}
    # margin, alpha .5: 0; 1 + .5 (1 - 0) = 1.5; 1 + .5 (1 - 1/2) = 1.25; 1 + .5 (1 - 2/3) = 7/6
    steps = score_steps([ep], AlgoConfig(estimator="tree", reward_alloc=RewardAllocConfig(name="margin", alpha=0.5)))
    assert [s.reward for s in steps] == pytest.approx([0.0, 1.5, 1.25, 7 / 6])
    # tree, alpha .5, beta .5: a = 0 + .5 (0 - 1) = -.5, b = 1.5; c only child of a: 1 + .5 (1 + .5) = 1.75;
    # d only child of c: 1 + .5 (1 - 1.75) = .625, then the overlong penalty of its 4 tokens of 4 (buffer 2): -1
    steps = score_steps([ep], AlgoConfig(estimator="tree", reward_alloc=RewardAllocConfig(name="tree", alpha=0.5, beta=0.5),
                                         overlong_buffer=2), Context(max_tokens={"solver": 4}))
    assert [s.reward for s in steps] == [-0.5, 1.5, 1.75, -0.375]


def test_group_pool_pools_consecutive_problems_as_pettingllms_keys_them():
    """algo.group_pool: PettingLLMs' (env_idx // sample_num, turn, agent): problems 0-1 and 2-3 share groups per agent
    and turn; two plan candidates of one problem with equal rewards get advantages from the other problem's."""
    from dataclasses import replace

    from teamrl.scoring.advantages import advantages_for, group_ids

    def step(p, agent, turn):
        return Step(prompt_index=p, episode=p, agent=agent, agent_call=turn, model="m", prompt_ids=[1],
                    response_ids=[2], logprobs=[-1.0], temperature=1.0, text="", valid=True)

    steps = [step(p, a, t) for p in range(4) for a in ("plan", "tool") for t in (0, 1) for _ in range(2)]
    pooled = replace(get_estimator("agent_turn"), pool=2)
    ids = group_ids(steps, pooled).tolist()
    assert len(set(ids)) == 2 * 2 * 2  # 2 pools x 2 agents x 2 turns
    key = {(s.prompt_index // 2, s.agent, s.agent_call): g for s, g in zip(steps, ids)}
    assert all(key[(s.prompt_index // 2, s.agent, s.agent_call)] == g for s, g in zip(steps, ids))
    rewards = torch.tensor([float(s.prompt_index) for s in steps], dtype=torch.float64)  # equal within a problem
    assert (advantages_for(steps, rewards, get_estimator("agent_turn"), eps=1e-6) == 0).all()
    assert (advantages_for(steps, rewards, pooled, eps=1e-6) != 0).all()
