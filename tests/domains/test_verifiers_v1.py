"""verifiers' v1 stack under teamrl: a taskset's tasks as problems, an Env's seats played by verifiers' own chat
program (in its subprocess runtime, on this interpreter) against teamrl's endpoint, every call a Step of the seat's
agent, each trace's reward given to the Steps that made it.

The taskset and the Env are the examples in examples/hubs (verifiers' v1 API, rows made in code); a tiny random model
or a scripted engine answers."""

from __future__ import annotations

import pytest

vf_version = pytest.importorskip("verifiers", reason="the v1 adapter needs verifiers >= 0.4 "
                                 "(pip install 'teamrl[verifiers1]')").__version__
if tuple(int(p) for p in vf_version.split(".")[:2]) < (0, 4):
    pytest.skip(f"the v1 adapter needs verifiers >= 0.4 (installed: {vf_version}; pip install 'teamrl[verifiers1]')",
                allow_module_level=True)

from teamrl.domains.hubs.verifiers_env import read_record  # noqa: E402
from teamrl.domains.hubs.verifiers_v1 import (  # noqa: E402
    VerifiersV1Config,
    VerifiersV1Task,
    VerifiersV1WorkflowConfig,
)
from teamrl.engines.base import GenOutput, GenRequest, SamplingParams  # noqa: E402
from teamrl.team.agents import get_agent  # noqa: E402
from teamrl.team.team import AgentBinding, Dispatcher  # noqa: E402
from teamrl.team.workflows import get_workflow  # noqa: E402
from teamrl.train.reporting import rollout_metrics  # noqa: E402
from teamrl.train.rollout import Rollout  # noqa: E402
from tests.scripted import ScriptedEngineBase  # noqa: E402

_TASKS: dict[str, VerifiersV1Task] = {}


def task(taskset: str, **kw) -> VerifiersV1Task:
    if taskset not in _TASKS or kw:
        t = VerifiersV1Task(VerifiersV1Config(taskset=taskset, taskset_args={"n": 12}, n_test=4, **kw))
        if kw:
            return t
        _TASKS[taskset] = t
    return _TASKS[taskset]


class Scripted(ScriptedEngineBase):
    """Replies ``reply(prompt text)``."""

    def __init__(self, tokenizer, reply):
        super().__init__(tokenizer)
        self.reply = reply

    def generate(self, requests: list[GenRequest], on_progress=None) -> list[GenOutput]:
        outs = []
        for req in requests:
            text = self.reply(self.tokenizer.decode(req.prompt_ids))
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            outs.append(GenOutput(ids, [-0.5] * len(ids), text, "stop"))
        return outs


def rollout(engine, vf_task: VerifiersV1Task, **cfg) -> Rollout:
    wf_cfg = VerifiersV1WorkflowConfig(**cfg)
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    bindings = {a: AgentBinding(get_agent(a), "m", sp, "", None, {}) for a in wf_cfg.agents}
    return Rollout(Dispatcher({"m": engine}), bindings, get_workflow("verifiers_v1"), wf_cfg, vf_task)


def _answer_of(t: VerifiersV1Task, text: str) -> str:
    for p in t.problems("train") + t.problems("test"):
        if p.question in text:
            return p.answer
    return "?"


def test_the_tasksets_tasks_become_the_splits():
    t = task("examples.hubs.vf1_sum")
    train, test = t.problems("train"), t.problems("test")
    assert len(train) == 8 and len(test) == 4 and t.seats == ["agent"]
    assert train[0].question.startswith("What is ") and train[0].answer == t.tasks[train[0].id].data.answer
    assert {p.id for p in train}.isdisjoint({p.id for p in test})


def test_a_seats_call_is_a_step_scored_by_the_tasks_reward(tokenizer):
    t = task("examples.hubs.vf1_sum")
    probs = t.problems("train")[:2]
    eng = Scripted(tokenizer, lambda text: f"It is {probs[0].answer}." if probs[0].question in text else "no idea")
    eps = rollout(eng, t, models={"agent": "policy"}).collect(probs, 1, progress=False)
    assert [ep.error for ep in eps] == [None, None]
    assert [[s.agent for s in ep.steps] for ep in eps] == [["policy"], ["policy"]]
    assert [ep.reward for ep in eps] == [1.0, 0.0] and read_record(eps[0].final)["metrics"] == {"correct": 1.0}
    assert "Solve the problem." in tokenizer.decode(eps[0].steps[0].prompt_ids)  # the task's system prompt
    assert rollout_metrics(eps, [s for ep in eps for s in ep.steps])["verifiers/correct"] == 0.5


