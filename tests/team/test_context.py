"""Context limits per model: inferred from the model, overridable, checked on every call before the engine runs
(and before the chat template for requests whose size alone is too large); a workflow's episode fails with the
reason, the others go on."""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace

import pytest

from teamrl.domains.math.arith import ArithConfig, ArithTask
from teamrl.engines.base import GenOutput, GenRequest, SamplingParams
from teamrl.engines.hf import HFEngine
from teamrl.tasks.base import Problem
from teamrl.team.agents import get_agent
from teamrl.team.context import SANE_MODEL_MAX_LENGTH, ContextLengthError, check_chat_size, infer_context_limit
from teamrl.team.records import Episode
from teamrl.team.team import AgentBinding, Dispatcher, Team
from teamrl.team.workflows import SingleConfig, get_workflow
from teamrl.train.rollout import Rollout
from tests.conftest import HANG_S, make_tiny_model
from tests.scripted import ScriptedEngineBase


class _Echo(ScriptedEngineBase):
    """Replies "7" to every call; remembers every prompt it was given."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.prompts: list[int] = []

    def generate(self, requests: list[GenRequest], on_progress=None) -> list[GenOutput]:
        self.prompts += [len(r.prompt_ids) for r in requests]
        ids = self.tokenizer.encode("7", add_special_tokens=False)
        return [GenOutput(ids, [-0.5] * len(ids), "7", "stop") for _ in requests]


def test_the_limit_comes_from_the_override_the_model_or_a_sane_tokenizer() -> None:
    module = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=2048))
    tok = SimpleNamespace(model_max_length=4096)
    assert infer_context_limit(100, SimpleNamespace(model=module, tokenizer=tok)) == 100
    assert infer_context_limit(None, SimpleNamespace(model=module, tokenizer=tok)) == 2048
    assert infer_context_limit(None, SimpleNamespace(tokenizer=tok)) == 4096
    assert infer_context_limit(None, SimpleNamespace(max_model_len=1024, tokenizer=tok)) == 1024  # vLLM's own
    assert infer_context_limit(None, SimpleNamespace(model=module, max_model_len=4096, tokenizer=tok)) == 2048
    unset = SimpleNamespace(model_max_length=int(1e30))  # what tokenizers without a limit report
    assert infer_context_limit(None, SimpleNamespace(tokenizer=unset)) is None
    assert infer_context_limit(None, SimpleNamespace(tokenizer=SimpleNamespace(model_max_length=SANE_MODEL_MAX_LENGTH))) \
        == SANE_MODEL_MAX_LENGTH


def test_an_hf_engine_gets_its_models_limit(tokenizer) -> None:
    engine = HFEngine(make_tiny_model(tokenizer), tokenizer, seed=0)
    assert Dispatcher({"m": engine}).context_limit("m") == 512  # the tiny model's max_position_embeddings
    assert Dispatcher({"m": engine}, context_limits={"m": 64}).context_limit("m") == 64


def _team(tokenizer, limit: int | None, max_new_tokens: int = 8) -> tuple[Team, _Echo]:
    engine = _Echo(tokenizer)
    sp = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens)
    bindings = {"solver": AgentBinding(get_agent("solver"), "m", sp, "")}
    dispatcher = Dispatcher({"m": engine}, context_limits={"m": limit})
    return Team(bindings, dispatcher, Episode(prompt_index=0, index=0, problem_id="p")), engine


def _ask(team: Team, messages, **kw):
    return team.dispatcher.run([team.ask("solver", messages, **kw)])[0]


def test_a_prompt_over_the_limit_never_reaches_the_engine(tokenizer) -> None:
    team, engine = _team(tokenizer, 60)
    short = [{"role": "user", "content": "What is 3 + 4?"}]
    assert _ask(team, short).text == "7"
    n = engine.prompts[0]  # the short prompt's tokens
    team.dispatcher._limits["m"] = n + 8  # exactly fits: prompt + max_new_tokens
    assert _ask(team, short).text == "7"
    team.dispatcher._limits["m"] = n + 7
    with pytest.raises(ContextLengthError, match=rf"maximum context length is {n + 7} tokens, but the call needs "
                                                 rf"{n + 8} \({n} in the prompt, up to 8 in the reply\)") as info:
        _ask(team, short)
    assert (info.value.prompt_tokens, info.value.max_new_tokens, info.value.limit) == (n, 8, n + 7)
    assert _ask(team, short, max_new_tokens=7).text == "7"  # a lower reply limit for the call fits
    assert len(engine.prompts) == 3 and len(team.episode.steps) == 3  # the refused call recorded nothing


def test_a_huge_chat_is_refused_before_the_chat_template(tokenizer, monkeypatch) -> None:
    team, _ = _team(tokenizer, 512)

    def no_template(*args, **kwargs):
        raise AssertionError("the chat template ran on a request that cannot fit")

    monkeypatch.setattr(tokenizer, "apply_chat_template", no_template)
    start = time.perf_counter()
    with pytest.raises(ContextLengthError, match=r"needs at least 100008 \(at least 100000 in the prompt"):
        _ask(team, [{"role": "user", "content": ""}] * 100_000)
    with pytest.raises(ContextLengthError, match="at least"):
        _ask(team, [{"role": "user", "content": [{"type": "text", "text": "x" * 50_000_000}]}])
    assert time.perf_counter() - start < HANG_S  # a hang guard: the template never ran (no_template above)


def test_the_size_bound_never_refuses_a_chat_that_fits(tokenizer) -> None:
    from teamrl.team.context import max_token_chars

    chars = max_token_chars(tokenizer)
    for text in ("#" * 800, "hello world " * 200, "ĊĠ" * 300, "\n" + " " * 900):
        messages = [{"role": "user", "content": text}, {"role": "assistant", "content": text}]
        ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
        check_chat_size("m", messages, 0, len(ids), chars)  # the bound is at most the true count


def test_an_over_long_problem_fails_only_its_own_episodes(tokenizer) -> None:
    engine = _Echo(tokenizer)
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    bindings = {"solver": AgentBinding(get_agent("solver"), "m", sp, get_agent("solver").system_prompt)}
    ro = Rollout(Dispatcher({"m": engine}, context_limits={"m": 300}), bindings, get_workflow("single"),
                 SingleConfig(), ArithTask(ArithConfig()))
    problems = [Problem(id="ok", question="What is 3 + 4?", answer="7"),
                Problem(id="long", question="What is 3 + 4? " * 200, answer="7")]
    eps = ro.collect(problems, 2, progress=False)
    assert [ep.error is None for ep in eps] == [True, True, False, False]
    assert all(ep.reward == 1.0 for ep in eps[:2])
    for ep in eps[2:]:
        assert "ContextLengthError: model 'm': maximum context length is 300 tokens" in (ep.error or "")
        assert ep.info["context_length_exceeded"]["limit"] == 300 and ep.steps == []
    assert len(engine.prompts) == 2  # the long prompt never reached the engine


def test_max_context_is_a_validated_config_key() -> None:
    from teamrl.config.schema import load_config

    assert load_config(None, ["models.main.max_context=4096"]).models["main"].max_context == 4096
    assert load_config(None, []).models["main"].max_context is None
    with pytest.raises(ValueError, match="max_context 1 must be >= 2 tokens"):
        load_config(None, ["models.main.max_context=1"])


class _OneLongProblemTask:
    """Two train problems, one of them far over the tiny model's 512-token context; every answer scores 1."""

    name, answer_format = "one_long_problem", "Give the answer as a number."

    def __init__(self, cfg: object = None) -> None:
        self._problems = [Problem(id="short", question="What is 3 + 4?", answer="7"),
                          Problem(id="long", question="What is 3 + 4? " * 300, answer="7")]

    def problems(self, split: str) -> list[Problem]:
        return list(self._problems)

    def extract_answer(self, response: str) -> str | None:
        return response

    def score(self, problem: Problem, response: str) -> float:
        return 1.0


