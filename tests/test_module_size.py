"""Modules stay readable in one sitting: at most 400 lines each (the house style's bound)."""

from __future__ import annotations

from tests.conftest import REPO

LIMIT = 400

OVER = {  # modules still over the bound, each at most its current length (may shrink, may not grow); split them
    "teamrl/engines/fast_decoder.py": 452,
    "teamrl/engines/hf.py": 441,
    "teamrl/algos/advantages.py": 431,
    "teamrl/train/trainer.py": 423,
    "teamrl/algos/losses.py": 421,
    "teamrl/team/team.py": 416,
    "teamrl/engines/decode_weights.py": 416,
}


def _lengths() -> dict[str, int]:
    return {p.relative_to(REPO).as_posix(): len(p.read_text().splitlines()) for p in (REPO / "teamrl").rglob("*.py")}


def test_no_module_is_over_400_lines() -> None:
    over = {path: n for path, n in _lengths().items() if n > LIMIT and n > OVER.get(path, 0)}
    assert over == {}, f"modules over {LIMIT} lines (split them along a real seam): {over}"


def test_the_list_of_modules_still_over_the_bound_only_shrinks() -> None:
    lengths = _lengths()
    stale = {path for path in OVER if lengths.get(path, 0) <= LIMIT}
    assert stale == set(), f"now within {LIMIT} lines, remove from OVER: {sorted(stale)}"
