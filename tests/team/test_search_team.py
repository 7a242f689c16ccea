"""The search team's control flow, checked with a scripted engine that replays fixed replies.

The engine stands in for a model so that every branch is hit exactly (see test_workflows.py); it
tokenizes with the real tokenizer, so Steps carry real ids. Searches run over a small in-test
corpus, in-process or through a real retrieval server on loopback.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest

from teamrl.cli import main
from teamrl.domains.math.arith import ArithTask
from teamrl.domains.search.search import SearchTask
from teamrl.domains.search.search_team import SearchTeamConfig, format_information, parse_answer, parse_search
from teamrl.engines.base import GenOutput, GenRequest, SamplingParams
from teamrl.tasks.base import Problem
from teamrl.team.agents import get_agent
from teamrl.team.records import Episode
from teamrl.team.team import AgentBinding, Dispatcher
from teamrl.team.workflows import get_workflow
from teamrl.train.rollout import Rollout
from tests.conftest import REPO, shared_data
from tests.scripted import ScriptedEngineBase
from tests.search.helpers import retriever_process, write_corpus

AGENTS = ("router", "searcher", "answerer")
PROBLEM = Problem(id="p", question="In which country is the Eiffel Tower?", answer="France",
                  meta={"answers": ["France", "French Republic"]})


class ScriptedEngine(ScriptedEngineBase):
    """Answers each call with ``script(agent, prompt)``; the agent is found by its system prompt."""

    def __init__(self, tokenizer, script: Callable[[str, str], str],
                 on_batch: Callable[[list[str]], None] | None = None):
        super().__init__(tokenizer)
        self.script, self.on_batch = script, on_batch
        self.batches: list[list[str]] = []

    def generate(self, requests: list[GenRequest], on_progress=None) -> list[GenOutput]:
        prompts = [self.tokenizer.decode(r.prompt_ids) for r in requests]
        agents = [next(a for a in AGENTS if get_agent(a).system_prompt in p) for p in prompts]
        self.batches.append(agents)
        if self.on_batch is not None:
            self.on_batch(agents)
        outs = []
        for agent, prompt in zip(agents, prompts):
            text = self.script(agent, prompt)
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            outs.append(GenOutput(ids, [-0.5] * len(ids), text, "stop"))
        return outs


def replay(replies: dict[str, list[str]]) -> Callable[[str, str], str]:
    """Each agent's replies in order; the last one repeats."""
    queues = {k: list(v) for k, v in replies.items()}
    return lambda agent, prompt: queues[agent].pop(0) if len(queues[agent]) > 1 else queues[agent][0]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl")


@pytest.fixture(scope="module")
def task(corpus, tmp_path_factory):
    nq = tmp_path_factory.mktemp("data") / "nq.jsonl"
    nq.write_text('{"question": "in which country is the eiffel tower?", "answer": ["France"]}\n')
    return SearchTask({"train_path": str(nq), "corpus_path": str(corpus), "topk": 2,
                       "index_dir": str(tmp_path_factory.mktemp("ix"))})


def _rollout(tokenizer, script, cfg: SearchTeamConfig, task, on_batch=None) -> tuple[Rollout, ScriptedEngine]:
    eng = ScriptedEngine(tokenizer, script, on_batch)
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    bindings = {a: AgentBinding(get_agent(a), "m", sp, get_agent(a).system_prompt) for a in AGENTS}
    return Rollout(Dispatcher({"m": eng}), bindings, get_workflow("search_team"), cfg, task), eng


def _calls(ep: Episode) -> list[str]:
    return [s.agent for s in ep.steps]


def test_yes_goes_straight_to_the_answer(tokenizer, task):
    ro, _ = _rollout(tokenizer, replay({"router": ["Yes."], "answerer": ["<answer>France</answer>"],
                                        "searcher": ["<search>x</search>"]}), SearchTeamConfig(), task)
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    assert _calls(ep) == ["router", "answerer"] and all(s.valid for s in ep.steps)
    assert ep.final == "<answer>France</answer>" and ep.reward == 1.0
    assert ep.info == {"turns": 1, "searches": 0, "answered": True}


