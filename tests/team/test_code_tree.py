"""The code_tree workflow (MARS2 on code): node records, rewards, and execution feedback reaching the refiner."""

from __future__ import annotations

import shutil

import pytest

from teamrl.domains.code.code_tree import CodeTreeConfig
from teamrl.domains.code.pyfunc import PyFuncConfig, PyFuncTask
from tests.team.code_scripted import add_7, block, code_rollout

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

WRONG = block("def add_7(x):\n    return x + 6")
CRASH = block("def add_7(x):\n    return x + undefined_name")
RIGHT = block("def add_7(x):\n    return x + 7")


def test_refiner_sees_the_failing_test_and_fixes_it(tokenizer):
    """Round robin, branching 2: the coder's nodes are wrong (x + 6), the refiner's right only when shown the
    failing test's expected and actual output. Root children: coder (wrong), refiner (no feedback yet: crashes).
    Their children see each parent's program and run: the refiner's child of the wrong node is right."""

    def script(agent: str, prompt: str) -> str:
        if agent == "coder":
            return WRONG
        return RIGHT if "Got: " in prompt else CRASH

    cfg = CodeTreeConfig(max_nodes=4, branching=2, max_depth=2, expansion="round_robin", stop_on_success=False)
    ro, eng = code_rollout(tokenizer, "code_tree", cfg, PyFuncTask(), script)
    [ep] = ro.collect([add_7()], 1, progress=False)
    assert [s.agent for s in ep.steps] == ["coder", "code_refiner", "coder", "code_refiner"]
    assert [s.parent for s in ep.steps] == [-1, -1, 0, 0] and [s.depth for s in ep.steps] == [1, 1, 2, 2]
    assert ep.step_rewards == {0: 0.0, 1: 0.0, 2: 0.0, 3: 1.0}
    assert ep.reward == 1.0 and ep.info["solved"] is True and "x + 7" in ep.final
    children = [p for _, p in eng.calls[2:]]
    for p in children:  # the wrong parent's program, then its failing test: input, expected, actual
        assert "x + 6" in p and "Failed test 1 of 4" in p and "Input: assert add_7(" in p
        assert "Expected: " in p and "Got: " in p


def test_exception_feedback_and_fraction_scores(tokenizer):
    """A crashing root is refined from its exception type and traceback; with reward: fraction a node scores its
    pass fraction but only a node passing every test is solved (and stops the refinement)."""

    def script(agent: str, prompt: str) -> str:
        return CRASH if "NameError" not in prompt else block("def add_7(x):\n    return x + 7 if x > 0 else 0")

    cfg = CodeTreeConfig(agents=["coder"], max_nodes=2, branching=1, max_depth=2, expansion="round_robin")
    ro, eng = code_rollout(tokenizer, "code_tree", cfg, PyFuncTask(PyFuncConfig(reward="fraction")), script)
    [ep] = ro.collect([add_7()], 1, progress=False)
    assert "Error in test 1 of 4: NameError" in eng.calls[1][1] and "undefined_name" in eng.calls[1][1]
    assert ep.step_rewards[0] == 0.0 and 0.0 < ep.step_rewards[1] < 1.0
    assert ep.info["solved"] is False and len(ep.steps) == 2


def test_a_reply_without_code_is_told_so(tokenizer):
    cfg = CodeTreeConfig(agents=["coder"], max_nodes=2, branching=1, max_depth=2, expansion="round_robin")
    ro, eng = code_rollout(tokenizer, "code_tree", cfg, PyFuncTask(), lambda a, p: "I do not know.")
    [ep] = ro.collect([add_7()], 1, progress=False)
    assert "has no ```python code block" in eng.calls[1][1]
    assert [s.valid for s in ep.steps] == [False, False] and ep.step_rewards == {0: 0.0, 1: 0.0}
