"""The code_pair workflow (MAGRPO's aux + main coders): the joint level reward, its parts, and the records."""

from __future__ import annotations

import ast
import shutil

import pytest

from teamrl.config.sections import AlgoConfig
from teamrl.domains.code.code_pair import CodePairConfig, extract_function, is_wrapper, pair_reward
from teamrl.domains.code.pyfunc import PyFuncTask
from teamrl.scoring import score_steps
from tests.team.code_scripted import add_7, block, code_rollout

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

AUX = block("def aux(x):\n    return x + 3")


def pair(main: str, aux: str = AUX):
    return lambda agent, prompt: aux if agent == "aux_coder" else main


@pytest.mark.parametrize("main,aux,reward,passed", [
    # .4 + .6 + .5 + 1 (4/4 tests) + .5 (calls aux) + 1 (not a wrapper) = 4.0
    (block("def add_7(x):\n    y = aux(x)\n    return y + 4"), AUX, 4.0, True),
    # a wrapper of aux: no anti-wrapper bonus; aux(x) + 4 is one return calling aux: 3.0
    (block("def add_7(x):\n    return aux(x) + 4"), AUX, 3.0, True),
    # main ignores aux: .4 + .6 + .5 + 1 = 2.5
    (block("def add_7(x):\n    return x + 7"), AUX, 2.5, True),
    # calls aux and drops its result, then wrong: 0/4 tests, so no bonus: .4 + .6 + .5 = 1.5
    (block("def add_7(x):\n    aux(x)\n    return x"), AUX, 1.5, False),
    # no aux at all, main right: .6 + .5 + 1 = 2.1
    (block("def add_7(x):\n    return x + 7"), "no code", 2.1, True),
    # main missing: only aux's .4
    ("I cannot do it.", AUX, 0.4, False),
])
def test_joint_level_reward_reaches_both_agents(tokenizer, main, aux, reward, passed):
    ro, eng = code_rollout(tokenizer, "code_pair", CodePairConfig(), PyFuncTask(), pair(main, aux))
    [ep] = ro.collect([add_7()], 1, progress=False)
    assert [s.agent for s in ep.steps] == ["aux_coder", "main_coder"]
    assert ep.step_rewards == pytest.approx({0: reward, 1: reward})
    assert ep.reward == float(passed)  # the task's own score of the joined program
    prompts = dict(eng.calls)
    assert "helper function named 'aux'" in prompts["aux_coder"]
    assert "Implement only the 'add_7' function" in prompts["main_coder"] and "do not redefine aux()" in prompts["main_coder"]


def test_pass_mode_and_joint_groups(tokenizer):
    ro, _ = code_rollout(tokenizer, "code_pair", CodePairConfig(reward="pass"), PyFuncTask(),
                         pair(block("def add_7(x):\n    return aux(x) + 4")))
    eps = ro.collect([add_7()], 2, progress=False)
    assert [ep.step_rewards for ep in eps] == [{0: 1.0, 1: 1.0}] * 2
    steps = score_steps(eps, AlgoConfig(estimator="magrpo"))
    assert [s.advantage for s in steps] == [0.0] * 4  # equal joint rewards: no advantage


def test_static_checks_read_code_not_text():
    fn = extract_function("Sure!\n```python\ndef aux(x):\n    # return nothing\n    pass\n```", "aux")
    assert fn is not None and pair_reward(fn, None, syntax_ok=False, passed=0, total=0)[0] == 0.0  # no return
    body = "def f(x):\n    '''Calls aux(x) in words only.'''\n    return x"
    assert not is_wrapper(ast.parse("def f(x):\n    y = aux(x)\n    z = y\n    return z").body[0], "aux")
    assert pair_reward(extract_function(AUX, "aux"), extract_function(body, "f"), syntax_ok=True, passed=1,
                       total=1)[1].get("uses_aux") is None  # a docstring mentioning aux is no call
