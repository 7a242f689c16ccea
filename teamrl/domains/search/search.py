"""Open-domain question answering with a search engine ("search").

Questions come from QA files or from Hugging Face datasets, named by id (e.g. Search-R1's
``PeterJinGo/nq_hotpotqa_train``, read through the ``datasets`` package: ``pip install
'teamrl[hf-datasets]'``; a missing package or network stops the build with one line); see
:mod:`teamrl.domains.search.qa` for the row formats, detected automatically. A reply's answer is the text inside its single ``<answer>...</answer>``, scored
against every gold answer with ``metric`` (``em``, ``f1`` or ``substring_em``, normalised as in
SQuAD; see :mod:`teamrl.domains.search.metrics`). A reply without a well-formed answer scores 0.

Workflows search through :meth:`SearchTask.retrieve`. Where the documents come from:

* ``retriever_url`` set: a Search-R1-protocol service (``teamrl serve-retriever``), over HTTP
  with a timeout and bounded retries;
* else ``corpus_path`` set: a BM25 index of that wiki-18 JSONL corpus, in this process (built
  once, cached by content hash under ``index_dir``);
* else: a corpus made from the paragraphs that come with the data files (HotpotQA distractor,
  MuSiQue), written once under ``index_dir`` and indexed in this process. When some of the files
  have no paragraphs (NQ test questions beside a HotpotQA train file), their questions search the
  other files' paragraphs; a warning names the corpus and the files it was made from.

Evaluation's pass@k counts exact matches (:meth:`SearchTask.passed`), whatever ``metric`` the
reward uses; its keys read ``pass@k (EM)``.

Files, and the service's answer to one query, are checked when the task is built; an in-process
index is built on the first search.

Left out: dense retrieval in-process (use a dense service's URL) and partial credit beyond F1.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from teamrl.domains.search.client import AsyncRetrieval, HttpRetriever
from teamrl.domains.search.corpus import corpus_docs, write_corpus
from teamrl.domains.search.index import Doc, Hit, Retriever, default_index_dir, file_sha256, load_index
from teamrl.domains.search.metrics import METRICS
from teamrl.domains.search.qa import FORMATS, QAItem, load_qa, qa_items
from teamrl.domains.search.tags import extract_tag
from teamrl.tasks.base import Problem, check_split, config_from, register_task
from teamrl.tasks.rows import is_dataset_source, load_rows

__all__ = ["SearchConfig", "SearchTask", "per_source"]

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class SearchConfig:
    """Where the questions and the documents come from, and how answers are scored."""

    train_path: str | list[str] | None = None
    """Train questions: a QA file (.jsonl/.json/.csv/.parquet), a dataset folder or a Hugging Face dataset id (read through the datasets package: pip install 'teamrl[hf-datasets]'), or a list of them, e.g. ../shared/data/hotpotqa_distractor_rpt/train.jsonl or PeterJinGo/nq_hotpotqa_train."""
    test_path: str | list[str] | None = None
    """Held-out questions, in the same forms as train_path."""
    train_split: str = "train"
    """Split read where train_path is a dataset folder or id."""
    test_split: str = "test"
    """Split read where test_path is a dataset folder or id."""
    test_per_source: int = 0
    """Keep the first this many test questions of each benchmark (the rows' data_source: Search-R1's test set holds seven), as Dr. MAS's test_sampled does with 30; 0 = all. Applied before limit_test."""
    format: str = "auto"
    """QA file format: auto (detected from the first row) or one of hotpot, musique, flashrag, bamboogle, nq, r1searcher, hotpot_simplified."""
    corpus_path: str | None = None
    """wiki-18 JSONL corpus ({"id", "contents": "\\"Title\\"\\ntext"}) searched in-process with BM25. null: a corpus is made from the data files' paragraphs (HotpotQA distractor, MuSiQue). Ignored when retriever_url is set."""
    retriever_url: str | None = None
    """URL of a Search-R1-protocol retrieval service (e.g. http://127.0.0.1:8000 from `teamrl serve-retriever`); null = search in-process."""
    index_dir: str | None = None
    """Folder for built BM25 indexes and corpora made from data files; null = $TEAMRL_CACHE/retriever."""
    topk: int = 3
    """Documents returned per search."""
    metric: Literal["em", "f1", "substring_em"] = "em"
    """Reward of a final answer against the gold answers (max over them): em = normalised exact match, f1 = token F1, substring_em = a gold answer occurs in the answer."""
    limit_train: int = 0
    """Use at most this many train questions after shuffling; 0 = all."""
    limit_test: int = 0
    """Use the first this many test questions; 0 = all."""
    seed: int = 0
    """Seed of the train question order (the test order is the file order)."""
    timeout_s: float = 30.0
    """Seconds to wait for the retrieval service per attempt."""
    retries: int = 3
    """Extra attempts when the service does not answer; the waits double from backoff_s."""
    backoff_s: float = 0.5
    """Wait before the first retry, in seconds."""

    def __post_init__(self) -> None:
        if self.topk < 1:
            raise ValueError(f"topk {self.topk} must be >= 1")
        if self.test_per_source < 0:
            raise ValueError(f"test_per_source {self.test_per_source} must be >= 0 (0 = all)")
        if self.limit_train < 0 or self.limit_test < 0:
            raise ValueError(f"limit_train {self.limit_train} and limit_test {self.limit_test} must be >= 0 (0 = all)")
        if self.timeout_s <= 0 or self.retries < 0 or self.backoff_s < 0:
            raise ValueError(f"timeout_s {self.timeout_s} must be > 0, retries {self.retries} and backoff_s "
                             f"{self.backoff_s} >= 0")


