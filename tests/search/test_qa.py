"""QA loaders: every shared benchmark file (row counts from its SOURCE.md) and the formats with
no file here (MuSiQue, Bamboogle, FlashRAG), on small rows written by the tests."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from teamrl.domains.search.qa import QAItem, detect_format, load_qa
from tests.conftest import shared_data

DATA = shared_data()
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"benchmark data folder {DATA} is absent")


def _source_rows(folder: str, file: str) -> int:
    text = (DATA / folder / "SOURCE.md").read_text(encoding="utf-8")
    match = re.search(rf"^\|\s*`{re.escape(file)}`\s*\|\s*(\d+)\s*\|", text, flags=re.MULTILINE)
    assert match, f"no row count for {file} in {folder}/SOURCE.md"
    return int(match.group(1))


@needs_data
@pytest.mark.parametrize("folder,file,fmt", [
    ("nq_open", "NQ-open.dev.jsonl", "nq"),
    ("hotpotqa", "hotpotqa_500.jsonl", "r1searcher"),
    ("hotpotqa", "hotpot_dev_v1_simplified.json", "hotpot_simplified"),
    ("hotpotqa_distractor_rpt", "train.jsonl", "hotpot"),
    ("hotpotqa_distractor_rpt", "dev.jsonl", "hotpot"),
    ("hotpotqa_distractor_rpt", "test.jsonl", "hotpot"),
    ("2wikimultihopqa", "2wiki_500.jsonl", "r1searcher"),
    ("r1searcher_train", "stage_1.jsonl", "r1searcher"),
    ("r1searcher_train", "stage_2.jsonl", "r1searcher"),
])
def test_every_shared_qa_file_loads(folder, file, fmt):
    path = DATA / folder / file
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    items = load_qa(path)
    assert len(items) == _source_rows(folder, file)
    assert detect_format(json.loads(path.read_text().split("\n", 1)[0]) if file.endswith(".jsonl")
                         else json.loads(path.read_text())[0]) == fmt
    assert len({it.id for it in items}) == len(items)
    assert all(it.question and it.answers and all(isinstance(a, str) and a for a in it.answers) for it in items)
    if fmt == "hotpot":  # up to 10 paragraphs (a few official dev questions have fewer)
        assert all(2 <= len(it.paragraphs) <= 10 for it in items)
        assert sum(len(it.paragraphs) == 10 for it in items) >= 0.99 * len(items)
    else:
        assert not any(it.paragraphs for it in items)


@needs_data
def test_nq_keeps_every_gold_answer():
    path = DATA / "nq_open" / "NQ-open.dev.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    first = load_qa(path)[0]
    assert first.question == "when was the last time anyone was on the moon"
    assert first.answers == ["14 December 1972 UTC", "December 1972"]


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_musique_rows(tmp_path):
    rows = [
        {"id": "2hop__1", "question": "Who founded the company that makes the iPhone?", "answer": "Steve Jobs",
         "answer_aliases": ["Jobs", "Steve Jobs"], "answerable": True,
         "paragraphs": [{"idx": 0, "title": "iPhone", "paragraph_text": "The iPhone is made by Apple.",
                         "is_supporting": True},
                        {"idx": 1, "title": "Apple Inc.", "paragraph_text": "Apple was founded by Steve Jobs.",
                         "is_supporting": True}],
         "question_decomposition": []},
        {"id": "2hop__2", "question": "Unanswerable?", "answer": "x", "answer_aliases": [], "answerable": False,
         "paragraphs": []},
    ]
    [item] = load_qa(_jsonl(tmp_path / "musique_ans_v1.0_dev.jsonl", rows))
    paragraphs = [("iPhone", "The iPhone is made by Apple."), ("Apple Inc.", "Apple was founded by Steve Jobs.")]
    assert item == QAItem("2hop__1", "Who founded the company that makes the iPhone?", ["Steve Jobs", "Jobs"],
                          paragraphs)


def test_bamboogle_as_published_and_flashrag_rows(tmp_path):
    csv_path = tmp_path / "bamboogle.csv"
    csv_path.write_text('Question,Answer\n"Who was president of the U.S. when superconductivity was discovered?",'
                        "William Howard Taft\n", encoding="utf-8")
    [b] = load_qa(csv_path)
    assert b.id == "0" and b.answers == ["William Howard Taft"] and b.question.startswith("Who was president")
    [j] = load_qa(_jsonl(tmp_path / "bamboogle.jsonl", [{"Question": "Q?", "Answer": "A"}]))
    assert (j.question, j.answers) == ("Q?", ["A"])
    [f] = load_qa(_jsonl(tmp_path / "test.jsonl", [{"id": "test_0", "question": "Q?",
                                                    "golden_answers": ["A", "a", "A"], "metadata": {}}]))
    assert f == QAItem("test_0", "Q?", ["A", "a"])


def test_original_hotpot_layout(tmp_path):
    row = {"_id": "5a8b", "question": "Q?", "answer": "yes", "type": "comparison",
           "context": [["Scott Derrickson", ["Scott is a director.", " He lives in LA."]], ["Ed Wood", ["Ed too."]]]}
    path = tmp_path / "hotpot_dev_distractor_v1.json"
    path.write_text(json.dumps([row]), encoding="utf-8")
    [item] = load_qa(path)
    assert item.id == "5a8b" and item.paragraphs == [("Scott Derrickson", "Scott is a director. He lives in LA."),
                                                     ("Ed Wood", "Ed too.")]


def test_format_errors(tmp_path):
    with pytest.raises(ValueError, match="no known QA format matches a row with keys \\['prompt'\\]"):
        load_qa(_jsonl(tmp_path / "a.jsonl", [{"prompt": "x"}]))
    with pytest.raises(ValueError, match="did you mean 'musique'"):
        load_qa(_jsonl(tmp_path / "b.jsonl", [{"question": "q", "answer": "a"}]), "musiqe")
    with pytest.raises(ValueError, match="row 2 does not fit format 'nq'"):
        load_qa(_jsonl(tmp_path / "c.jsonl", [{"question": "q", "answer": ["a"]}, {"question": "q2", "answer": []}]))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_qa(tmp_path / "missing.jsonl")
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(ValueError, match="unknown file type '.txt'"):
        load_qa(tmp_path / "d.txt")


def test_invalid_utf8_and_deep_nesting_name_the_file_and_line(tmp_path):
    row = b'{"question": "q", "answer": ["a"]}\n'
    jsonl = tmp_path / "qa.jsonl"
    jsonl.write_bytes(row + b'{"question": "\xff", "answer": ["a"]}\n')
    with pytest.raises(ValueError, match=rf"^{jsonl}:2: invalid UTF-8 \(byte 0xff\)"):
        load_qa(jsonl)
    as_json = tmp_path / "qa.json"
    as_json.write_bytes(b"[\n" + row.strip() + b",\n" + b'{"question": "\xc3(", "answer": ["a"]}]')
    with pytest.raises(ValueError, match=rf"^{as_json}:3: invalid UTF-8 \(byte 0xc3\)"):
        load_qa(as_json)
    deep = tmp_path / "deep.jsonl"
    deep.write_bytes(row + b"[" * 100_000 + b"]" * 100_000 + b"\n")
    with pytest.raises(ValueError, match=rf"^{deep}:2: lists and objects nested deeper than the JSON reader allows"):
        load_qa(deep)
def test_an_over_long_question_stops_the_load_naming_the_row(tmp_path):
    from teamrl.domains.search.qa import MAX_QUESTION_CHARS

    path = tmp_path / "nq.jsonl"
    rows = [{"question": "who?", "answer": ["a"]}, {"question": "w" * (MAX_QUESTION_CHARS + 1), "answer": ["b"]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with pytest.raises(ValueError, match=rf"nq.jsonl: row 2: the question has {MAX_QUESTION_CHARS + 1} characters"):
        load_qa(path)
    rows[1]["question"] = "w" * MAX_QUESTION_CHARS
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert len(load_qa(path)) == 2
