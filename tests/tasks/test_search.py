"""The search task: data loading, answer extraction and scoring, and where documents come from."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from teamrl.config.schema import load_config, task_options
from teamrl.domains.search.index import Doc
from teamrl.domains.search.search import SearchConfig, SearchTask
from teamrl.tasks.base import Problem, build_task
from tests.conftest import REPO, shared_data
from tests.search.helpers import retriever_process, write_corpus

DATA = shared_data()


def _hotpot_rows(n: int, start: int = 10) -> list[dict]:
    """Questions about numbered landmarks (two-digit numbers: one-character words are not indexed)."""
    rows = []
    for i in range(start, start + n):
        rows.append({"id": f"h{i}", "question": f"Where is landmark {i}?", "answer": f"City {i}", "type": "bridge",
                     "context": {"title": [f"Landmark {i}", f"City {i}"],
                                 "sentences": [[f"Landmark {i} stands in City {i}."], [f"City {i} is a town."]]}})
    return rows


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


@pytest.fixture()
def hotpot_files(tmp_path) -> tuple[str, str]:
    return _jsonl(tmp_path / "train.jsonl", _hotpot_rows(6)), _jsonl(tmp_path / "test.jsonl", _hotpot_rows(3, 100))


def test_problems_answers_and_order(hotpot_files, tmp_path):
    train, test = hotpot_files
    task = build_task("search", {"train_path": train, "test_path": test, "index_dir": str(tmp_path / "ix"), "seed": 1})
    assert isinstance(task, SearchTask) and task.name == "search"
    assert [p.id for p in task.problems("test")] == ["h100", "h101", "h102"]  # file order
    tr = task.problems("train")
    ids = [p.id for p in tr]
    assert sorted(ids) == [f"h{i}" for i in range(10, 16)] and ids != sorted(ids)  # shuffled
    assert tr == SearchTask(SearchConfig(train_path=train, test_path=test, index_dir=str(tmp_path / "ix"),
                                         seed=1)).problems("train")
    assert task.problems("test")[0].meta["answers"] == ["City 100"]
    limited = SearchTask({"train_path": train, "test_path": test, "limit_train": 2, "limit_test": 1,
                          "index_dir": str(tmp_path / "ix")})
    assert len(limited.problems("train")) == 2 and len(limited.problems("test")) == 1


def test_several_files_get_prefixed_ids(hotpot_files, tmp_path):
    train, test = hotpot_files
    task = SearchTask({"train_path": [train, test], "index_dir": str(tmp_path / "ix")})
    assert {p.id for p in task.problems("train")} >= {"train:h10", "test:h100"}
    with pytest.raises(ValueError, match="no test questions; set task.search.test_path"):
        task.problems("test")


@pytest.mark.parametrize("metric,reply,reward", [
    ("em", "I found it. <answer>the Eiffel Tower</answer>", 1.0),
    ("em", "<answer>Eiffel Tower in Paris</answer>", 0.0),
    ("substring_em", "<answer>Eiffel Tower in Paris</answer>", 1.0),
    ("f1", "<answer>Eiffel Tower in Paris</answer>", 2 * (2 / 4) * 1 / (2 / 4 + 1)),  # P 2/4, R 2/2
    ("em", "Eiffel Tower", 0.0),  # no answer tags
    ("em", "<answer>Eiffel Tower</answer> or <answer>Louvre</answer>", 0.0),  # two answers
    ("em", "<answer>Tour Eiffel</answer>", 1.0),  # second gold answer
])
def test_score(hotpot_files, tmp_path, metric, reply, reward):
    train, _ = hotpot_files
    task = SearchTask({"train_path": train, "metric": metric, "index_dir": str(tmp_path / "ix")})
    problem = Problem(id="p", question="?", answer="Eiffel Tower", meta={"answers": ["Eiffel Tower", "Tour Eiffel"]})
    assert task.score(problem, reply) == pytest.approx(reward)


def test_all_scores_reports_every_metric(hotpot_files, tmp_path):
    train, _ = hotpot_files
    task = SearchTask({"train_path": train, "metric": "em", "index_dir": str(tmp_path / "ix")})
    problem = Problem(id="p", question="?", answer="Eiffel Tower", meta={"answers": ["Eiffel Tower"]})
    scores = task.all_scores(problem, "<answer>Eiffel Tower in Paris</answer>")
    assert scores == pytest.approx({"em": 0.0, "f1": 2 * (2 / 4) / (2 / 4 + 1), "substring_em": 1.0})
    assert task.all_scores(problem, "no tags") == {"em": 0.0, "f1": 0.0, "substring_em": 0.0}


def test_extract_answer(hotpot_files, tmp_path):
    task = SearchTask({"train_path": hotpot_files[0], "index_dir": str(tmp_path / "ix")})
    assert task.extract_answer("so <answer> Paris </answer>") == "Paris"
    assert task.extract_answer("<answer></answer>") is None
    assert task.extract_answer("<answer>Paris") is None


def test_corpus_is_made_from_the_data_paragraphs(hotpot_files, tmp_path):
    train, test = hotpot_files
    task = SearchTask({"train_path": train, "test_path": test, "index_dir": str(tmp_path / "ix"), "topk": 2})
    assert task.corpus_path is not None and task.corpus_path.parent == tmp_path / "ix"
    assert len(task.corpus_path.read_text().splitlines()) == 2 * (6 + 3)
    [docs] = asyncio.run(task.retrieve(["landmark 101"]))
    assert len(docs) == 2 and isinstance(docs[0], Doc) and docs[0].title == "Landmark 101"
    # the same data files give the same corpus file (content-hash name), written once
    again = SearchTask({"train_path": train, "test_path": test, "index_dir": str(tmp_path / "ix")})
    assert again.corpus_path == task.corpus_path


def test_concurrent_searches_share_one_retrieve_call(hotpot_files, tmp_path):
    task = SearchTask({"train_path": hotpot_files[0], "index_dir": str(tmp_path / "ix"), "topk": 1})

    async def many():
        return await asyncio.gather(*(task.retrieve([f"landmark {i}"]) for i in range(10, 15)))

    results = asyncio.run(many())
    assert [r[0][0].title for r in results] == [f"Landmark {i}" for i in range(10, 15)]
    assert task._search.calls == 1


def test_file_errors_come_when_the_task_is_built(tmp_path, hotpot_files):
    with pytest.raises(FileNotFoundError, match="task.search.train_path: .*missing.jsonl does not exist"):
        SearchTask({"train_path": str(tmp_path / "missing.jsonl")})
    with pytest.raises(FileNotFoundError, match="task.search.corpus_path: .*teamrl build-corpus"):
        SearchTask({"train_path": hotpot_files[0], "corpus_path": str(tmp_path / "nope.jsonl")})
    nq = _jsonl(tmp_path / "nq.jsonl", [{"question": "who?", "answer": ["me"]}])
    with pytest.raises(ValueError, match="no documents to search.*retriever_url"):
        SearchTask({"train_path": nq, "index_dir": str(tmp_path / "ix")})
    with pytest.raises(ValueError, match="format 'nqq' is unknown"):
        SearchTask({"train_path": nq, "format": "nqq"})
    with pytest.raises(ValueError, match="topk 0 must be >= 1"):
        SearchConfig(topk=0)


def test_explicit_corpus_and_service_give_the_same_documents(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    nq = _jsonl(tmp_path / "nq.jsonl", [{"question": "what is the capital of france?", "answer": ["Paris"]}])
    local = SearchTask({"train_path": nq, "corpus_path": str(corpus), "index_dir": str(tmp_path / "ix")})
    with retriever_process(corpus, tmp_path / "ix") as srv:
        remote = SearchTask({"train_path": nq, "retriever_url": srv.url})
        queries = ["capital of France", "longest river", "Nobel Prizes"]
        assert asyncio.run(remote.retrieve(queries)) == asyncio.run(local.retrieve(queries))
        assert remote.retrieve_hits(queries, 5) == local.retrieve_hits(queries, 5)
    assert remote.corpus_path is None and local.corpus_path == corpus


def test_config_files_are_not_checked_at_validation():
    cfg = load_config(None, ["task.name=search", "task.search.train_path=/nowhere/train.jsonl",
                             "task.search.retriever_url=http://127.0.0.1:1", "workflow.name=search_team",
                             "agents={router: {}, searcher: {}, answerer: {}}"])
    assert task_options(cfg.task).train_path == "/nowhere/train.jsonl"


@pytest.mark.skipif(not (DATA / "hotpotqa_distractor_rpt").is_dir(), reason=f"{DATA}/hotpotqa_distractor_rpt is absent")
def test_search_quickstart_task_finds_gold_paragraphs(monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    cfg = load_config(REPO / "configs" / "search_quickstart.yaml")
    opts = task_options(cfg.task)
    opts.index_dir = str(tmp_path / "ix")
    task = build_task(cfg.task.name, opts)
    assert len(task.problems("train")) == 300 and len(task.problems("test")) == cfg.task.search.limit_test
    problem = task.problems("test")[0]
    with (DATA / "hotpotqa_distractor_rpt" / "test.jsonl").open() as f:
        rows = {row["id"]: row for row in map(json.loads, f)}
    gold_titles = set(rows[problem.id]["supporting_facts"]["title"])
    [hits] = task.retrieve_hits([problem.question], 10)
    assert gold_titles & {h.doc.title for h in hits}


def test_an_unreachable_service_is_reported_when_the_task_is_built(tmp_path):
    import socket

    from teamrl.domains.search.client import RetrieverUnavailableError

    with socket.socket() as s:  # a loopback port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nq = _jsonl(tmp_path / "nq.jsonl", [{"question": "who?", "answer": ["me"]}])
    with pytest.raises(RetrieverUnavailableError, match=f"http://127.0.0.1:{port}/retrieve .*after 2 attempt"):
        SearchTask({"train_path": nq, "retriever_url": f"http://127.0.0.1:{port}", "retries": 1, "backoff_s": 0.01})


def test_questions_without_paragraphs_warn_which_corpus_they_search(hotpot_files, tmp_path, caplog):
    train, _ = hotpot_files
    nq = _jsonl(tmp_path / "nq_test.jsonl", [{"question": "who?", "answer": ["me"]}])
    with caplog.at_level("WARNING", logger="teamrl.domains.search.search"):
        task = SearchTask({"train_path": train, "test_path": nq, "index_dir": str(tmp_path / "ix")})
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "nq_test.jsonl has no paragraphs" in warning and str(task.corpus_path) in warning
    assert f"made from the paragraphs of {Path(train).resolve()}" in warning
    caplog.clear()
    with caplog.at_level("WARNING", logger="teamrl.domains.search.search"):
        SearchTask({"train_path": train, "test_path": hotpot_files[1], "index_dir": str(tmp_path / "ix")})
    assert not caplog.records  # every file brings its own paragraphs


@pytest.mark.parametrize("metric", ["f1", "em", "substring_em"])
def test_passed_is_exact_match_whatever_the_reward_metric(hotpot_files, tmp_path, metric):
    task = SearchTask({"train_path": hotpot_files[0], "metric": metric, "index_dir": str(tmp_path / "ix")})
    gold = Problem(id="p", question="?", answer="Northwestern Catalan and Valencian",
                   meta={"answers": ["Northwestern Catalan and Valencian"]})
    assert task.score(gold, "<answer>and</answer>") == (pytest.approx(2 / 5) if metric == "f1" else 0.0)
    assert not task.passed(gold, "<answer>and</answer>")  # F1 0.4 > 0, but not solved
    assert task.passed(gold, "<answer>the northwestern Catalan and Valencian</answer>")
    assert not task.passed(gold, "no tags") and task.pass_label == "EM"


@pytest.mark.skipif(not (DATA / "hotpotqa_distractor_rpt").is_dir(), reason=f"{DATA}/hotpotqa_distractor_rpt is absent")
def test_eval_names_the_benchmark_file_and_labels_pass_at_k_em(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from teamrl.cli import main

    monkeypatch.chdir(REPO)
    out = tmp_path / "eval"
    rc = main(["eval", "configs/search_quickstart.yaml", f"models.main.path={tiny_model_dir}",
               f"task.search.index_dir={tmp_path / 'ix'}", "eval.problems=2", "agents.router.max_new_tokens=3",
               "agents.searcher.max_new_tokens=4", "agents.answerer.max_new_tokens=4", "--untrained", "--k", "2",
               "--out", str(out)])
    assert rc == 0
    [(name, r)] = json.loads((out / "eval.json").read_text())["benchmarks"].items()
    assert name == "hotpotqa_distractor_rpt/test.jsonl"  # the file, not "search"
    assert {"pass@1 (EM)", "pass@2 (EM)"} <= r.keys() and not any(k in r for k in ("pass@1", "pass@2"))
    assert "| benchmark | problems | n | avg@n | pass@2 (EM) |" in capsys.readouterr().out
    assert (out / "eval_hotpotqa_distractor_rpt_test_jsonl.json").is_file()


# --------------------------------------------------------------------------- Hugging Face dataset ids


def _r1_rows(split: str) -> list[dict]:
    """Rows as Search-R1's nq_hotpotqa_train parquet holds them (question, golden_answers, data_source)."""
    sources = ["nq", "hotpotqa"] if split == "train" else ["nq", "nq", "nq", "triviaqa", "bamboogle", "bamboogle"]
    return [{"id": f"{split}_{i}", "question": f"Which city is landmark {10 + i} in?",
             "golden_answers": [f"City {10 + i}"], "data_source": s} for i, s in enumerate(sources)]


