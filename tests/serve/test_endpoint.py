"""The OpenAI-compatible endpoint and the agent_program workflow, driven by the official openai client.

A tiny random model (or a scripted engine where a reply must have an exact form, e.g. a tool
call) answers; every check reads the recorded Steps back.
"""

from __future__ import annotations

import copy
import logging
import time

import pytest

pytest.importorskip("openai", reason="the endpoint tests drive it with the openai client (pip install openai)")
pytest.importorskip("starlette", reason="the endpoint needs starlette and uvicorn")

from teamrl.domains.math.arith import ArithConfig, ArithTask  # noqa: E402
from teamrl.engines.base import GenOutput, GenRequest, SamplingParams  # noqa: E402
from teamrl.engines.hf import HFEngine  # noqa: E402
from teamrl.serve.agent_program import AgentProgramConfig  # noqa: E402
from teamrl.tasks.base import Problem  # noqa: E402
from teamrl.team.agents import get_agent  # noqa: E402
from teamrl.team.records import Episode  # noqa: E402
from teamrl.team.team import AgentBinding, Dispatcher  # noqa: E402
from teamrl.team.workflows import get_workflow  # noqa: E402
from teamrl.train.rollout import Rollout  # noqa: E402
from tests.conftest import make_tiny_model  # noqa: E402
from tests.scripted import ScriptedEngineBase
from tests.serve import programs  # noqa: E402

MODELS = {"planner": "planner", "coder": "coder"}


class Scripted(ScriptedEngineBase):
    """Replies with the given texts in turn (the last one repeats); counts batch sizes."""

    def __init__(self, tokenizer, replies: list[str]):
        super().__init__(tokenizer)
        self.replies, self.batches = list(replies), []

    def generate(self, requests: list[GenRequest], on_progress=None) -> list[GenOutput]:
        self.batches.append(len(requests))
        outs = []
        for _ in requests:
            text = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            outs.append(GenOutput(ids, [-0.5] * len(ids), text, "stop"))
        return outs


def rollout(tokenizer, engine=None, *, scheduler="lockstep", template_kwargs=None, **cfg) -> Rollout:
    wf_cfg = AgentProgramConfig(**{"models": MODELS, **cfg})
    eng = engine if engine is not None else HFEngine(make_tiny_model(tokenizer), tokenizer, seed=0)
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    bindings = {a: AgentBinding(get_agent(a), "m", sp, "", None, dict(template_kwargs or {})) for a in wf_cfg.agents}
    return Rollout(Dispatcher({"m": eng}, schedulers={"m": scheduler}), bindings, get_workflow("agent_program"),
                   wf_cfg, ArithTask(ArithConfig()))


def problems(n: int, tag: str) -> list[Problem]:
    return [Problem(id=f"{tag}{i}", question=f"{tag}: what is {i} + 2?", answer=str(i + 2)) for i in range(n)]


def _prompt(tokenizer, messages, **kwargs) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False,
                                              **kwargs))


@pytest.mark.parametrize("scheduler", ["lockstep", "continuous"])
def test_calls_are_recorded_steps_with_their_tokens(tokenizer, scheduler):
    probs = problems(6, f"rec-{scheduler}")
    eps = rollout(tokenizer, program="tests.serve.programs:two_roles", scheduler=scheduler).collect(
        probs, 1, progress=False)
    assert len(eps) == 6
    for ep in eps:
        assert ep.error is None
        seen = programs.SEEN[probs[ep.prompt_index].question]
        assert [s.agent for s in ep.steps] == ["planner", "coder"]
        plan, code = ep.steps
        assert plan.prompt_ids == _prompt(tokenizer, seen["plan_msgs"])  # the program's own system message
        assert code.prompt_ids == _prompt(tokenizer, seen["code_msgs"])
        extra = seen["plan"].model_extra["teamrl"]
        assert extra["token_ids"] == plan.response_ids and extra["prompt_token_ids"] == plan.prompt_ids
        assert seen["plan"].choices[0].message.content == plan.text
        assert len(plan.response_ids) <= 6  # the client's smaller max_tokens
        assert seen["plan"].usage.prompt_tokens == len(plan.prompt_ids)
        assert seen["plan"].usage.completion_tokens == len(plan.response_ids)
        assert seen["code_text"] == code.text == ep.final  # the streamed pieces add up to the reply
        assert seen["code_usage"].completion_tokens == len(code.response_ids)
        assert seen["code_finish"] == {"stop": "stop", "length": "length"}[code.finish_reason]
        assert code.temperature == 1.0  # the config's, not the client's 0.3
        assert ep.info["calls"] == {"coder": 1, "planner": 1}
    assert len({tuple(ep.steps[0].prompt_ids) for ep in eps}) == 6  # each episode got its own problem


