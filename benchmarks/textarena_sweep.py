"""Every two-player TextArena game that builds, played and evaluated: a short self-play run and an evaluation
against the random player per game, or the game's one-line refusal before training.

Per game (``configs/tictactoe_selfplay.yaml`` with the game's id swapped in, ``max_turns`` 10, ``train.save_every=0``):

1. the game is built and reset with two players (``tests/tasks/test_catalogue_inventory.py`` builds all 110);
2. the trainer is built: its check of ``eval.workflow: game_vs_random`` plays 2 test games with random moves in
   both seats (:func:`teamrl.domains.environments.games.check_random_player`) and refuses, in one line, a game
   whose random player finds no move the game accepts;
3. ``--steps`` steps of self-play (``--games`` games a step), then the evaluation against the random player
   (``--eval-games`` games, the agent in seat ``seed % 2``).

Recorded per game: ``plays`` (self-play episodes that completed, of those played), the invalid-move rate of the
self-play moves (the mean of both seats' ``agent/<seat>/invalid_rate``), ``evaluates`` (the evaluation's games completed and their outcomes
recorded, with no failed episode), the checkpoint written, or the refusal and its reason.

``--model tiny`` (default): a 2-layer random Llama over SmolLM2's tokenizer (as the tests use), for the mechanics:
its moves are mostly invalid, so games end early by TextArena's rule, but every game is built, played, trained on
and evaluated. ``--model default``: the embedded SmolLM2-135M-Instruct (about 10x slower per game on 2 CPU cores).

    python benchmarks/textarena_sweep.py --out /tmp/sweep              # every game
    python benchmarks/textarena_sweep.py --games-only ConnectFour-v0 Nim-v0 --out /tmp/sweep

Writes ``sweep.jsonl`` (one record per game) under ``--out`` and prints a Markdown table and one line::

    RESULT name=textarena_sweep built=... played_and_evaluated=... refused=... failed=...
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "tictactoe_selfplay.yaml"


def two_player_games() -> list[str]:
    """Every TextArena id that builds and resets as a two-player game (the ``-train`` / ``-raw`` wrappers of the
    same games left out, as the inventory test does)."""
    from textarena.envs.registration import ENV_REGISTRY

    from teamrl.tasks.base import build_task

    games = []
    for env_id in sorted(ENV_REGISTRY):
        if env_id.endswith(("-train", "-raw")):
            continue
        try:
            with _quiet():
                task = build_task("textarena_two_player", {"env_id": env_id, "n_train": 1, "n_test": 1})
                task.problems("train")
            games.append(env_id)
        except Exception:  # noqa: BLE001  (a game that does not build: the inventory test reports its cause)
            continue
    return games


@contextlib.contextmanager
def _quiet():
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def tiny_model(out: Path) -> Path:
    """A 2-layer random Llama over SmolLM2's tokenizer, saved under ``out`` (positions for long game texts)."""
    from transformers import AutoTokenizer

    from teamrl.models import resolve_model_path
    from tests.conftest import make_tiny_model

    tok = AutoTokenizer.from_pretrained(resolve_model_path("default"))
    model = make_tiny_model(tok)
    model.config.max_position_embeddings = 8192
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def overrides(env_id: str, run_dir: Path, model: str, args: argparse.Namespace) -> list[str]:
    """The shipped TicTacToe config with ``env_id`` swapped in, at the sweep's sizes."""
    return [f"run_dir={run_dir}", f"task.textarena_two_player.env_id={env_id}",
            f"task.textarena_two_player.max_turns={args.max_turns}", "task.textarena_two_player.n_train=8",
            f"task.textarena_two_player.n_test={max(args.eval_games, 2)}", f"models.main.path={model}",
            f"train.steps={args.steps}", "train.save_every=0", f"rollout.batch_size={args.games}",
            "eval.before=false", f"eval.problems={args.eval_games}", "train.loggers=[]", "train.threads=2",
            f"agents.player_0.max_new_tokens={args.tokens}", f"agents.player_1.max_new_tokens={args.tokens}"]