def test_no_search_yes_answer(tokenizer, task):
    ro, _ = _rollout(tokenizer, replay({"router": ["no", "yes"], "searcher": ["<search>Eiffel Tower Paris</search>"],
                                        "answerer": ["It is in <answer>the French Republic</answer>"]}),
                     SearchTeamConfig(max_turns=3), task)
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    assert _calls(ep) == ["router", "searcher", "router", "answerer"]
    assert [s.agent_call for s in ep.steps] == [0, 0, 1, 0]
    assert ep.reward == 1.0 and ep.info == {"turns": 2, "searches": 1, "answered": True}
    second_router = tokenizer.decode(ep.steps[2].prompt_ids)
    assert "Search 1: Eiffel Tower Paris\n<information>Doc 1 (Title: Eiffel Tower) The Eiffel Tower is" in second_router
    assert "Doc 2 (Title: Paris)" in second_router  # topk = 2
    assert "Doc 1 (Title: Eiffel Tower)" in tokenizer.decode(ep.steps[3].prompt_ids)  # the answerer sees it too
    assert "Nothing has been searched yet." in tokenizer.decode(ep.steps[0].prompt_ids)


def test_max_turns_without_force_answer_gives_no_answer(tokenizer, task):
    ro, _ = _rollout(tokenizer, replay({"router": ["no"], "searcher": ["<search>Eiffel</search>"],
                                        "answerer": ["<answer>France</answer>"]}),
                     SearchTeamConfig(max_turns=3, force_answer=False), task)
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    assert _calls(ep) == ["router", "searcher"] * 3
    assert ep.final is None and ep.reward == 0.0
    assert ep.info == {"turns": 3, "searches": 3, "answered": False}


def test_max_turns_with_force_answer_ends_with_the_answerer(tokenizer, task):
    ro, _ = _rollout(tokenizer, replay({"router": ["no"], "searcher": ["<search>Eiffel</search>"],
                                        "answerer": ["<answer>France</answer>"]}),
                     SearchTeamConfig(max_turns=3, force_answer=True), task)
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    assert _calls(ep) == ["router", "searcher", "router", "searcher", "answerer"]
    assert ep.reward == 1.0 and ep.info == {"turns": 3, "searches": 2, "answered": True}
    ro1, _ = _rollout(tokenizer, replay({"router": ["no"], "searcher": ["<search>q</search>"],
                                         "answerer": ["<answer>France</answer>"]}),
                      SearchTeamConfig(max_turns=1, force_answer=True), task)
    assert _calls(ro1.collect([PROBLEM], 1, progress=False)[0]) == ["answerer"]


@pytest.mark.parametrize("reply,valid,searches", [
    ("I would search for the tower.", False, 0),                       # no tags
    ("<search>Eiffel <search>Tower</search></search>", False, 0),       # nested
    ("<search>Eiffel</search><search>Tower</search>", False, 0),        # repeated
    ("<search>   </search>", False, 0),                                 # empty query
    ("<search>Eiffel Tower", False, 0),                                 # unclosed (cut off)
    ("<search>" + "Eiffel Tower " * 40 + "</search>", False, 1),        # too long: cut, run, invalid
    ("Let me look. <SEARCH>Eiffel Tower</SEARCH>", True, 1),
])
def test_malformed_queries_are_invalid_steps_not_crashes(tokenizer, task, reply, valid, searches):
    ro, _ = _rollout(tokenizer, replay({"router": ["no", "yes"], "searcher": [reply],
                                        "answerer": ["<answer>France</answer>"]}), SearchTeamConfig(), task)
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    assert _calls(ep) == ["router", "searcher", "router", "answerer"]
    assert ep.steps[1].valid is valid and ep.info["searches"] == searches and ep.reward == 1.0