def test_client_sampling_that_differs_is_warned_about(tokenizer, caplog):
    from teamrl.serve import endpoint

    endpoint()._warned.clear()  # warned once per process
    with caplog.at_level(logging.WARNING, logger="teamrl.serve.server"):
        rollout(tokenizer, program="tests.serve.programs:two_roles").collect(problems(1, "warn"), 1, progress=False)
    assert any("temperature=0.3" in r.getMessage() and "'coder'" in r.getMessage() for r in caplog.records)


def test_auth_unknown_models_and_bad_requests_get_openai_errors(tokenizer):
    ep, = rollout(tokenizer, program="tests.serve.programs:probe_errors").collect(problems(1, "err"), 1, progress=False)
    seen = programs.SEEN["err: what is 0 + 2?"]
    assert ep.error is None and ep.steps == []  # no refused request reached the model
    assert seen["no_token"] == 401 and seen["wrong_token"] == (401, "authentication_error")
    status, error = seen["unknown_model"]
    assert status == 404 and error["code"] == "model_not_found" and "did you mean 'planner'" in error["message"]
    assert seen["n2"] == 400 and seen["bad_json"] == 400
    assert seen["models"] == ["coder", "planner"]


def test_fallback_agent_answers_unknown_model_names(tokenizer):
    ep, = rollout(tokenizer, Scripted(tokenizer, ["ok"]), program="tests.serve.programs:two_roles",
                  models={"planner": "planner"}, fallback_agent="coder").collect(problems(1, "fb"), 1, progress=False)
    assert ep.error is None and [s.agent for s in ep.steps] == ["planner", "coder"]


def test_completions_endpoint_plain_and_streamed(tokenizer):
    ep, = rollout(tokenizer, program="tests.serve.programs:completions").collect(problems(1, "cmp"), 1, progress=False)
    seen = programs.SEEN["cmp: what is 0 + 2?"]
    first, second = ep.steps
    assert first.prompt_ids == list(tokenizer("cmp: what is 0 + 2?")["input_ids"])  # no chat template
    assert seen["first"].choices[0].text == first.text and len(first.response_ids) <= 5
    assert seen["streamed"] == second.text and seen["usage"].completion_tokens == len(second.response_ids)


def test_tool_calls_round_trip_through_the_chat_template(tokenizer):
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    eng = Scripted(tokenizer, [call, "The sum is 5."])
    ep, = rollout(tokenizer, eng, program="tests.serve.programs:tool_loop").collect(problems(1, "tool"), 1,
                                                                                     progress=False)
    seen = programs.SEEN["tool: what is 0 + 2?"]
    msg = seen["first"].choices[0].message
    assert ep.error is None and seen["first"].choices[0].finish_reason == "tool_calls"
    assert msg.tool_calls[0].function.name == "add" and msg.tool_calls[0].function.arguments == '{"a": 2, "b": 3}'
    prompt = tokenizer.decode(ep.steps[0].prompt_ids)
    assert "<tools>" in prompt and '"name": "add"' in prompt  # tools rendered for a template without tool support
    second = tokenizer.decode(ep.steps[1].prompt_ids)
    assert "<tool_response>\n5\n</tool_response>" in second and '"arguments": {"a": 2, "b": 3}' in second
    assert ep.steps[0].text == call and all(s.valid for s in ep.steps) and ep.final == "The sum is 5."


def test_a_malformed_tool_call_is_a_format_failure_not_a_crash(tokenizer):
    bad = '<tool_call>{"name": "add", "arguments": {"a": </tool_call>'
    ep, = rollout(tokenizer, Scripted(tokenizer, [bad]), program="tests.serve.programs:tool_loop").collect(
        problems(1, "badtool"), 1, progress=False)
    first = programs.SEEN["badtool: what is 0 + 2?"]["first"]
    assert ep.error is None and len(ep.steps) == 1 and not ep.steps[0].valid
    assert first.choices[0].message.content == bad and not first.choices[0].message.tool_calls
    assert "not valid JSON" in first.model_extra["teamrl"]["format_error"]


@pytest.mark.parametrize("program, error", [("crash", "RuntimeError: the program broke"),
                                            ("garbage", "returned int, not the answer text"),
                                            ("hang", "TimeoutError: the program ran past timeout_s=1")])
