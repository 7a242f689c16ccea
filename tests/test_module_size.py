"""Modules stay readable in one sitting: at most 400 lines each (the house style's bound), in the package and in the
tests, benchmarks, scripts and examples beside it."""

from __future__ import annotations

from tests.conftest import REPO

LIMIT = 400
FOLDERS = ("teamrl", "tests", "benchmarks", "scripts", "examples")


def test_no_module_is_over_400_lines() -> None:
    lengths = {p.relative_to(REPO).as_posix(): len(p.read_text().splitlines())
               for folder in FOLDERS for p in (REPO / folder).rglob("*.py")}
    for folder in FOLDERS:  # each folder was found
        assert any(path.startswith(f"{folder}/") for path in lengths), folder
    over = {path: n for path, n in lengths.items() if n > LIMIT}
    assert over == {}, f"modules over {LIMIT} lines (split them along a real seam): {over}"
