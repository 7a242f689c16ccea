"""Raw rows of a problem data source: a local ``.jsonl`` / ``.json`` (a list of objects) / ``.parquet`` file,
a local dataset folder or a Hugging Face dataset id (the last two through the optional ``datasets``
package, imported only when needed). :class:`~teamrl.domains.math.math.MathTask` maps them to problems;
:func:`check_sizes` refuses rows too large to train on."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from teamrl.tasks.grading import MAX_ANSWER_CHARS, parse_number

__all__ = ["LOCAL_SUFFIXES", "MAX_DEPTH", "BadLine", "check_sizes", "is_dataset_source", "json_depth", "load_rows"]

MAX_DEPTH = 100
"""Deepest nesting of lists and objects a JSON row may have (a problem row has 2 or 3 levels)."""

LOCAL_SUFFIXES: tuple[str, ...] = (".jsonl", ".json", ".parquet")
"""File suffixes read directly (anything else is a dataset folder or id)."""


class BadLine:
    """Placeholder for a line that is not valid JSON."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def check_sizes(question: str, answer: str, max_question_chars: int) -> None:
    """Raise ValueError for a row whose question or gold answer is too long, or whose gold number is too large.

    Args:
        question: The row's question text.
        answer: The row's gold answer text.
        max_question_chars: Longest question accepted (``task.math.max_question_chars``).
    """
    if len(question) > max_question_chars:
        raise ValueError(f"question has {len(question)} characters, over max_question_chars={max_question_chars}")
    if len(answer) > MAX_ANSWER_CHARS:
        raise ValueError(f"gold answer has {len(answer)} characters; answers are graded up to {MAX_ANSWER_CHARS}")
    parse_number(answer)  # ValueError for an exponent out of range


def _looks_like_path(source: str) -> bool:
    """Whether a missing ``source`` is meant as a local path rather than a dataset id."""
    return (
        source.lower().endswith(LOCAL_SUFFIXES)
        or source.startswith(("/", "./", "../", "~", "\\"))
        or source.count("/") > 1
        or (os.sep != "/" and os.sep in source)
    )


def is_dataset_source(source: str) -> bool:
    """Whether ``source`` names a dataset folder or a Hugging Face dataset id (read through the ``datasets``
    package) rather than a data file.

    >>> is_dataset_source("PeterJinGo/nq_hotpotqa_train"), is_dataset_source("data/nq/train.parquet")
    (True, False)
    """
    path = Path(source).expanduser()
    return not path.is_file() and (path.is_dir() or not _looks_like_path(source))


def json_depth(value: Any) -> int:
    """Nesting depth of lists and objects in ``value`` (0 for a scalar), without recursion.

    >>> json_depth(1), json_depth([]), json_depth({"a": [1, {"b": 2}]})
    (0, 1, 3)
    """
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def _loads(text: str | bytes) -> Any:
    """``json.loads`` that refuses nesting deeper than :data:`MAX_DEPTH` (ValueError naming the limit)."""
    try:
        value = json.loads(text)
    except RecursionError:
        value = None
        depth = MAX_DEPTH + 1
    else:
        depth = json_depth(value)
    if depth > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels of lists and objects (the limit for a data row)")
    return value


def _read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, object or BadLine) for each non-blank line of a JSONL file."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield number, BadLine(f"invalid UTF-8 (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the "
                                      f"line); save the file as UTF-8")
                continue
            if not line.strip():
                continue
            try:
                yield number, _loads(line)
            except json.JSONDecodeError as exc:
                yield number, BadLine(f"invalid JSON ({exc.msg} at column {exc.colno})")
            except ValueError as exc:
                yield number, BadLine(str(exc))


def _read_json(path: Path) -> Iterator[tuple[int, Any]]:
    """(1-based row number, object) for a JSON file holding a list of objects."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ValueError(f"{path} line {line}: invalid UTF-8 (byte 0x{raw[exc.start]:02x}); save the file as UTF-8") from None
    try:
        data = _loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":  # a JSONL file with a .json name
            yield from _read_jsonl(path)
            return
        raise ValueError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}); fix the file") from exc
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not isinstance(data, list):
        if isinstance(data, dict):
            shape = f"an object with keys {sorted(data)[:10]}"
        else:
            shape = type(data).__name__
        raise ValueError(  # noqa: TRY004 (bad data)
            f"{path} holds {shape}, expected a list of objects; store the rows as a JSON list or as JSONL"
        )
    yield from enumerate(data, start=1)


def _read_parquet(path: Path) -> Iterator[tuple[int, Any]]:
    """(1-based row number, object) for each row of a Parquet file."""
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ImportError(
            f"reading {path} needs the optional pyarrow package: pip install pyarrow (or convert the file to .jsonl)"
        ) from exc
    yield from enumerate(pq.read_table(path).to_pylist(), start=1)


def _read_datasets(source: str, split: str, hf_config: str | None) -> Iterator[tuple[int, Any]]:
    """(1-based row number, object) for a dataset folder or Hugging Face dataset id."""
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(
            f"loading {source!r} needs the optional datasets package: pip install 'teamrl[hf-datasets]' "
            "(or point the path at a local .jsonl/.json/.parquet file)"
        ) from exc
    folder = Path(source).expanduser()
    saved = ("dataset_dict.json", "state.json")  # written by save_to_disk
    if folder.is_dir() and any((folder / name).exists() for name in saved):
        loaded = datasets.load_from_disk(str(folder))
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise ValueError(
                    f"{source} has splits {sorted(loaded)}, not {split!r}; set train_split/test_split to one of them"
                )
            loaded = loaded[split]
    else:
        target = str(folder) if folder.is_dir() else source
        try:
            loaded = datasets.load_dataset(target, hf_config, split=split)
        except Exception as exc:  # no network, an unknown id or split: one line naming the source
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            raise ConnectionError(
                f"could not load dataset {source!r} (split {split!r}): {type(exc).__name__}: {first}; check the "
                "network and the id, or download it and point the path at the local files") from None
    yield from enumerate(loaded, start=1)


def load_rows(source: str, *, split: str = "train", hf_config: str | None = None) -> Iterator[tuple[int, Any]]:
    """Raw rows of a data source, each with its 1-based row number (line number for JSONL).

    Args:
        source: A .jsonl/.json/.parquet file, a local dataset folder, or a Hugging Face dataset id.
        split: Split to read from a dataset folder or id (ignored for single files).
        hf_config: Dataset config name for folders and ids.

    Returns:
        An iterator of (row number, row); a JSONL line that is not valid JSON comes as a
        placeholder that the task reports as a bad row.

    Raises:
        FileNotFoundError: when ``source`` looks like a local path and does not exist.
        ValueError: for an unsupported file type or a JSON file that is not a list.
    """
    path = Path(source).expanduser()
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            return _read_jsonl(path)
        if suffix == ".json":
            return _read_json(path)
        if suffix == ".parquet":
            return _read_parquet(path)
        raise ValueError(
            f"unsupported data file {path} (suffix {suffix!r}); use one of "
            f"{', '.join(LOCAL_SUFFIXES)}, a dataset folder, or a Hugging Face dataset id"
        )
    if not path.is_dir() and _looks_like_path(source):
        raise FileNotFoundError(f"data file not found: {source} (resolved to {path.resolve()}); check the path")
    return _read_datasets(source, split, hf_config)
