"""The corpus builder: HotpotQA distractor paragraphs -> a deduplicated wiki-18 corpus."""

from __future__ import annotations

import json
import re

import pytest

from teamrl.cli import main
from teamrl.domains.search.corpus import build_corpus
from teamrl.domains.search.index import read_corpus
from tests.conftest import shared_data

DATA = shared_data() / "hotpotqa_distractor_rpt"


def _hotpot_row(qid: str, paragraphs: list[tuple[str, list[str]]]) -> dict:
    return {"id": qid, "question": f"question {qid}?", "answer": "a", "type": "bridge", "level": "hard",
            "supporting_facts": {"title": [], "sent_id": []},
            "context": {"title": [t for t, _ in paragraphs], "sentences": [s for _, s in paragraphs]}}


def test_build_corpus_dedups_by_title_and_paragraph(tmp_path):
    rows = [_hotpot_row("q1", [("Paris", ["Paris is big.", " It is in France."]), ("Rome", ["Rome is old."])]),
            _hotpot_row("q2", [("Paris", ["Paris is big.", " It is in France."]), ("Paris", ["Another Paris text."])])]
    src = tmp_path / "train.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out" / "corpus.jsonl"
    assert main(["build-corpus", "--hotpot", str(src), "--out", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines == [{"id": "0", "contents": '"Paris"\nParis is big. It is in France.'},
                     {"id": "1", "contents": '"Rome"\nRome is old.'},
                     {"id": "2", "contents": '"Paris"\nAnother Paris text.'}]


def test_files_without_paragraphs_are_refused(tmp_path, capsys):
    src = tmp_path / "nq.jsonl"
    src.write_text(json.dumps({"question": "q", "answer": ["a"]}) + "\n")
    with pytest.raises(ValueError, match="no context paragraphs"):
        build_corpus([src], tmp_path / "c.jsonl")
    assert main(["build-corpus", "--hotpot", str(src), "--out", str(tmp_path / "c.jsonl")]) == 2
    assert "no context paragraphs" in capsys.readouterr().err


@pytest.mark.skipif(not DATA.is_dir(), reason=f"HotpotQA distractor files {DATA} are absent")
def test_the_shared_distractor_files_give_the_documented_corpus(tmp_path):
    stated = re.search(r"hold ([\d,]+) unique \(title, paragraph\) pairs", (DATA / "SOURCE.md").read_text())
    n = build_corpus([DATA / f for f in ("train.jsonl", "dev.jsonl", "test.jsonl")], tmp_path / "corpus.jsonl")
    assert stated and n == int(stated.group(1).replace(",", ""))  # 10,787
    docs = read_corpus(tmp_path / "corpus.jsonl")
    assert len(docs) == n and [d.id for d in docs[:3]] == ["0", "1", "2"]
    assert docs[0].title == "Socialist Revolutionary Party"