def test_parse_search_rules():
    long = "word " * 100
    cut = parse_search(f"<search>{long}</search>", max_chars=20)
    assert cut.valid is False and cut.value == "word word word word" and len(cut.value) <= 20
    assert parse_search("<search>a\n\tb</search>").value == "a b"
    assert parse_search("</search>a<search>").valid is False
    assert parse_answer("<answer>Paris</answer>").value == "Paris"
    assert parse_answer("<answer><answer>Paris</answer></answer>").valid is False


@pytest.mark.parametrize("on_invalid,calls", [("search", ["router", "searcher", "router", "searcher"]),
                                              ("answer", ["router", "answerer"])])
def test_unreadable_router_verdict_follows_config(tokenizer, task, on_invalid, calls):
    cfg = SearchTeamConfig(max_turns=2, on_invalid_verdict=on_invalid)
    ro, _ = _rollout(tokenizer, replay({"router": ["maybe"], "searcher": ["<search>Eiffel</search>"],
                                        "answerer": ["<answer>France</answer>"]}), cfg, task)
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    assert _calls(ep) == calls and ep.steps[0].valid is False


def test_strict_verdict_parsing(tokenizer, task):
    cfg = SearchTeamConfig(max_turns=1, verdict_parse="strict", on_invalid_verdict="search")
    ro, _ = _rollout(tokenizer, replay({"router": ["I think yes"], "searcher": ["<search>Eiffel</search>"],
                                        "answerer": ["<answer>France</answer>"]}), cfg, task)
    assert _calls(ro.collect([PROBLEM], 1, progress=False)[0]) == ["router", "searcher"]


def test_episodes_are_batched_and_share_searches(tokenizer, task):
    def script(agent: str, prompt: str) -> str:  # the router is satisfied once it sees documents
        return {"router": "yes" if "<information>" in prompt else "no", "searcher": "<search>Eiffel</search>",
                "answerer": "<answer>France</answer>"}[agent]

    ro, eng = _rollout(tokenizer, script, SearchTeamConfig(), task)
    before = task._search.calls
    eps = ro.collect([PROBLEM, PROBLEM], 4, progress=False)
    assert [len(b) for b in eng.batches] == [8, 8, 8, 8]  # router, searcher, router, answerer: all episodes at once
    assert task._search.calls - before == 1  # eight queries, one retrieve call
    assert all(ep.reward == 1.0 for ep in eps)


def test_answerer_without_tags_is_invalid_and_scores_zero(tokenizer, task):
    ro, _ = _rollout(tokenizer, replay({"router": ["yes"], "searcher": ["<search>x</search>"],
                                        "answerer": ["France"]}), SearchTeamConfig(), task)
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    assert ep.steps[1].valid is False and ep.reward == 0.0 and ep.final == "France"


def test_a_task_without_retrieve_is_a_clear_error(tokenizer):
    ro, _ = _rollout(tokenizer, replay({"router": ["no"], "searcher": ["<search>x</search>"], "answerer": ["1"]}),
                     SearchTeamConfig(), ArithTask())
    with pytest.raises(RuntimeError, match="needs a task that can search.*task.name=search"):
        ro.collect([PROBLEM], 1, progress=False)


