"""Corpus documents and the BM25 index over them, built once and cached by content hash.

A corpus is a JSONL file in the wiki-18 layout that Search-R1 and FlashRAG index: one object per
line with ``id`` and ``contents``, where ``contents`` is ``"Title"`` on the first line and the
passage after it. Rows with ``title`` and ``text`` instead of ``contents`` are accepted too.

:class:`Bm25Index` tokenizes with ``bm25s`` (lower-case words, English stop words removed,
Snowball English stemming) and scores with Lucene's BM25 (k1=0.9, b=0.4, Pyserini's
defaults). :func:`load_index` keeps the built index under a directory named after the corpus
file's SHA-256 and the index settings, so a changed corpus is re-indexed and an unchanged one
loads in a moment. Ties in score are broken by corpus order, so results are deterministic.

``bm25s`` imports JAX when it is installed, and JAX then claims 75% of a GPU's memory for its CUDA
backend (or fails to start on a busy GPU). Importing this module therefore sets
``JAX_PLATFORMS=cpu`` unless the environment already sets it, before ``bm25s`` is imported
(only here, by :func:`_bm25s`); BM25 scoring never uses a GPU.

Left out: incremental updates, sharding, and corpora too large to hold in memory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

__all__ = ["Bm25Index", "Doc", "Hit", "Retriever", "file_sha256", "load_index", "read_corpus"]

log = logging.getLogger(__name__)


def keep_jax_on_cpu() -> None:
    """Set ``JAX_PLATFORMS=cpu`` unless the user set ``JAX_PLATFORMS``; must run before JAX is imported."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


keep_jax_on_cpu()  # at import: any later bm25s (and so JAX) import in this process sees it

_SETTINGS: dict[str, object] = {"k1": 0.9, "b": 0.4, "method": "lucene", "stopwords": "en", "stemmer": "english",
                                "layout": 1}
"""Everything that changes the index's content; part of the cache key."""


@dataclass(frozen=True, slots=True)
class Doc:
    """One corpus passage.

    >>> d = Doc("7", '"Paris"\\nParis is the capital of France.')
    >>> d.title, d.text
    ('Paris', 'Paris is the capital of France.')
    """

    id: str
    contents: str
    """``"Title"`` on the first line, the passage after it (wiki-18 layout)."""

    @property
    def title(self) -> str:
        return self.contents.split("\n", 1)[0].strip().strip('"')

    @property
    def text(self) -> str:
        parts = self.contents.split("\n", 1)
        return parts[1].strip() if len(parts) == 2 else ""

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "contents": self.contents}


class Hit(NamedTuple):
    """A retrieved document and its score."""

    doc: Doc
    score: float


