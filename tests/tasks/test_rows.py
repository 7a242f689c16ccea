"""Data files that are not what they claim: invalid UTF-8 and nesting past the limit are errors that name the
file and the line (JSONL: that row; JSON: the file), never a traceback from the decoder."""

from __future__ import annotations

import pytest

from teamrl.domains.math.math import MathConfig, MathTask
from teamrl.tasks.rows import MAX_DEPTH, BadLine, load_rows

GOOD = b'{"question": "1+1?", "answer": "2"}\n'


def test_invalid_utf8_in_a_jsonl_line_is_that_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(GOOD + b'{"question": "\xff\xfe?", "answer": "3"}\n' + GOOD)
    rows = list(load_rows(str(path)))
    assert [n for n, _ in rows] == [1, 2, 3] and isinstance(rows[1][1], BadLine)
    assert rows[1][1].reason.startswith("invalid UTF-8 (byte 0xff at byte 15 of the line)")
    with pytest.raises(ValueError, match=rf"^{path} line 2: invalid UTF-8 \(byte 0xff"):
        MathTask(MathConfig(train_path=str(path), test_path=str(path))).problems("train")


def test_invalid_utf8_in_a_json_file_names_the_line(tmp_path):
    path = tmp_path / "test.json"
    path.write_bytes(b'[\n{"question": "1+1?", "answer": "2"},\n{"question": "\xc3(", "answer": "3"}\n]\n')
    with pytest.raises(ValueError, match=rf"^{path} line 3: invalid UTF-8 \(byte 0xc3\)"):
        list(load_rows(str(path)))


def test_nesting_past_the_limit_is_a_bad_row_or_a_file_error(tmp_path):
    deep = b'{"question": "q", "answer": "1", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_bytes(GOOD + deep)
    rows = list(load_rows(str(jsonl)))
    assert isinstance(rows[1][1], BadLine) and f"nested deeper than {MAX_DEPTH} levels" in rows[1][1].reason
    as_json = tmp_path / "train.json"
    as_json.write_bytes(b"[" + deep + b"]")
    with pytest.raises(ValueError, match=rf"^{as_json}: nested deeper than {MAX_DEPTH} levels"):
        list(load_rows(str(as_json)))
    shallow = tmp_path / "ok.jsonl"
    shallow.write_bytes(b'{"question": "q", "answer": "1", "x": ' + b"[" * 50 + b"]" * 50 + b"}\n")
    assert list(load_rows(str(shallow)))[0][1]["question"] == "q"