def test_a_failing_program_fails_its_episode_and_keeps_its_calls(tokenizer, program, error):
    r = rollout(tokenizer, Scripted(tokenizer, ["hi"]), program=f"tests.serve.programs:{program}", timeout_s=1)
    ep = Episode(prompt_index=0, index=0, problem_id="p")
    exc, = r.dispatcher.run([r._run_one(ep, problems(1, f"fail-{program}")[0])])
    assert exc is not None and ep.error is not None and error in ep.error
    assert [s.agent for s in ep.steps] == ([] if program == "garbage" else ["planner"])  # the transcript is kept


class Slow(Scripted):
    """A Scripted engine whose every batch takes ``seconds`` (blocking the event loop, as real generation does)."""

    def __init__(self, tokenizer, replies: list[str], seconds: float):
        super().__init__(tokenizer, replies)
        self.seconds = seconds

    def generate(self, requests, on_progress=None):
        time.sleep(self.seconds)
        return super().generate(requests, on_progress)


def test_time_spent_generating_does_not_count_against_the_timeout(tokenizer):
    r = rollout(tokenizer, Slow(tokenizer, ["hi"], seconds=0.8), program="tests.serve.programs:two_roles", timeout_s=0.5)
    eps = r.collect(problems(2, "slow"), 1, progress=False)  # two batches of 0.8 s each: wall time > 3 x timeout_s
    assert [ep.error for ep in eps] == [None, None] and [len(ep.steps) for ep in eps] == [2, 2]


def test_when_every_program_fails_the_rollout_says_why(tokenizer):
    r = rollout(tokenizer, Scripted(tokenizer, ["hi"]), program="tests.serve.programs:garbage")
    with pytest.raises(RuntimeError, match="all 2 episodes failed.*returned int"):
        r.collect(problems(2, "garb"), 1, progress=False)


def test_a_command_program_gets_the_endpoint_in_its_environment(tokenizer, tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(
        "import os, sys, openai\n"
        "q = sys.stdin.read()\n"
        "assert q == os.environ['TEAMRL_QUESTION']\n"
        "c = openai.OpenAI(max_retries=0)\n"  # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
        "r = c.chat.completions.create(model='planner', messages=[{'role': 'user', 'content': q}])\n"
        "print(r.choices[0].message.content)\n")
    eps = rollout(tokenizer, Scripted(tokenizer, ["7"]), command=["{python}", str(script)]).collect(
        problems(2, "cmd"), 1, progress=False)
    assert all(ep.error is None and ep.final == "7" and len(ep.steps) == 1 for ep in eps)
    assert [ep.reward for ep in eps] == [0.0, 0.0]  # 7 is neither 2 nor 3


def test_a_command_that_hangs_is_killed_at_its_timeout(tokenizer, tmp_path):
    script = tmp_path / "hang.py"
    script.write_text("import time\ntime.sleep(3600)\n")
    ok = tmp_path / "ok.py"
    ok.write_text("print('3')\n")
    r = rollout(tokenizer, Scripted(tokenizer, ["x"]), command=["{python}", str(script)], timeout_s=1)
    with pytest.raises(RuntimeError, match="timeout_s=1"):
        r.collect(problems(1, "cmdhang"), 1, progress=False)


def test_posted_answer_and_per_call_rewards(tokenizer):
    ep, = rollout(tokenizer, Scripted(tokenizer, ["hello"]), program="tests.serve.programs:posts").collect(
        problems(1, "post"), 1, progress=False)
    assert ep.error is None and ep.final == "posted 5" and ep.step_rewards == {0: 0.25}


def test_template_kwargs_reach_the_chat_template(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                         "<|im_start|>assistant\n{% if enable_thinking is false %}<think></think>{% endif %}")
    eng = Scripted(tok, ["fine"])
    ep, = rollout(tok, eng, program="tests.serve.programs:two_roles",
                  template_kwargs={"enable_thinking": False}).collect(problems(1, "tk"), 1, progress=False)
    assert all(tok.decode(s.prompt_ids).endswith("<think></think>") for s in ep.steps)


def test_flush_window_batches_calls_of_outside_programs(tokenizer):
    """Without a window each program's call goes alone; with one, the calls of all programs share batches."""
    sizes = {}
    for window in (0.0, 2000.0):
        eng = Scripted(tokenizer, ["ok"])
        eps = rollout(tokenizer, eng, program="tests.serve.programs:two_roles", flush_window_ms=window).collect(
            problems(4, f"win{window}"), 2, progress=False)
        assert all(ep.error is None and len(ep.steps) == 2 for ep in eps)
        sizes[window] = eng.batches
    assert sizes[2000.0] == [8, 8]  # every program waits at each of its two calls: two full batches
    assert sum(sizes[0.0]) == 16  # without one, batches are whatever happened to be pending (timing-dependent)