class _SyncSearchTask(ArithTask):
    """A task whose retrieve is an ordinary blocking function (run in a worker thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.queries: list[str] = []

    def retrieve(self, queries: list[str]) -> list[list[dict]]:
        self.queries += queries
        return [[{"id": "1", "contents": '"Tower"\nThe tower is in France.'}] for _ in queries]


def test_blocking_retrieve_of_other_tasks_is_supported(tokenizer):
    task = _SyncSearchTask()
    ro, _ = _rollout(tokenizer, replay({"router": ["no", "yes"], "searcher": ["<search>tower</search>"],
                                        "answerer": ["7"]}), SearchTeamConfig(), task)
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    assert task.queries == ["tower"] and ep.info["searches"] == 1
    assert "Doc 1 (Title: Tower) The tower is in France." in tokenizer.decode(ep.steps[2].prompt_ids)


def test_format_information_cuts_long_documents():
    from teamrl.domains.search.index import Doc

    docs = [Doc("1", '"A"\n' + "x" * 50), {"id": "2", "contents": '"B"\nshort'}]
    assert format_information(docs, max_chars=10) == (
        "<information>Doc 1 (Title: A) xxxxxxxxxx...\nDoc 2 (Title: B) short</information>")


def test_service_killed_mid_run_keeps_finished_episodes(tokenizer, corpus, tmp_path):
    """Episode 0 answers at once; episode 1 searches after the service was killed: it fails with the
    documented error naming the URL, after the retries, and episode 0's record is intact."""
    with retriever_process(corpus, tmp_path / "ix") as srv:
        remote = SearchTask({"train_path": str(_nq(tmp_path)), "retriever_url": srv.url, "retries": 2,
                             "backoff_s": 0.05, "timeout_s": 2.0})

        def script(agent: str, prompt: str) -> str:
            quick = "Question: quick" in prompt
            return {"router": "yes" if quick else "no", "searcher": "<search>Eiffel Tower</search>",
                    "answerer": "<answer>France</answer>"}[agent]

        def kill_before_search(agents: list[str]) -> None:
            if "searcher" in agents:
                srv.kill()

        ro, _ = _rollout(tokenizer, script, SearchTeamConfig(), remote, on_batch=kill_before_search)
        assert asyncio.run(remote.retrieve(["Eiffel"]))[0][0].title == "Eiffel Tower"  # the service works
        problems = [Problem(id="quick", question="quick: where is the tower?", answer="France",
                            meta={"answers": ["France"]}), PROBLEM]
        episodes = ro.collect(problems, 1, progress=False)
    failed = episodes[1]
    assert failed.error is not None and "RetrieverUnavailableError" in failed.error
    assert f"{srv.url}/retrieve" in failed.error and "after 3 attempt(s)" in failed.error
    assert "episode 1" in failed.error
    done = episodes[0]
    assert done.error is None
    assert _calls(done) == ["router", "answerer"] and done.final == "<answer>France</answer>" and done.reward == 1.0
    assert done.info == {"turns": 1, "searches": 0, "answered": True}
    assert _calls(episodes[1]) == ["router", "searcher"]  # its calls up to the failure are kept too


def _nq(tmp_path):
    path = tmp_path / "nq.jsonl"
    path.write_text('{"question": "q?", "answer": ["a"]}\n')
    return path


@pytest.mark.skipif(not (shared_data() / "hotpotqa_distractor_rpt").is_dir(),
                    reason=f"{shared_data()}/hotpotqa_distractor_rpt is absent")