@pytest.fixture()
def fake_hub(monkeypatch) -> list[tuple]:
    """A ``datasets`` module whose load_dataset serves Search-R1-like rows by split (no network here); the calls."""
    import sys
    import types

    calls: list[tuple] = []

    def load_dataset(target, config=None, split="train"):
        calls.append((target, config, split))
        if target != "PeterJinGo/nq_hotpotqa_train":
            raise FileNotFoundError(f"Dataset '{target}' doesn't exist on the Hub or cannot be accessed.")
        return _r1_rows(split)

    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset  # type: ignore[attr-defined]
    module.load_from_disk = None  # type: ignore[attr-defined]
    module.DatasetDict = dict  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "datasets", module)
    return calls


def test_a_dataset_id_is_read_by_split_with_each_benchmark_named(fake_hub, tmp_path):
    retriever = write_corpus(tmp_path / "corpus.jsonl", [("Landmark 10", "Landmark 10 is in City 10.")])
    task = SearchTask({"train_path": "PeterJinGo/nq_hotpotqa_train", "test_path": "PeterJinGo/nq_hotpotqa_train",
                       "corpus_path": str(retriever), "index_dir": str(tmp_path / "idx")})
    assert fake_hub == [("PeterJinGo/nq_hotpotqa_train", None, "train"), ("PeterJinGo/nq_hotpotqa_train", None, "test")]
    assert sorted(p.id for p in task.problems("train")) == ["train_0", "train_1"]
    test = task.problems("test")
    assert [p.id for p in test] == [f"test_{i}" for i in range(6)] and test[0].answer == "City 10"
    # Dr. MAS's test_sampled: the first n of each benchmark, in file order, before limit_test
    sampled = SearchTask({"train_path": "PeterJinGo/nq_hotpotqa_train", "test_path": "PeterJinGo/nq_hotpotqa_train",
                          "corpus_path": str(retriever), "index_dir": str(tmp_path / "idx"), "test_per_source": 2})
    assert [p.id for p in sampled.problems("test")] == ["test_0", "test_1", "test_3", "test_4", "test_5"]