class Retriever(Protocol):
    """Anything that answers queries with ranked documents (the index, the HTTP client)."""

    def retrieve(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """The best ``topk`` hits of each query, best first."""
        ...


def doc_from_row(row: object, where: str) -> Doc:
    """A :class:`Doc` from a corpus row (``id``+``contents``, or ``title``+``text``)."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object with 'id' and 'contents', got {type(row).__name__}")
    if isinstance(row.get("contents"), str):
        contents = row["contents"]
    elif isinstance(row.get("text"), str):
        contents = f'"{row.get("title", "")}"\n{row["text"]}'
    else:
        raise ValueError(f"{where}: the row has no 'contents' text (keys: {sorted(row)}); "
                         "write corpora as {\"id\": ..., \"contents\": \"\\\"Title\\\"\\ntext\"}")
    return Doc(str(row.get("id", "")), contents)


def read_corpus(path: str | os.PathLike) -> list[Doc]:
    """All documents of a JSONL corpus file; rows without an id get their line index."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"corpus {p} does not exist; build one with `teamrl build-corpus --hotpot FILE... "
                                "--out corpus.jsonl` or point to a wiki-18 JSONL file")
    docs: list[Doc] = []
    with p.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{p}:{number}: invalid JSON ({exc.msg}); each line must be one object") from None
            doc = doc_from_row(row, f"{p}:{number}")
            docs.append(doc if doc.id else Doc(str(len(docs)), doc.contents))
    if not docs:
        raise ValueError(f"corpus {p} has no documents")
    return docs


def file_sha256(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _bm25s() -> types.ModuleType:
    """``bm25s``, imported on first use (the only import of it), with JAX kept on the CPU and its chatty
    logger quietened."""
    keep_jax_on_cpu()
    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s


def _tokenize(texts: list[str]) -> list[list[str]]:
    import Stemmer  # a new stemmer per call: PyStemmer objects are not thread-safe

    return _bm25s().tokenize(texts, stopwords=_SETTINGS["stopwords"], stemmer=Stemmer.Stemmer(_SETTINGS["stemmer"]),
                          return_ids=False, show_progress=False)


class Bm25Index:
    """BM25 over a list of documents; ``retrieve`` is thread-safe (read-only numpy)."""

    def __init__(self, docs: list[Doc], bm25: Any) -> None:
        self.docs = docs
        self.bm25 = bm25
        self.corpus_sha256 = ""
        """Content hash of the corpus file the index was built from (empty when built in memory)."""

    @classmethod
    def build(cls, docs: list[Doc]) -> Bm25Index:
        """Tokenize and index ``docs`` (title and passage both count)."""
        if not docs:
            raise ValueError("cannot index an empty corpus")
        bm25 = _bm25s().BM25(k1=_SETTINGS["k1"], b=_SETTINGS["b"], method=_SETTINGS["method"])
        bm25.index(_tokenize([d.contents for d in docs]), show_progress=False)
        return cls(docs, bm25)

    def save(self, directory: Path) -> None:
        self.bm25.save(str(directory), show_progress=False)

    @classmethod
    def load(cls, directory: Path, docs: list[Doc]) -> Bm25Index:
        bm25 = _bm25s().BM25.load(str(directory), load_corpus=False, show_progress=False)
        if bm25.scores["num_docs"] != len(docs):
            raise ValueError(f"index {directory} holds {bm25.scores['num_docs']} documents but the corpus has "
                             f"{len(docs)}; delete {directory} to rebuild it")
        return cls(docs, bm25)

    def __len__(self) -> int:
        return len(self.docs)

    def _scores(self, tokens: list[str]) -> np.ndarray:
        ids = self.bm25.get_tokens_ids(tokens)
        if not ids:
            return np.zeros(len(self.docs), dtype=np.float32)
        return self.bm25.get_scores_from_ids(ids)

    def _top(self, scores: np.ndarray, k: int) -> list[Hit]:
        n = len(scores)
        kth = np.partition(scores, n - k)[n - k]
        cand = np.nonzero(scores >= kth)[0]  # ascending doc order; stable sort keeps it among ties
        best = cand[np.argsort(-scores[cand], kind="stable")[:k]]
        return [Hit(self.docs[i], float(scores[i])) for i in best]

    def retrieve(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """The ``topk`` best documents per query (fewer only when the corpus is smaller)."""
        if topk < 1:
            raise ValueError(f"topk {topk} must be >= 1")
        k = min(topk, len(self.docs))
        return [self._top(self._scores(tokens), k) for tokens in _tokenize(list(queries))]


def _index_key(corpus_sha256: str) -> str:
    settings = hashlib.sha256(json.dumps(_SETTINGS, sort_keys=True).encode()).hexdigest()
    return f"bm25-{corpus_sha256[:20]}-{settings[:8]}"


def default_index_dir() -> Path:
    """Where built indexes are kept: ``$TEAMRL_CACHE/retriever`` (default ``~/.cache/teamrl/retriever``).

    The rule of :func:`teamrl.models.cache_dir`, repeated so that the retrieval service does not
    import torch.
    """
    return Path(os.environ.get("TEAMRL_CACHE", Path.home() / ".cache" / "teamrl")) / "retriever"


def load_index(corpus_path: str | os.PathLike, *, index_dir: str | os.PathLike | None = None) -> Bm25Index:
    """The BM25 index of a corpus file, from the cache when its content was indexed before.

    Args:
        corpus_path: A wiki-18-format JSONL corpus.
        index_dir: Folder holding built indexes; None = :func:`default_index_dir`.
    """
    docs = read_corpus(corpus_path)
    sha = file_sha256(corpus_path)
    root = Path(index_dir) if index_dir is not None else default_index_dir()
    target = root / _index_key(sha)
    if (target / "params.index.json").is_file():
        index = Bm25Index.load(target, docs)
    else:
        log.info("indexing %d documents of %s (once; kept in %s)", len(docs), corpus_path, target)
        index = Bm25Index.build(docs)
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".{target.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        index.save(tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished the same index first
            shutil.rmtree(tmp, ignore_errors=True)
    index.corpus_sha256 = sha
    return index