def test_search_quickstart_trains_a_step_with_a_tiny_model(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    rc = main(["train", "configs/search_quickstart.yaml", f"run_dir={tmp_path / 'run'}",
               f"models.main.path={tiny_model_dir}", f"task.search.index_dir={tmp_path / 'ix'}",
               "rollout.batch_size=1", "rollout.group_size=2", "train.steps=1", "train.transcripts_per_step=2",
               "eval.before=false", "eval.after=false", "agents.router.max_new_tokens=4",
               "agents.searcher.max_new_tokens=6", "agents.answerer.max_new_tokens=6"])
    assert rc == 0
    episodes = [json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 2 and all(ep["turns"][-1]["agent"] == "answerer" for ep in episodes)  # force_answer
    metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert {"agent/router/calls", "agent/answerer/calls"} <= set(metrics)


class PrefillEngine(ScriptedEngine):
    """Records each request's sampling and ends the replies listed in ``cut`` by length."""

    def __init__(self, tokenizer, script, cut: set[str] = frozenset()):
        super().__init__(tokenizer, script)
        self.cut, self.requests = cut, []

    def generate(self, requests, on_progress=None):
        self.requests += requests
        outs = super().generate(requests, on_progress)
        return [GenOutput(o.response_ids, o.logprobs, o.text, "length" if o.text in self.cut else "stop") for o in outs]


def test_prefill_tags_start_replies_and_close_them_at_end_of_turn(tokenizer, task):
    eng = PrefillEngine(tokenizer, replay({"router": ["no"], "searcher": ["Eiffel Tower"], "answerer": [" France"]}))
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    bindings = {a: AgentBinding(get_agent(a), "m", sp, get_agent(a).system_prompt) for a in AGENTS}
    ro = Rollout(Dispatcher({"m": eng}), bindings, get_workflow("search_team"),
                 SearchTeamConfig(max_turns=2, force_answer=True, prefill_tags=True), task)
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    router, searcher, answerer = ep.steps
    assert tokenizer.decode(searcher.prompt_ids).endswith("<search>")  # the tag is prompt, not trained on
    assert tokenizer.decode(answerer.prompt_ids).endswith("<answer>")
    assert searcher.text == "<search>Eiffel Tower</search>" and searcher.valid
    assert answerer.text == "<answer> France</answer>" and answerer.valid
    assert tokenizer.decode(searcher.response_ids) == "Eiffel Tower"
    assert ep.reward == 1.0 and ep.info["searches"] == 1
    assert [r.sampling.stop for r in eng.requests] == [(), ("</search>",), ("</answer>",)]
    assert "Search 1: Eiffel Tower" in tokenizer.decode(answerer.prompt_ids)


def test_prefill_reply_cut_by_length_stays_malformed(tokenizer, task):
    eng = PrefillEngine(tokenizer, replay({"router": ["no"], "searcher": ["Eiffel Tower and more"],
                                          "answerer": ["France is"]}), cut={"Eiffel Tower and more", "France is"})
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    bindings = {a: AgentBinding(get_agent(a), "m", sp, get_agent(a).system_prompt) for a in AGENTS}
    ro = Rollout(Dispatcher({"m": eng}), bindings, get_workflow("search_team"),
                 SearchTeamConfig(max_turns=2, force_answer=True, prefill_tags=True), task)
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    assert [s.valid for s in ep.steps] == [True, False, False]
    assert ep.info["searches"] == 0 and ep.reward == 0.0


def test_dr_mas_turn_rules_no_last_search_and_a_malformed_answer_goes_on(tokenizer, task):
    """Dr. MAS's orchestra: the last turn runs no search, and an answer without tags is an invalid step after
    which the router speaks again (search_last_turn: false, end_on_malformed_answer: false)."""
    cfg = SearchTeamConfig(max_turns=3, search_last_turn=False)
    ro, _ = _rollout(tokenizer, replay({"router": ["no"], "searcher": ["<search>Eiffel</search>"],
                                        "answerer": ["<answer>France</answer>"]}), cfg, task)
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    assert _calls(ep) == ["router", "searcher", "router", "searcher", "router"]
    assert ep.final is None and ep.info == {"turns": 3, "searches": 2, "answered": False}
    cfg = SearchTeamConfig(max_turns=3, end_on_malformed_answer=False)
    ro, _ = _rollout(tokenizer, replay({"router": ["yes"], "searcher": ["<search>x</search>"],
                                        "answerer": ["France", "<answer>France</answer>"]}), cfg, task)
    [ep] = ro.collect([PROBLEM], 1, progress=False)
    assert _calls(ep) == ["router", "answerer", "router", "answerer"]
    assert [s.valid for s in ep.steps] == [True, False, True, True] and ep.reward == 1.0
    assert ep.info == {"turns": 2, "searches": 0, "answered": True}