def test_test_per_source_needs_rows_that_name_their_benchmark(hotpot_files, tmp_path):
    train, test = hotpot_files
    with pytest.raises(ValueError, match="test_per_source needs test rows that name their benchmark"):
        SearchTask({"train_path": train, "test_path": test, "test_per_source": 1, "index_dir": str(tmp_path)})
    with pytest.raises(ValueError, match="test_per_source -1 must be >= 0"):
        SearchConfig(test_per_source=-1)


def test_dataset_id_errors_are_one_line(fake_hub, monkeypatch, tmp_path):
    import sys

    with pytest.raises(ConnectionError, match=r"could not load dataset 'someone/missing' \(split 'train'\): "
                                              r"FileNotFoundError: Dataset 'someone/missing' doesn't exist") as err:
        SearchTask({"train_path": "someone/missing", "index_dir": str(tmp_path)})
    assert "\n" not in str(err.value)
    monkeypatch.setitem(sys.modules, "datasets", None)  # the hf-datasets extra not installed
    with pytest.raises(ImportError, match=r"needs the optional datasets package: pip install 'teamrl\[hf-datasets\]'"):
        SearchTask({"train_path": "PeterJinGo/nq_hotpotqa_train", "index_dir": str(tmp_path)})
    with pytest.raises(FileNotFoundError, match="does not exist"):  # a path, not an id: no dataset look-up
        SearchTask({"train_path": "data/nq_hotpotqa_train/train.parquet", "index_dir": str(tmp_path)})
