"""The BM25 index: ranking, determinism, the content-hash cache, corpus reading errors."""

from __future__ import annotations

import json

import pytest

import teamrl.domains.search.index as index_mod
from teamrl.domains.search.index import Bm25Index, Doc, default_index_dir, load_index, read_corpus
from tests.search.helpers import PASSAGES, write_corpus


def test_best_document_first_and_topk_is_capped(tmp_path):
    index = load_index(write_corpus(tmp_path / "c.jsonl"), index_dir=tmp_path / "ix")
    [paris, everest] = index.retrieve(["What is the capital of France?", "highest mountain Himalayas"], 3)
    assert paris[0].doc.title == "Paris" and everest[0].doc.title == "Mount Everest"
    assert all(a.score >= b.score for a, b in zip(paris, paris[1:]))
    assert len(index.retrieve(["river"], 50)[0]) == len(PASSAGES)
    with pytest.raises(ValueError, match="topk 0 must be >= 1"):
        index.retrieve(["river"], 0)


def test_ties_are_broken_by_corpus_order():
    docs = [Doc(str(i), f'"Twin {i}"\nidentical words here') for i in range(5)]
    index = Bm25Index.build(docs)
    assert [h.doc.id for h in index.retrieve(["identical words"], 3)[0]] == ["0", "1", "2"]
    # a query with no known word scores every document 0: the first ones come back, in order
    assert [(h.doc.id, h.score) for h in index.retrieve(["qwxz"], 2)[0]] == [("0", 0.0), ("1", 0.0)]


def test_index_is_built_once_and_keyed_by_content(tmp_path, monkeypatch):
    corpus = write_corpus(tmp_path / "c.jsonl")
    first = load_index(corpus, index_dir=tmp_path / "ix")
    [built] = list((tmp_path / "ix").iterdir())
    assert built.name.startswith("bm25-") and first.corpus_sha256 and built.name[5:25] == first.corpus_sha256[:20]

    def no_build(docs):
        raise AssertionError("the cached index should have been loaded")

    monkeypatch.setattr(Bm25Index, "build", staticmethod(no_build))
    again = load_index(corpus, index_dir=tmp_path / "ix")
    assert again.retrieve(["Danube"], 2) == first.retrieve(["Danube"], 2)
    monkeypatch.undo()
    write_corpus(corpus, PASSAGES[:5])  # same path, new content: a new index
    changed = load_index(corpus, index_dir=tmp_path / "ix")
    assert len(changed) == 5 and len(list((tmp_path / "ix").iterdir())) == 2


def test_default_index_dir_follows_teamrl_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TEAMRL_CACHE", str(tmp_path))
    assert default_index_dir() == tmp_path / "retriever"


def test_read_corpus_accepts_title_text_rows_and_reports_bad_lines(tmp_path):
    path = tmp_path / "c.jsonl"
    rows = [json.dumps({"title": "T", "text": "body"}), "", json.dumps({"id": "x", "contents": '"U"\nu'})]
    path.write_text("\n".join(rows) + "\n")
    assert read_corpus(path) == [Doc("0", '"T"\nbody'), Doc("x", '"U"\nu')]
    path.write_text('{"id": "1", "contents": "ok"}\n{oops\n')
    with pytest.raises(ValueError, match=r"c.jsonl:2: invalid JSON"):
        read_corpus(path)
    path.write_text(json.dumps({"id": "1", "body": "no contents"}) + "\n")
    with pytest.raises(ValueError, match="no 'contents'"):
        read_corpus(path)
    with pytest.raises(FileNotFoundError, match="teamrl build-corpus"):
        read_corpus(tmp_path / "missing.jsonl")
    path.write_text("\n")
    with pytest.raises(ValueError, match="has no documents"):
        read_corpus(path)


def test_doc_title_and_text():
    doc = Doc("1", '"Kiss and Tell (1945 film)"\nKiss and Tell is a 1945 comedy.\nSecond line.')
    assert doc.title == "Kiss and Tell (1945 film)" and doc.text == "Kiss and Tell is a 1945 comedy.\nSecond line."
    assert Doc("2", "no title line").text == "" and Doc("2", "no title line").title == "no title line"
    assert index_mod.Hit(doc, 1.0).doc is doc


@pytest.mark.parametrize("user_value,expected", [(None, "cpu"), ("cuda", "cuda"), ("", "")])
def test_importing_the_index_keeps_jax_on_the_cpu_unless_the_user_chose(user_value, expected):
    # bm25s imports JAX when installed; JAX_PLATFORMS must be set before that, and a user's choice stays
    import os
    import subprocess
    import sys

    from tests.search.helpers import REPO

    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    if user_value is not None:
        env["JAX_PLATFORMS"] = user_value
    code = ("import os, sys; import teamrl.domains.search.index as ix; assert 'bm25s' not in sys.modules; "
            "print(repr(os.environ.get('JAX_PLATFORMS'))); ix._bm25s(); print(repr(os.environ.get('JAX_PLATFORMS')))")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [repr(expected)] * 2
