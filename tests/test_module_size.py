"""Modules stay readable in one sitting: at most 400 lines each (the house style's bound)."""

from __future__ import annotations

from tests.conftest import REPO

LIMIT = 400


def test_no_module_is_over_400_lines() -> None:
    lengths = {p.relative_to(REPO).as_posix(): len(p.read_text().splitlines()) for p in (REPO / "teamrl").rglob("*.py")}
    assert len(lengths) > 100  # the package was found
    over = {path: n for path, n in lengths.items() if n > LIMIT}
    assert over == {}, f"modules over {LIMIT} lines (split them along a real seam): {over}"