def sweep_game(env_id: str, model: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """One game's record: refused (with its one-line reason) or the self-play and evaluation figures."""
    from teamrl.config.schema import load_config
    from teamrl.train.trainer import Trainer

    run_dir = root / env_id
    cfg = load_config(str(CONFIG), overrides(env_id, run_dir, model, args))
    t0 = time.perf_counter()
    try:
        with _quiet():
            trainer = Trainer(cfg, progress=False)
    except ValueError as exc:
        return {"game": env_id, "status": "refused", "reason": str(exc), "seconds": time.perf_counter() - t0}
    try:
        with _quiet():
            results = trainer.train()
    except Exception as exc:  # noqa: BLE001  (recorded: the table must show it, and the test fails on it)
        return {"game": env_id, "status": "failed", "reason": f"{type(exc).__name__}: {str(exc).splitlines()[0]}",
                "seconds": time.perf_counter() - t0}
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    played = args.games * len(metrics)
    failed_train = int(sum(m["rollout/failed_episodes"] for m in metrics))
    after = results["after"]
    outcomes = after.get("outcomes", {})
    evaluated = "failed" not in after and after.get("failed_episodes", 1) == 0 and \
        sum(o.get("count", 0) for o in outcomes.values() if isinstance(o, dict)) == after["problems"]
    invalid = [m[k] for m in metrics for k in ("agent/player_0/invalid_rate", "agent/player_1/invalid_rate") if k in m]
    moves = [m["rollout/calls_per_episode"] for m in metrics]  # both seats' moves per self-play game
    ok = failed_train == 0 and evaluated and (run_dir / "checkpoints" / f"step_{args.steps}").is_dir()
    return {"game": env_id, "status": "played and evaluated" if ok else "failed",
            "episodes": played, "completed": played - failed_train,
            "invalid_rate": sum(invalid) / len(invalid) if invalid else None,
            "moves_per_game": sum(moves) / len(moves) if moves else None,
            "eval_games": after["problems"], "eval_failed": after.get("failed_episodes"),
            "eval_error": after.get("failed"), "outcomes": {k: v.get("count") for k, v in outcomes.items()
                                                           if isinstance(v, dict)},
            "checkpoint": (run_dir / "checkpoints" / f"step_{args.steps}").is_dir(),
            "seconds": round(time.perf_counter() - t0, 1)}


def table(records: list[dict[str, Any]]) -> str:
    """The records as the Markdown table of docs/results/games.md."""
    rows = ["| game | status | self-play games completed | invalid-move rate | eval games (win/draw/loss) | "
            "reason refused |", "| --- | --- | --- | --- | --- | --- |"]
    for r in records:
        if r["status"] == "refused" or "episodes" not in r:
            rows.append(f"| {r['game']} | {r['status']} | | | | {r['reason'].replace('|', '/')} |")
            continue
        o = r["outcomes"]
        rate = "" if r["invalid_rate"] is None else f"{r['invalid_rate']:.2f}"
        rows.append(f"| {r['game']} | {r['status']} | {r['completed']}/{r['episodes']} | {rate} | {r['eval_games']} "
                    f"({o.get('win', 0)}/{o.get('draw', 0)}/{o.get('loss', 0)}) | |")
    return "\n".join(rows)


def _timed_out(signum: int, frame: Any) -> None:
    raise TimeoutError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/textarena_sweep"))
    parser.add_argument("--model", choices=["tiny", "default"], default="tiny")
    parser.add_argument("--games-only", nargs="*", default=None, metavar="ENV_ID", help="these games only")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--games", type=int, default=2, help="self-play games per step")
    parser.add_argument("--eval-games", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=8, help="max_new_tokens of each move")
    parser.add_argument("--timeout", type=int, default=300, help="seconds one game may take")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGALRM, _timed_out)
    logging.disable(logging.WARNING)  # the failed episodes' warnings; the records hold what matters
    args.out.mkdir(parents=True, exist_ok=True)
    games = args.games_only or two_player_games()
    with tempfile.TemporaryDirectory() as tmp:
        model = str(tiny_model(Path(tmp) / "tiny")) if args.model == "tiny" else "default"
        records = []
        with (args.out / "sweep.jsonl").open("w") as f:
            for env_id in games:
                signal.alarm(args.timeout)  # a game whose TextArena code hangs is recorded, the sweep goes on
                try:
                    record = sweep_game(env_id, model, args, Path(tmp) / "runs")
                except TimeoutError:
                    record = {"game": env_id, "status": "failed", "reason": f"timed out after {args.timeout} s",
                              "seconds": float(args.timeout)}
                finally:
                    signal.alarm(0)
                records.append(record)
                f.write(json.dumps(record) + "\n")
                f.flush()
                print(f"{env_id}: {record['status']} ({record['seconds']:.0f} s) {record.get('reason', '')}",
                      file=sys.stderr, flush=True)
    print(table(records))
    count = {s: sum(r["status"] == s for r in records) for s in ("played and evaluated", "refused", "failed")}
    print(f"RESULT name=textarena_sweep built={len(records)} played_and_evaluated={count['played and evaluated']} "
          f"refused={count['refused']} failed={count['failed']}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))  # tests.conftest's tiny model
    raise SystemExit(main())
