"""Loaders for open-domain QA sets: question, list of gold answers and (where given) paragraphs.

Each format is registered with :func:`register_format` as a detector (does a row look like this
format?) and a converter (row -> :class:`QAItem`); :func:`load_qa` reads ``.jsonl``, ``.json``
(a list, or JSON lines under a .json name), ``.csv`` and ``.parquet`` (needs ``pyarrow``) files and
detects the format from the first row unless one is named. Built in, in detection order:

==================  =======================================================================
``hotpot``          HotpotQA with context: Hugging Face layout (``context.title`` /
                    ``context.sentences``) or the original one (``context: [[title, [sents]]]``,
                    also 2WikiMultihopQA's originals)
``musique``         MuSiQue: ``paragraphs[{title, paragraph_text}]``, ``answer``, ``answer_aliases``;
                    rows with ``answerable: false`` are skipped
``flashrag``        FlashRAG / Search-R1 rows: ``question``, ``golden_answers`` (Bamboogle, NQ, ... there)
``bamboogle``       Bamboogle as published: ``Question``, ``Answer``
``nq``              NQ-open: ``question``, ``answer`` as a list
``r1searcher``      R1-Searcher files: ``idx``, ``question``, ``answer`` (hotpotqa_500, 2wiki_500, stages)
``hotpot_simplified``  ReAct's HotpotQA dev: ``question``, ``answer``, ``type``, no id
==================  =======================================================================

Rows that name their benchmark in ``data_source`` (Search-R1's and Dr. MAS's files) keep it as
:attr:`QAItem.source`. Hugging Face dataset ids are read by the search task (``task.search.train_path``,
through :func:`teamrl.tasks.rows.load_rows`) and converted here by :func:`qa_items`.

Left out: answer normalisation (see :mod:`teamrl.domains.search.metrics`).
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from teamrl.suggest import did_you_mean

__all__ = ["FORMATS", "QAItem", "detect_format", "load_qa", "qa_items", "read_rows", "register_format"]


@dataclass(frozen=True)
class QAItem:
    """One question with every acceptable answer."""

    id: str
    question: str
    answers: list[str]
    """Gold answers; a reply matching any of them is correct."""
    paragraphs: list[tuple[str, str]] = field(default_factory=list)
    """(title, paragraph) pairs given with the question (distractor settings), else empty."""
    source: str = ""
    """The row's ``data_source`` (the benchmark it comes from, in Search-R1's and Dr. MAS's files), else empty."""


@dataclass(frozen=True)
class QAFormat:
    name: str
    detect: Callable[[dict[str, Any]], bool]
    convert: Callable[[dict[str, Any], int], QAItem | None]
    """Row and its 0-based index -> item, or None to skip the row (e.g. unanswerable)."""


FORMATS: dict[str, QAFormat] = {}
"""Registered formats, in detection order."""


def register_format(name: str, *, detect: Callable[[dict[str, Any]], bool]) -> Callable:
    """Register the decorated ``convert(row, index) -> QAItem | None`` as format ``name``."""

    def deco(convert: Callable[[dict[str, Any], int], QAItem | None]) -> Callable:
        if name in FORMATS:
            raise ValueError(f"QA format {name!r} is already registered")
        FORMATS[name] = QAFormat(name, detect, convert)
        return convert

    return deco


# --------------------------------------------------------------------------- helpers


def _text(value: Any, what: str) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} is {value!r}, expected non-empty text")
    return value.strip()


def _answers(value: Any, what: str = "answer") -> list[str]:
    items = value if isinstance(value, (list, tuple)) else [value]
    out = [_text(v, what) for v in items if v is not None and str(v).strip()]
    if not out:
        raise ValueError(f"{what} is {value!r}, expected an answer or a list of answers")
    return list(dict.fromkeys(out))


def _row_id(row: dict[str, Any], index: int) -> str:
    for key in ("id", "_id", "idx", "qid"):
        if row.get(key) not in (None, ""):
            return str(row[key])
    return str(index)


def _has(row: dict[str, Any], *keys: str) -> bool:
    return all(k in row for k in keys)


# --------------------------------------------------------------------------- formats


def _hotpot_paragraphs(context: Any) -> list[tuple[str, str]]:
    if isinstance(context, dict):  # Hugging Face layout
        pairs: Iterable[tuple[Any, Any]] = zip(context.get("title", []), context.get("sentences", []))
    else:  # original layout: [[title, [sentences]], ...]
        pairs = ((c[0], c[1]) for c in context)
    return [(str(t).strip(), "".join(s).strip()) for t, s in pairs]


@register_format("hotpot", detect=lambda r: _has(r, "question", "answer", "context")
                 and isinstance(r["context"], (dict, list)))
def _hotpot(row: dict[str, Any], index: int) -> QAItem:
    return QAItem(_row_id(row, index), _text(row["question"], "question"), _answers(row["answer"]),
                  _hotpot_paragraphs(row["context"]))


@register_format("musique", detect=lambda r: _has(r, "question", "answer", "paragraphs"))
def _musique(row: dict[str, Any], index: int) -> QAItem | None:
    if row.get("answerable") is False:
        return None
    paragraphs = [(str(p.get("title", "")).strip(), str(p.get("paragraph_text", "")).strip())
                  for p in row["paragraphs"]]
    answers = _answers([row["answer"], *(row.get("answer_aliases") or [])])
    return QAItem(_row_id(row, index), _text(row["question"], "question"), answers, paragraphs)


@register_format("flashrag", detect=lambda r: _has(r, "question", "golden_answers"))
def _flashrag(row: dict[str, Any], index: int) -> QAItem:
    return QAItem(_row_id(row, index), _text(row["question"], "question"),
                  _answers(row["golden_answers"], "golden_answers"))


