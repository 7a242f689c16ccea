"""A retrieval corpus from the paragraphs that come with QA files (HotpotQA distractor, MuSiQue).

Every (title, paragraph) pair of every question is one passage, kept once however many
questions share it, in first-seen order, and written in the wiki-18 JSONL layout::

    {"id": "0", "contents": "\\"Title\\"\\nparagraph text"}

The three HotpotQA distractor files in ``hotpotqa_distractor_rpt/`` give 10,787 passages, with
every question's gold paragraphs among them: a small, self-contained open-domain setting.
``teamrl build-corpus --hotpot FILE... --out corpus.jsonl`` runs :func:`build_corpus`.

Left out: splitting long paragraphs into 100-word passages (wiki-18 does; these are short).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from teamrl.domains.search.index import Doc
from teamrl.domains.search.qa import QAItem, load_qa

__all__ = ["build_corpus", "corpus_docs", "write_corpus"]


def corpus_docs(items: Iterable[QAItem]) -> list[Doc]:
    """Deduplicated passages of ``items``, ids "0", "1", ... in first-seen order.

    >>> a = QAItem("q1", "?", ["x"], [("Paris", "Paris is in France."), ("Rome", "Rome is in Italy.")])
    >>> b = QAItem("q2", "?", ["y"], [("Paris", "Paris is in France.")])
    >>> [d.contents for d in corpus_docs([a, b])]
    ['"Paris"\\nParis is in France.', '"Rome"\\nRome is in Italy.']
    """
    seen: dict[tuple[str, str], None] = {}
    for item in items:
        for title, text in item.paragraphs:
            if text:
                seen.setdefault((title, text))
    return [Doc(str(i), f'"{title}"\n{text}') for i, (title, text) in enumerate(seen)]


def write_corpus(docs: list[Doc], out: str | os.PathLike) -> None:
    """Write ``docs`` as JSONL (under a temporary name, then renamed)."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as handle:
        for doc in docs:
            handle.write(json.dumps(doc.to_json(), ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def build_corpus(files: Iterable[str | os.PathLike], out: str | os.PathLike) -> int:
    """Build a wiki-18-format corpus from QA files with paragraphs; returns the passage count."""
    files = list(files)
    if not files:
        raise ValueError("build-corpus needs at least one QA file with paragraphs (--hotpot FILE)")
    items: list[QAItem] = []
    for f in files:
        loaded = load_qa(f)
        if not any(it.paragraphs for it in loaded):
            raise ValueError(f"{f} has no context paragraphs; use HotpotQA distractor files (e.g. "
                             "hotpotqa_distractor_rpt/train.jsonl) or MuSiQue files")
        items += loaded
    docs = corpus_docs(items)
    write_corpus(docs, out)
    return len(docs)