def _sources(value: str | list[str] | None) -> list[str]:
    return [os.path.expanduser(p) for p in ([value] if isinstance(value, str) else list(value or []))]


def _label(source: str, split: str) -> str:
    """A source's key in the task's bookkeeping: a file's resolved path, a dataset's id and split."""
    return str(Path(source).resolve()) if Path(source).is_file() else f"{source} ({split})"


def _load_split(sources: list[str], fmt: str, key: str, split: str, has_paragraphs: dict[str, bool]) -> list[QAItem]:
    """The questions of ``sources`` (files, dataset folders or ids); records in ``has_paragraphs`` whether each
    source brought paragraphs."""
    for src in sources:
        if not Path(src).is_file() and not is_dataset_source(src):
            raise FileNotFoundError(f"task.search.{key}: {src} does not exist (relative paths are relative to "
                                    f"{Path.cwd()}); fix the path")
    items: list[QAItem] = []
    for src in sources:
        if Path(src).is_file():
            loaded = load_qa(src, fmt)
        else:
            loaded = qa_items([row for _, row in load_rows(src, split=split)], fmt, f"task.search.{key} {src}")
        has_paragraphs[_label(src, split)] = any(it.paragraphs for it in loaded)
        if len(sources) > 1:  # ids are only unique within one file
            stem = Path(src).stem if Path(src).is_file() else src.replace("/", "_")
            loaded = [QAItem(f"{stem}:{it.id}", it.question, it.answers, it.paragraphs, it.source) for it in loaded]
        items += loaded
    return items


def per_source(items: list[QAItem], n: int) -> list[QAItem]:
    """The first ``n`` items of each benchmark (:attr:`QAItem.source`), in their order (Dr. MAS's test_sampled).

    >>> [it.id for it in per_source([QAItem(str(i), "q", ["a"], source=s) for i, s in enumerate("aabab")], 1)]
    ['0', '2']
    """
    if any(not it.source for it in items):
        raise ValueError("task.search.test_per_source needs test rows that name their benchmark (a data_source "
                         "field, as Search-R1's files have); set it to 0 for these files")
    seen: dict[str, int] = {}
    out = []
    for it in items:
        seen[it.source] = seen.get(it.source, 0) + 1
        if seen[it.source] <= n:
            out.append(it)
    return out