@register_format("bamboogle", detect=lambda r: _has(r, "Question", "Answer"))
def _bamboogle(row: dict[str, Any], index: int) -> QAItem:
    return QAItem(_row_id(row, index), _text(row["Question"], "Question"), _answers(row["Answer"], "Answer"))


def _plain(row: dict[str, Any], index: int) -> QAItem:
    return QAItem(_row_id(row, index), _text(row["question"], "question"), _answers(row["answer"]))


register_format("nq", detect=lambda r: _has(r, "question", "answer") and isinstance(r["answer"], list))(_plain)
register_format("r1searcher", detect=lambda r: _has(r, "idx", "question", "answer"))(_plain)
register_format("hotpot_simplified", detect=lambda r: _has(r, "question", "answer", "type"))(_plain)


# --------------------------------------------------------------------------- reading


def _decode(raw: bytes, path: Path, line: int = 1) -> str:
    """``raw`` as UTF-8, or a ValueError naming the file and the line of the first invalid byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        at = line + raw.count(b"\n", 0, exc.start)
        raise ValueError(f"{path}:{at}: invalid UTF-8 (byte 0x{raw[exc.start]:02x}); save the file as UTF-8") from None


def _loads(text: str, path: Path, line: int = 1) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{path}:{line}: lists and objects nested deeper than the JSON reader allows") from None


def _read_json(path: Path) -> list[Any]:
    text = _decode(path.read_bytes(), path)
    try:
        data = _loads(text, path)
    except json.JSONDecodeError as exc:
        if exc.msg != "Extra data":
            raise ValueError(f"{path}: invalid JSON ({exc.msg} at line {exc.lineno})") from None
        return _read_jsonl(path)  # JSON lines under a .json name
    if isinstance(data, dict):
        data = next((v for v in data.values() if isinstance(v, list)), None)
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of question objects")
    return data


def _read_jsonl(path: Path) -> list[Any]:
    rows = []
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            line = _decode(raw, path, number)
            if line.strip():
                try:
                    rows.append(_loads(line, path, number))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{number}: invalid JSON ({exc.msg})") from None
    return rows


def _read_csv(path: Path) -> list[Any]:
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def _read_parquet(path: Path) -> list[Any]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from None
    return pq.read_table(path).to_pylist()


_READERS: dict[str, Callable[[Path], list[Any]]] = {
    ".jsonl": _read_jsonl, ".json": _read_json, ".csv": _read_csv, ".parquet": _read_parquet}


def read_rows(path: str | os.PathLike) -> list[Any]:
    """The raw rows of a QA file, chosen by its extension."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"QA data file {p} does not exist; check the path (relative paths are "
                                f"relative to {Path.cwd()})")
    reader = _READERS.get(p.suffix.lower())
    if reader is None:
        raise ValueError(f"{p}: unknown file type {p.suffix!r}; use one of {', '.join(_READERS)}")
    return reader(p)


def detect_format(row: Any, where: str = "row") -> str:
    """The first registered format whose detector accepts ``row``."""
    if isinstance(row, dict):
        for fmt in FORMATS.values():
            if fmt.detect(row):
                return fmt.name
    keys = sorted(row) if isinstance(row, dict) else type(row).__name__
    raise ValueError(f"{where}: no known QA format matches a row with keys {keys}; name one with "
                     f"format= (one of {', '.join(FORMATS)}) or register your own with register_format")


MAX_QUESTION_CHARS = 20_000
"""Longest question a QA row may have (the math task's default ``max_question_chars``); a longer row stops the
load with one line naming the file and row (prompts that long are refused by every model's context limit anyway)."""


def load_qa(path: str | os.PathLike, fmt: str = "auto") -> list[QAItem]:
    """Every question of a QA file; ValueError naming the file and row for a row that does not fit its
    format or whose question is over :data:`MAX_QUESTION_CHARS` characters.

    Args:
        path: A ``.jsonl``, ``.json``, ``.csv`` or ``.parquet`` file.
        fmt: A registered format name, or "auto" to detect it from the first row.
    """
    return qa_items(read_rows(path), fmt, str(path))


def qa_items(rows: list[Any], fmt: str = "auto", where: str = "rows") -> list[QAItem]:
    """The questions of raw ``rows`` (a file's, or a dataset's read by :func:`teamrl.tasks.rows.load_rows`), as
    :func:`load_qa` converts them; ``where`` names the source in errors.

    >>> [(it.question, it.answers, it.source) for it in qa_items(
    ...     [{"question": "q?", "golden_answers": ["a"], "data_source": "nq"}])]
    [('q?', ['a'], 'nq')]
    """
    if not rows:
        raise ValueError(f"{where}: no rows")
    if fmt == "auto":
        fmt = detect_format(rows[0], f"{where}: first row")
    if fmt not in FORMATS:
        raise ValueError(f"unknown QA format {fmt!r}{did_you_mean(fmt, FORMATS)} (known: auto, {', '.join(FORMATS)})")
    convert = FORMATS[fmt].convert
    items = []
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{where}: row {index + 1} is {type(row).__name__}, expected a JSON object")
        try:
            item = convert(row, index)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ValueError(f"{where}: row {index + 1} does not fit format {fmt!r}: {exc}") from None
        if item is not None and len(item.question) > MAX_QUESTION_CHARS:
            raise ValueError(f"{where}: row {index + 1}: the question has {len(item.question)} characters, over "
                             f"{MAX_QUESTION_CHARS}; remove the row or shorten it")
        if item is not None:
            source = row.get("data_source")
            items.append(replace(item, source=source) if isinstance(source, str) and source else item)
    return items
