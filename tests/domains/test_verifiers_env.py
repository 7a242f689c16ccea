"""verifiers environments under teamrl: the dataset as problems, the environment's rollout against the endpoint
(every model call a Step of the agent its model name maps to), the rubric's score as the reward.

The environments are the examples in examples/hubs (verifiers' own API, datasets built in code); a tiny random
model answers, or a scripted engine where a reply must have an exact form (a tool call)."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("verifiers", reason="the verifiers adapter needs verifiers 0.3 (pip install 'teamrl[verifiers]')")
pytest.importorskip("openai", reason="the environment's client is the openai client")

from teamrl.domains.hubs.verifiers_env import (  # noqa: E402
    VerifiersConfig,
    VerifiersTask,
    VerifiersWorkflowConfig,
    read_record,
)
from teamrl.engines.base import GenOutput, GenRequest, SamplingParams  # noqa: E402
from teamrl.engines.hf import HFEngine  # noqa: E402
from teamrl.team.agents import get_agent  # noqa: E402
from teamrl.team.team import AgentBinding, Dispatcher  # noqa: E402
from teamrl.team.workflows import get_workflow  # noqa: E402
from teamrl.train.reporting import rollout_metrics  # noqa: E402
from teamrl.train.rollout import Rollout  # noqa: E402
from tests.conftest import make_tiny_model  # noqa: E402
from tests.scripted import ScriptedEngineBase  # noqa: E402

_TASKS: dict[str, VerifiersTask] = {}


def task(env_id: str, **env_args) -> VerifiersTask:
    key = json.dumps([env_id, env_args], sort_keys=True)
    if key not in _TASKS:
        _TASKS[key] = VerifiersTask(VerifiersConfig(env_id=env_id, env_args={"n": 8, "n_eval": 4, **env_args}))
    return _TASKS[key]


class Scripted(ScriptedEngineBase):
    """Replies with the given texts in turn (the last one repeats), or with ``reply(prompt text)``."""

    def __init__(self, tokenizer, replies: list[str] | None = None, reply=None):
        super().__init__(tokenizer)
        self.replies, self.reply = list(replies or []), reply

    def generate(self, requests: list[GenRequest], on_progress=None) -> list[GenOutput]:
        outs = []
        for req in requests:
            if self.reply is not None:
                text = self.reply(self.tokenizer.decode(req.prompt_ids))
            else:
                text = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            outs.append(GenOutput(ids, [-0.5] * len(ids), text, "stop"))
        return outs


def rollout(tokenizer, vf_task: VerifiersTask, engine=None, **cfg) -> Rollout:
    wf_cfg = VerifiersWorkflowConfig(**cfg)
    eng = engine if engine is not None else HFEngine(make_tiny_model(tokenizer), tokenizer, seed=0)
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    bindings = {a: AgentBinding(get_agent(a), "m", sp, "", None, {}) for a in wf_cfg.agents}
    return Rollout(Dispatcher({"m": eng}), bindings, get_workflow("verifiers"), wf_cfg, vf_task)


def test_dataset_and_eval_dataset_become_the_splits():
    t = task("examples.hubs.vf_arith")
    train, test = t.problems("train"), t.problems("test")
    assert len(train) == 8 and len(test) == 4
    assert train[0].question.startswith("What is ") and train[0].answer == t.rows[train[0].id]["answer"]
    assert {p.question for p in train}.isdisjoint({p.question for p in test}) or len(test) == 4


def test_without_an_eval_dataset_rows_are_held_out(monkeypatch):
    t = task("examples.hubs.vf_arith")
    monkeypatch.setattr(t.env, "eval_dataset_source", None)
    held = VerifiersTask.__new__(VerifiersTask)
    held.cfg = VerifiersConfig(env_id="examples.hubs.vf_arith", n_test=3)
    import teamrl.domains.hubs.verifiers_env as mod

    monkeypatch.setattr(mod, "load_environment", lambda env_id, args: t.env)
    held.__init__(held.cfg)
    assert len(held.problems("test")) == 3 and len(held.problems("train")) == 5
    ids = {json.dumps(held.rows[p.id]["prompt"]) for p in held.problems("train")}
    assert not ids & {json.dumps(held.rows[p.id]["prompt"]) for p in held.problems("test")}


def test_single_turn_rollout_is_a_step_scored_by_the_rubric(tokenizer):
    t = task("examples.hubs.vf_arith")
    probs = t.problems("train")[:2]
    answer = probs[0].answer
    eng = Scripted(tokenizer, reply=lambda text: f"<answer>{answer}</answer>" if probs[0].question in text else "no")
    eps = rollout(tokenizer, t, eng).collect(probs, 1, progress=False)
    assert all(ep.error is None for ep in eps)
    assert [len(ep.steps) for ep in eps] == [1, 1] and eps[0].steps[0].agent == "policy"
    first = read_record(eps[0].final)
    assert first["metrics"]["correct"] == 1.0 and first["answer"] == answer
    assert math.isclose(eps[0].reward, 1.0 + 0.2 * first["metrics"]["format_reward_func"])
    second = read_record(eps[1].final)["metrics"]
    assert second["correct"] == 0.0 and math.isclose(eps[1].reward, 0.2 * second["format_reward_func"])
    metrics = rollout_metrics(eps, [s for ep in eps for s in ep.steps])
    assert metrics["verifiers/correct"] == 0.5  # each reward function averaged over the episodes


def test_format_threshold_marks_replies_without_the_format_invalid(tokenizer):
    t = task("examples.hubs.vf_arith")
    probs = t.problems("train")[:2]
    eng = Scripted(tokenizer, reply=lambda text: "<answer>3</answer>" if probs[0].question in text else "3")
    eps = rollout(tokenizer, t, eng, format_threshold=0.5).collect(probs, 1, progress=False)
    assert [ep.steps[0].valid for ep in eps] == [True, False]


def test_multi_turn_rollout_records_each_turn(tokenizer):
    t = task("examples.hubs.vf_guess", max_turns=3)
    eng = Scripted(tokenizer, ["1", "2", "3"])
    ep, = rollout(tokenizer, t, eng).collect(t.problems("train")[:1], 1, progress=False)
    assert ep.error is None and 1 <= len(ep.steps) <= 3
    assert [s.agent_call for s in ep.steps] == list(range(len(ep.steps)))
    if len(ep.steps) > 1:  # the environment's reply ("Higher." / "Lower.") is in the next turn's prompt
        assert any(w in tokenizer.decode(ep.steps[1].prompt_ids) for w in ("Higher.", "Lower."))


def test_tool_calls_go_through_the_environment(tokenizer):
    t = task("examples.hubs.vf_calculator")
    p = t.problems("train")[0]
    a, op, b = p.question.removeprefix("What is ").removesuffix("?").split()
    call = f'<tool_call>\n{{"name": "calculate", "arguments": {{"a": {a}, "op": "{op}", "b": {b}}}}}\n</tool_call>'
    eng = Scripted(tokenizer, [call, f"The answer is {p.answer}."])
    ep, = rollout(tokenizer, t, eng).collect([p], 1, progress=False)
    assert ep.error is None and len(ep.steps) == 2
    second = tokenizer.decode(ep.steps[1].prompt_ids)
    assert f"<tool_response>\n{p.answer}" in second or f"{p.answer}\n</tool_response>" in second
    assert read_record(ep.final)["metrics"]["correct"] == 1.0 and ep.reward >= 1.0


def test_two_seats_are_two_agents(tokenizer):
    t = task("examples.hubs.vf_two_seat")
    eps = rollout(tokenizer, t, models={"solver": "solver", "checker": "checker"}, model="solver").collect(
        t.problems("train")[:2], 2, progress=False)
    for ep in eps:
        assert ep.error is None and [s.agent for s in ep.steps] == ["solver", "checker"]
        assert ep.info["calls"] == {"checker": 1, "solver": 1}
        assert "Proposed answer: " + ep.steps[0].text in tokenizer.decode(ep.steps[1].prompt_ids)


def test_a_module_that_does_not_import_is_one_line():
    with pytest.raises(ValueError, match=r"^task.verifiers.env_id 'no_such_env_mod' does not import") as err:
        VerifiersTask(VerifiersConfig(env_id="no_such_env_mod"))
    assert "\n" not in str(err.value)


BAD_ENV = '''
import verifiers as vf
from datasets import Dataset


def load_environment():
    def raises(completion, **kwargs):
        raise RuntimeError("boom")

    def nan_reward(completion, answer, **kwargs):
        return float("nan") if answer == "x" else 0.0

    def one(completion, **kwargs):
        return 1.0

    rows = [{"question": "Say hi.", "answer": ""}, {"question": "Say ho.", "answer": "x"}]
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), eval_dataset=Dataset.from_list(rows),
                            rubric=vf.Rubric(funcs=[raises, one, nan_reward], weights=[1.0, 1.0, 0.0]))
'''


def test_a_raising_reward_function_scores_zero_and_a_nan_fails_only_its_episode(tokenizer, tmp_path, monkeypatch):
    (tmp_path / "bad_rewards_env.py").write_text(BAD_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    t = VerifiersTask(VerifiersConfig(env_id="bad_rewards_env"))
    fine, bad = rollout(tokenizer, t, Scripted(tokenizer, ["hi"])).collect(t.problems("train"), 1, progress=False)
    assert fine.error is None and fine.reward == 1.0  # raises: 0 (verifiers logs one line), one: 1, nan_reward: 0
    assert read_record(fine.final)["metrics"] == {"raises": 0.0, "one": 1.0, "nan_reward": 0.0, "num_turns": 1.0}
    # the other episode keeps its step, is not trained on, and its error names the function that was not finite
    assert bad.steps and bad.error is not None and "nan_reward" in bad.error and "\n" not in bad.error
