"""The table of every two-player TextArena game (docs/results/games.md, written by benchmarks/textarena_sweep.py)
holds: each game there plays (self-play) and evaluates against the random player, or is refused before training in
one line. The full sweep takes about 15 minutes on 2 CPU cores, so this re-runs a representative subset: the games
of each way the random player finds its moves (listed moves, an unquoted list of valid moves, a described move
whose number varies, board squares, a placeholder such as 'X' or '<number>', words) and every game the table
refuses, with the sweep's own settings and tiny random model (``pytest -m slow tests/team/test_games_sweep.py``)."""

from __future__ import annotations

import argparse
import importlib.util
import re

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow
pytest.importorskip("textarena")

REPRESENTATIVE = ("TicTacToe-v0", "KuhnPoker-v0", "Othello-v0", "ConnectFour-v0", "Nim-v0", "Breakthrough-v0",
                  "Briscola-v0", "IteratedTwoThirdsAverage-v0", "LiarsDice-v0", "SimpleNegotiation-v0")


def _bench():
    spec = importlib.util.spec_from_file_location("benchmarks_textarena_sweep", REPO / "benchmarks" / "textarena_sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _table() -> dict[str, tuple[str, str]]:
    """The games of docs/results/games.md's sweep table: status and reason refused."""
    page = (REPO / "docs" / "results" / "games.md").read_text()
    rows = {}
    for line in page[page.index("## Every two-player game"):].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]  # reasons hold no "|" (written as "/")
        if len(cells) == 6 and re.fullmatch(r"[\w-]+-v\d[\w-]*", cells[0]):
            rows[cells[0]] = (cells[1], cells[5])
    return rows


def test_the_table_lists_every_game_played_and_evaluated_or_refused_in_one_line():
    rows = _table()
    assert len(rows) >= 100  # every two-player game that builds (110 with TextArena 0.7.4)
    assert {status for status, _ in rows.values()} <= {"played and evaluated", "refused"}
    assert all(reason for status, reason in rows.values() if status == "refused")


def test_representative_games_and_every_refused_one_still_do_what_the_table_says(tmp_path):
    bench = _bench()
    rows = _table()
    games = [g for g in REPRESENTATIVE if g in rows] + sorted(g for g, (s, _) in rows.items() if s == "refused")
    args = argparse.Namespace(steps=1, games=2, eval_games=4, max_turns=10, tokens=8)
    model = str(bench.tiny_model(tmp_path / "tiny"))
    for game in games:
        record = bench.sweep_game(game, model, args, tmp_path / "runs")
        status, reason = rows[game]
        assert record["status"] == status, (game, record)
        if status == "refused":
            assert "\n" not in record["reason"] and record["reason"].replace("|", "/") == reason, game
        else:
            assert record["completed"] == record["episodes"] == 2 and record["eval_failed"] == 0, game
            assert sum(record["outcomes"].values()) == 4 and record["checkpoint"], game