def _problem(item: QAItem) -> Problem:
    return Problem(id=item.id, question=item.question, answer=item.answers[0], meta={"answers": list(item.answers)})


def _smoke(cfg: Any) -> list[str]:
    """``--smoke``: generated questions in HotpotQA's distractor layout, BM25 in-process
    (:func:`teamrl.smoke_data.search_files`)."""
    from teamrl import smoke_data

    train, test = smoke_data.search_files()
    return [f"task.search.train_path={train}", f"task.search.test_path={test}",
            "task.search.retriever_url=null", "task.search.corpus_path=null", "task.search.limit_train=8",
            "task.search.limit_test=2", "task.search.test_per_source=0", "task.search.topk=1"]


@register_task("search", config=SearchConfig, smoke=_smoke)
class SearchTask:
    """Questions answered with search; ``await task.retrieve(queries)`` returns documents per query."""

    name: str = "search"
    answer_format: str = "Answer in a few words, or with yes or no, inside <answer> and </answer>."
    pass_label: str = "EM"
    """What pass@k counts here (evaluation keys read ``pass@k (EM)``): see :meth:`passed`."""

    def __init__(self, cfg: SearchConfig | dict[str, Any] | None = None) -> None:
        self.cfg: SearchConfig = config_from(SearchConfig, cfg)
        if self.cfg.format != "auto" and self.cfg.format not in FORMATS:
            raise ValueError(f"task.search.format {self.cfg.format!r} is unknown; use auto or one of "
                             f"{', '.join(FORMATS)}")
        self._has_paragraphs: dict[str, bool] = {}
        self._items = {split: _load_split(_sources(getattr(self.cfg, f"{split}_path")), self.cfg.format,
                                          f"{split}_path", getattr(self.cfg, f"{split}_split"), self._has_paragraphs)
                       for split in ("train", "test")}
        if self.cfg.test_per_source:
            self._items["test"] = per_source(self._items["test"], self.cfg.test_per_source)
        self._metric = METRICS[self.cfg.metric]
        self._index_dir = Path(self.cfg.index_dir) if self.cfg.index_dir else default_index_dir()
        self.corpus_path: Path | None = None
        """The corpus searched in-process (None when a service is used)."""
        self._retriever: Retriever | None = None
        self._lock = threading.Lock()
        if self.cfg.retriever_url:
            client = HttpRetriever(self.cfg.retriever_url, timeout_s=self.cfg.timeout_s,
                                   retries=self.cfg.retries, backoff_s=self.cfg.backoff_s)
            client.check()  # a wrong URL or a stopped service shows up now, not mid-rollout
            self._retriever = client
        elif self.cfg.corpus_path:
            self.corpus_path = Path(os.path.expanduser(self.cfg.corpus_path))
            if not self.corpus_path.is_file():
                raise FileNotFoundError(f"task.search.corpus_path: {self.corpus_path} does not exist; build it with "
                                        "`teamrl build-corpus --hotpot FILE... --out PATH` or fix the path")
        else:
            self.corpus_path = self._corpus_from_data()
        self._search = AsyncRetrieval(self.retrieve_hits, self.cfg.topk)
        self._problems = {split: self._order(split) for split in ("train", "test")}

    def _corpus_from_data(self) -> Path:
        """Write (once) the corpus of the data files' paragraphs; its name hashes the data files."""
        paths = sorted({_label(src, getattr(self.cfg, f"{split}_split")) for split in ("train", "test")
                        for src in _sources(getattr(self.cfg, f"{split}_path"))})
        docs = corpus_docs(self._items["train"] + self._items["test"])
        if not docs:
            raise ValueError("task.search has no documents to search: the data files have no paragraphs; set "
                             "task.search.retriever_url (a running `teamrl serve-retriever`) or "
                             "task.search.corpus_path")
        # a file counts by its content, a dataset by its id and split
        key = hashlib.sha256("".join(file_sha256(Path(p)) if Path(p).is_file() else p for p in paths)
                             .encode()).hexdigest()[:20]
        path = self._index_dir / f"corpus-{key}.jsonl"
        if not path.is_file():
            write_corpus(docs, path)
        bare = [p for p in paths if not self._has_paragraphs[p]]
        if bare:  # e.g. NQ test questions over a HotpotQA train file's paragraphs: a different corpus
            log.warning("task.search: %s %s no paragraphs, so %s questions search the corpus %s, made from the "
                        "paragraphs of %s; set task.search.corpus_path or retriever_url to search a corpus that "
                        "covers them", ", ".join(map(str, bare)), "has" if len(bare) == 1 else "have",
                        "its" if len(bare) == 1 else "their", path,
                        ", ".join(str(p) for p in paths if self._has_paragraphs[p]))
        return path

    def _order(self, split: str) -> list[Problem]:
        problems = [_problem(it) for it in self._items[split]]
        if split == "train":
            random.Random(self.cfg.seed).shuffle(problems)
        limit = self.cfg.limit_train if split == "train" else self.cfg.limit_test
        return problems[:limit] if limit else problems

    # ------------------------------------------------------------------ the Task protocol

    def problems(self, split: str) -> list[Problem]:
        """Questions of ``split``; ValueError when that split has no data path."""
        check_split(split)
        if not self._problems[split]:
            raise ValueError(f"the search task has no {split} questions; set task.search.{split}_path")
        return list(self._problems[split])

    def extract_answer(self, response: str) -> str | None:
        """The text of the reply's single ``<answer>...</answer>`` (see :func:`extract_tag`), or None."""
        return extract_tag(response, "answer").content

    def score(self, problem: Problem, response: str) -> float:
        """``metric`` of the reply's answer against the gold answers; 0.0 without an answer."""
        answer = self.extract_answer(response)
        golds = problem.meta.get("answers") or [problem.answer]
        return 0.0 if answer is None else float(self._metric(answer, golds))

    def passed(self, problem: Problem, response: str) -> bool:
        """Whether the reply's answer exactly matches a gold answer (normalised): what pass@k counts.

        Exact match whatever ``metric`` the reward uses: under F1 any shared word scores above 0,
        so "and" would pass for "Northwestern Catalan and Valencian".
        """
        answer = self.extract_answer(response)
        golds = problem.meta.get("answers") or [problem.answer]
        return answer is not None and METRICS["em"](answer, golds) == 1.0

    def all_scores(self, problem: Problem, response: str) -> dict[str, float]:
        """Every answer metric (em, f1, substring_em) of the reply; evaluation reports their means."""
        answer = self.extract_answer(response)
        golds = problem.meta.get("answers") or [problem.answer]
        return {name: 0.0 if answer is None else float(fn(answer, golds)) for name, fn in sorted(METRICS.items())}

    # ------------------------------------------------------------------ search

    @property
    def retriever(self) -> Retriever:
        """The HTTP client or the in-process index (built on first use, then shared)."""
        with self._lock:
            if self._retriever is None:  # no service: __init__ set the corpus to index
                corpus = self.corpus_path if self.corpus_path is not None else self._corpus_from_data()
                self._retriever = load_index(corpus, index_dir=self._index_dir)
            return self._retriever

    def retrieve_hits(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """Blocking search: the hits (documents with scores) of each query, best first."""
        return self.retriever.retrieve(queries, topk)

    async def retrieve(self, queries: list[str]) -> list[list[Doc]]:
        """The ``topk`` documents of each query, best first; searches run in a worker thread and
        the queries of concurrent episodes share one call."""
        hits = await self._search.search(queries)
        return [[h.doc for h in q] for q in hits]
