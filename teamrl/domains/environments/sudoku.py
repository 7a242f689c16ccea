"""AT-GRPO's Sudoku environment (arXiv 2510.11062): fill an n x n grid (4x4, 9x9) seeded from ``meta['seed']``,
the action a JSON grid after ``####``; see :mod:`teamrl.domains.environments.planning` for the family."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from teamrl.domains.environments.planning import parse_json_after
from teamrl.tasks.base import Problem
from teamrl.tasks.env import EnvConfig, Turn, few_turns_smoke, register_env

__all__ = ["Sudoku", "SudokuConfig", "sudoku_valid"]


@dataclass(kw_only=True)
class SudokuConfig(EnvConfig):
    size: int = 4
    """Grid side: 4 (2x2 boxes) or 9 (3x3 boxes)."""
    blanks: int = 2
    """Empty cells to fill."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.size not in (4, 9):
            raise ValueError(f"size {self.size} must be 4 or 9")
        if not 1 <= self.blanks <= self.size * self.size - 1:
            raise ValueError(f"blanks {self.blanks} must be between 1 and {self.size * self.size - 1}")


def sudoku_valid(grid: list[list[int]], box: int) -> bool:
    """Whether ``grid`` is a complete sudoku solution with ``box`` × ``box`` boxes.

    >>> sudoku_valid([[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 1]], 2)
    True
    >>> sudoku_valid([[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 1, 2]], 2)
    False
    """
    n, want = box * box, set(range(1, box * box + 1))
    rows = all(set(r) == want for r in grid)
    cols = all({grid[r][c] for r in range(n)} == want for c in range(n))
    boxes = all({grid[br + r][bc + c] for r in range(box) for c in range(box)} == want
                for br in range(0, n, box) for bc in range(0, n, box))
    return rows and cols and boxes


@register_env("sudoku", config=SudokuConfig, smoke=few_turns_smoke("sudoku"))
class Sudoku:
    """Fill the blanks of a sudoku (PettingLLMs' Sudoku, 4x4 first)."""

    def __init__(self, cfg: SudokuConfig) -> None:
        self.cfg, self.max_turns = cfg, cfg.max_turns
        self.box = 2 if cfg.size == 4 else 3
        self.action_format = (f"End with #### and a JSON list of fill steps [row, column, digit] (row and column "
                              f"from 0 to {cfg.size - 1}), e.g. #### [[0, 2, 3]] writes 3 in row 0, column 2; or "
                              f"the full grid as a JSON list of {cfg.size} rows of {cfg.size} digits.")
        self.given: list[list[int]] = []
        self.grid: list[list[int]] = []

    def reset(self, problem: Problem) -> str:
        rng, n, b = random.Random(problem.meta["seed"]), self.cfg.size, self.box
        base = [[(b * (r % b) + r // b + c) % n + 1 for c in range(n)] for r in range(n)]  # a valid pattern
        digits = rng.sample(range(1, n + 1), n)
        rows = [g * b + r for g in rng.sample(range(b), b) for r in rng.sample(range(b), b)]
        cols = [g * b + c for g in rng.sample(range(b), b) for c in rng.sample(range(b), b)]
        full = [[digits[base[r][c] - 1] for c in cols] for r in rows]
        holes = set(rng.sample(range(n * n), self.cfg.blanks))
        self.given = [[0 if r * n + c in holes else full[r][c] for c in range(n)] for r in range(n)]
        self.grid = [row[:] for row in self.given]
        return self.render()

    def render(self) -> str:
        rows = "\n".join(" ".join(str(v) for v in row) for row in self.grid)
        return (f"Fill the 0s of this {self.cfg.size}x{self.cfg.size} sudoku so that every row, column and "
                f"{self.box}x{self.box} box holds each digit 1-{self.cfg.size} once:\n{rows}")

    def parse_action(self, text: str) -> list[list[int]] | None:
        """The full grid (``size`` rows of ``size`` integers) or fill steps (lists of 3 integers), else None.

        >>> env = Sudoku(SudokuConfig(size=4))
        >>> env.parse_action("#### [[0, 2, 3], [1, 1, 4]]"), env.parse_action("#### [[0, 2]]")
        ([[0, 2, 3], [1, 1, 4]], None)
        """
        value = parse_json_after(text)
        n = self.cfg.size
        if not isinstance(value, list) or not value:
            return None
        if not all(isinstance(r, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in r) for r in value):
            return None
        grid = len(value) == n and all(len(r) == n for r in value)
        steps = all(len(r) == 3 for r in value)
        return value if grid or steps else None

    def _place(self, steps: list[list[int]]) -> str | None:
        """Apply fill steps in order; the reason the first invalid one is refused (those before it stay), or None."""
        n, b = self.cfg.size, self.box
        for r, c, v in steps:
            if not (0 <= r < n and 0 <= c < n and 1 <= v <= n):
                return f"fill step {[r, c, v]} is off the grid or not a digit 1-{n}"
            if self.grid[r][c]:
                return f"fill step {[r, c, v]}: row {r}, column {c} is already filled"
            box = [self.grid[br][bc] for br in range(r - r % b, r - r % b + b) for bc in range(c - c % b, c - c % b + b)]
            if v in self.grid[r] or any(self.grid[rr][c] == v for rr in range(n)) or v in box:
                return f"fill step {[r, c, v]}: {v} is already in that row, column or box"
            self.grid[r][c] = v
        return None

    def step(self, action: Any | None) -> Turn:
        n = self.cfg.size
        is_grid = action is not None and len(action) == n and all(len(r) == n for r in action)
        if not action or not (is_grid or all(len(r) == 3 for r in action)):
            return Turn(self.render(), -1.0, False, {"message": "no grid or fill steps found", "invalid": True})
        if not is_grid:
            refused = self._place(action)
            if refused is not None:
                return Turn(self.render(), -1.0, False, {"message": refused, "invalid": True})
        elif any(self.given[r][c] and action[r][c] != self.given[r][c] for r in range(n) for c in range(n)):
            return Turn(self.render(), -1.0, False, {"message": "the grid changes a given digit", "invalid": True})
        else:
            self.grid = [list(r) for r in action]
        if self.success:
            return Turn(self.render(), 1.0, True, {"message": "solved"})
        return Turn(self.render(), 0.0, False, {"message": "not a valid solution yet"})

    @property
    def success(self) -> bool:
        return sudoku_valid(self.grid, self.box)