def test_each_seat_of_a_multi_agent_env_is_its_own_agent_with_its_own_reward(tokenizer):
    t = task("examples.hubs.vf1_two_seat")
    assert t.seats == ["solver", "checker"]

    def reply(text: str) -> str:  # the solver is wrong, the checker corrects it
        return "100" if "A student answered" not in text else f"No: {_answer_of(t, text)}"

    eps = rollout(Scripted(tokenizer, reply), t, models={"solver": "solver", "checker": "checker"}).collect(
        t.problems("train")[:2], 2, progress=False)
    for ep in eps:
        assert ep.error is None and [s.agent for s in ep.steps] == ["solver", "checker"]
        assert ep.info["calls"] == {"checker": 1, "solver": 1}
        assert "A student answered: 100" in tokenizer.decode(ep.steps[1].prompt_ids)
        assert ep.step_rewards == {0: 0.0, 1: 1.0} and ep.agent_rewards == {"solver": 0.0, "checker": 1.0}
        assert read_record(ep.final)["metrics"] == {"solver_correct": 0.0, "checker_correct": 1.0}


def test_a_seat_without_an_agent_is_one_line(tokenizer):
    from teamrl.train.rollout import EpisodesFailed

    t = task("examples.hubs.vf1_two_seat")
    with pytest.raises(EpisodesFailed, match=r"ValueError: seat\(s\) checker of the Env have no agent; add them"):
        rollout(Scripted(tokenizer, lambda _: "1"), t, models={"solver": "solver"}).collect(
            t.problems("train")[:1], 1, progress=False)


def test_a_taskset_that_does_not_load_is_one_line():
    with pytest.raises(ValueError, match=r"^task.verifiers_v1.taskset 'no.such_taskset' does not import") as err:
        VerifiersV1Task(VerifiersV1Config(taskset="no.such_taskset"))
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"^verifiers v1 taskset 'no_such_taskset' does not load") as err:
        VerifiersV1Task(VerifiersV1Config(taskset="no_such_taskset"))
    assert "\n" not in str(err.value)


def test_a_harness_that_runs_model_code_on_the_host_is_refused():
    with pytest.raises(ValueError, match=r"plays harness 'bash', which runs model-written code on this machine"):
        task("examples.hubs.vf1_sum", harness="bash")


RAISES = '''
import verifiers.v1 as vf

__all__ = ["BadTaskset"]


class BadTask(vf.Task[vf.TaskData]):
    @vf.reward(weight=1.0)
    async def boom(self, trace: vf.Trace) -> float:
        if "two" in (self.data.prompt or ""):
            raise RuntimeError("boom")
        return 1.0


class BadTaskset(vf.Taskset[BadTask, vf.TasksetConfig]):
    def load(self):
        for i, word in enumerate(["one", "two", "three"]):
            yield BadTask(vf.TaskData(id=str(i), prompt=f"Say {word}."), self.config.task)
'''


def test_a_raising_reward_fails_only_its_episode(tokenizer, tmp_path, monkeypatch):
    (tmp_path / "bad_v1_taskset.py").write_text(RAISES)
    monkeypatch.syspath_prepend(str(tmp_path))
    t = VerifiersV1Task(VerifiersV1Config(taskset="bad_v1_taskset", n_test=0))
    eps = rollout(Scripted(tokenizer, lambda _: "hi"), t, models={"agent": "policy"}).collect(
        sorted(t.problems("train"), key=lambda p: p.question), 1, progress=False)
    by_q = {p.question: ep for p, ep in zip(sorted(t.problems("train"), key=lambda p: p.question), eps)}
    assert by_q["Say one."].error is None and by_q["Say one."].reward == 1.0
    bad = by_q["Say two."]
    assert bad.steps and bad.error is not None and "boom" in bad.error and "\n" not in bad.error


def test_a_harness_program_whose_packages_are_missing_is_one_line(tmp_path):
    import asyncio

    from verifiers.v1.runtimes import SubprocessConfig, SubprocessRuntime

    task("examples.hubs.vf1_sum")  # loading the task makes the runtime run programs on this interpreter
    rt = SubprocessRuntime(SubprocessConfig(), "t-missing")
    rt.workdir = tmp_path
    script = '# /// script\n# dependencies = ["no-such-distribution-abc>=1"]\n# ///\nprint(1)\n'
    with pytest.raises(RuntimeError, match=r"needs no-such-distribution-abc>=1 \(not installed\); install them"):
        asyncio.run(rt.prepare_uv_script(script))
    argv = asyncio.run(rt.prepare_uv_script('# /// script\n# dependencies = ["pytest"]\n# ///\nprint(1)\n'))
    assert argv[0].endswith("python") or "python" in argv[0]
    assert (tmp_path / argv[1].rsplit("/", 1)[-1]).read_text().endswith("print(1)\n")