def test_training_counts_context_failures_and_goes_on(tmp_path, tiny_model_dir) -> None:
    import json

    from teamrl.tasks.base import TASKS, register_task
    from teamrl.train.trainer import Trainer
    from tests.train.test_trainer import tiny_config

    if "one_long_problem" not in TASKS:
        register_task("one_long_problem")(_OneLongProblemTask)
    cfg = tiny_config(tmp_path, tiny_model_dir, "c", "task.name=one_long_problem", "train.steps=1",
                      "workflow.name=single", "eval.before=false", "eval.after=false")
    Trainer(cfg, progress=False).train()
    metrics = json.loads((tmp_path / "c" / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["rollout/context_length_exceeded"] == 3.0 and metrics["rollout/failed_episodes"] == 3.0
    failed = [json.loads(line) for line in (tmp_path / "c" / "failed_episodes.jsonl").read_text().splitlines()]
    assert {f["problem_id"] for f in failed} == {"long"} and all("maximum context length is 512" in f["error"]
                                                                  for f in failed)


@pytest.mark.parametrize("side", ["left", "right", "middle"])
def test_a_prompt_over_max_prompt_tokens_is_cut_as_verl_cuts_it(tokenizer, side) -> None:
    """The engine and the recorded step get the cut prompt; ``error`` refuses the call; a cut prompt that fits is
    not refused by the size check that runs before tokenizing."""
    long = [{"role": "user", "content": "word " * 200}]
    team, engine = _team(tokenizer, None)
    _ask(team, long)
    full = team.episode.steps[0].prompt_ids
    team, engine = _team(tokenizer, 40)  # the uncut prompt is far over the model's limit of 40
    team.bindings["solver"] = dataclasses.replace(team.bindings["solver"], max_prompt_tokens=30, truncation=side)
    _ask(team, long)
    want = {"left": full[-30:], "right": full[:30], "middle": full[:15] + full[-15:]}[side]
    assert team.episode.steps[0].prompt_ids == want and engine.prompts == [30]


def test_truncation_error_refuses_a_long_prompt(tokenizer) -> None:
    team, engine = _team(tokenizer, None)
    team.bindings["solver"] = dataclasses.replace(team.bindings["solver"], max_prompt_tokens=30, truncation="error")
    with pytest.raises(ContextLengthError, match="over max_prompt_tokens 30"):
        _ask(team, [{"role": "user", "content": "word " * 200}])
    assert engine.prompts == []
