"""Every catalogue entry is made or refused with its cause in one line: each reasoning-gym dataset (two
problems each), each single-player TextArena game id and each two-player one. The report names the ones made
on one line and lists the refused ones, one line each (``pytest -m slow tests/tasks/test_catalogue_inventory.py
-s`` prints it)."""

from __future__ import annotations

import contextlib
import io

import pytest

from teamrl.tasks.base import build_task

pytestmark = pytest.mark.slow  # about a minute: 100+ datasets and 200+ game ids


def _report(kind: str, refused: dict[str, str], made: int, names: list[str] | None = None) -> None:
    print(f"\n{kind}: {made} made, {len(refused)} refused")
    if names:
        print(f"  made: {', '.join(sorted(names))}")
    for name, why in sorted(refused.items()):
        print(f"  {name}: {why}")


def _one_line_refusal(exc: BaseException) -> str:
    assert isinstance(exc, ValueError), f"{type(exc).__name__} leaked instead of a ValueError: {exc}"
    text = str(exc)
    assert text and "\n" not in text, f"refusal is not one line: {text!r}"
    return text


def test_every_reasoning_gym_dataset_is_made_or_refused_in_one_line():
    rg = pytest.importorskip("reasoning_gym")
    refused, made, names = {}, 0, []
    for name in sorted(rg.factory.DATASETS):
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                task = build_task("reasoning_gym", {"dataset": name, "n_train": 2, "n_test": 2})
            p = task.problems("train")[0]
            assert p.question and 0.0 <= task.score(p, f"<answer>{p.answer}</answer>") <= 1.0
            made += 1
            names.append(name)
        except Exception as exc:  # noqa: BLE001 (each one is checked and reported)
            refused[name] = _one_line_refusal(exc)
    _report("reasoning-gym", refused, made, names)
    assert made >= 0.9 * (made + len(refused))


def _textarena_sweep(task_name: str) -> tuple[dict[str, str], int, int, list[str]]:
    """Every TextArena id built as ``task_name``: the refused ones with their one-line cause, how many were made,
    how many are for another number of players, and the names of those made."""
    from textarena.envs.registration import ENV_REGISTRY

    refused, made, other, names = {}, 0, 0, []
    for env_id in sorted(ENV_REGISTRY):
        if env_id.endswith(("-train", "-raw")):  # the same games with other wrappers
            continue
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                task = build_task(task_name, {"env_id": env_id, "n_train": 1, "n_test": 1})
                task.problems("train")
            made += 1
            names.append(env_id)
        except Exception as exc:  # noqa: BLE001
            why = _one_line_refusal(exc)
            if "another number of players" in why:
                other += 1
            else:
                refused[env_id] = why
    return refused, made, other, names


def test_every_single_player_textarena_game_is_made_or_refused_in_one_line():
    pytest.importorskip("textarena")
    refused, made, several, names = _textarena_sweep("textarena")
    print(f"\nTextArena: {several} games for two or more players left out")
    _report("TextArena single-player games (textarena)", refused, made, names)
    assert made >= 50


def test_every_two_player_textarena_game_is_made_or_refused_in_one_line():
    pytest.importorskip("textarena")
    refused, made, other, names = _textarena_sweep("textarena_two_player")
    print(f"\nTextArena: {other} games for one player or for more than two left out")
    _report("TextArena two-player games (textarena_two_player)", refused, made, names)
    assert made >= 30
