"""The results pages' tables are the data file's (docs/results/results.jsonl), and scripts/results_tables.py
turns RESULT lines into rows, replaces a figure by its newer measurement and rewrites a page between its markers."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("results_tables", REPO / "scripts" / "results_tables.py")
rt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rt)


def test_the_results_pages_show_the_data_files_figures() -> None:
    rows = rt.load()
    assert {"speed", "quickstart", "stability"} <= set(rt.pages(rows))
    assert rt.stale_pages(rows) == [], "run python scripts/results_tables.py"
    for row in rows:
        assert row["machine"] and row["commit"] and row["command"], row


def test_each_page_has_one_figure_per_machine_setting_and_key() -> None:
    rows = rt.load()
    idents = [(r["page"], r["machine"], r["setting"], r["name"], r["key"]) for r in rows]
    assert len(idents) == len(set(idents))


def test_add_turns_result_lines_into_rows_and_replaces_older_figures(tmp_path, capsys) -> None:
    page = tmp_path / "speed.md"
    page.write_text("# Speed\n\n<!-- results:begin -->\nold\n<!-- results:end -->\n\nmore text\n")
    data = tmp_path / "results.jsonl"
    data.write_text("")
    out = tmp_path / "out.txt"
    out.write_text("warming up\nRESULT name=rollout b32_ratio=1.90 b32_engine_tps=300 (3 reps)\n"
                   "RESULT name=update_packing config=search ratio=2.10\n")
    common = ["--page", "speed", "--machine", "Zen 4", "--setting", "bf16", "--commit", "abc1234"]
    assert rt.main(["--data", str(data), "add", str(out), *common, "--command", "python benchmarks/x.py"]) == 0
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    assert [(r["name"], r["setting"], r["key"], r["value"]) for r in rows] == [
        ("rollout", "bf16", "b32_ratio", "1.90"), ("rollout", "bf16", "b32_engine_tps", "300"),
        ("update_packing", "bf16, config=search", "ratio", "2.10")]
    out.write_text("RESULT name=rollout b32_ratio=2.05\n")  # a newer measurement of one figure
    common[-1] = "def5678"
    assert rt.main(["--data", str(data), "add", str(out), *common, "--command", "python benchmarks/x.py"]) == 0
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    assert [(r["key"], r["value"], r["commit"]) for r in rows if r["name"] == "rollout"] == [
        ("b32_ratio", "2.05", "def5678"), ("b32_engine_tps", "300", "abc1234")]
    text = page.read_text()
    assert "old" not in text and text.endswith("<!-- results:end -->\n\nmore text\n")
    assert "| Zen 4 | bf16 | `rollout` | b32_ratio=2.05 | def5678 | `python benchmarks/x.py` |" in text
    assert "| 〃 | bf16 | `rollout` | b32_engine_tps=300 | abc1234 |" in text
    assert rt.main(["--data", str(data), "--check"]) == 0
    page.write_text(text.replace("2.05", "2.5"))
    assert rt.main(["--data", str(data), "--check"]) == 1
    assert "speed.md: its table is not results.jsonl's" in capsys.readouterr().err


def test_a_page_without_its_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="needs one <!-- results:begin --> line"):
        rt.render("# no markers\n", [], "speed")
