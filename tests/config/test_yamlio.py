"""Reading YAML is bounded: an alias bomb, a self-containing alias and deep nesting are refused at once with
one error naming the file and the limit; ordinary anchors and merge keys still work."""

from __future__ import annotations

import time

import pytest

from teamrl.cli import main
from teamrl.config import tools as configtools
from teamrl.config.schema import load_config
from teamrl.config.tools.yamlio import MAX_DEPTH, MAX_NODES
from tests.conftest import HANG_S

BOMB = "\n".join(['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]'] + [
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]" for a, b in zip("abcdefgh", "bcdefghi")])


def _refused(path, capsys) -> list[str]:
    t0 = time.perf_counter()
    assert main(["train", str(path), "--dry-run"]) == 2
    assert time.perf_counter() - t0 < HANG_S  # refused at once, not after expanding 9^9 values
    return capsys.readouterr().err.strip().splitlines()


def test_an_alias_bomb_under_a_known_key_is_refused_at_once(tmp_path, capsys):
    path = tmp_path / "bomb.yaml"
    path.write_text(f"{BOMB}\ntrain:\n  loggers: *i\n")
    err = _refused(path, capsys)
    # a: 1 + 9 = 10 values; b: 1 + 9 * 10 = 91; c: 820; d: 7,381; e: 66,430; f: 597,871; g: 5,380,840;
    # h: 48,427,561; i: 435,848,050 (sum 490,329,054) + 9 keys; train: 1 + loggers key 1 + *i 435,848,050;
    # + the key train + the document: 490,329,063 + 435,848,052 + 2 = 926,177,117
    assert err[-1].strip() == (f"{path}: refused: the document expands to 926,177,117 values once its aliases (*name) "
                               f"are expanded; the limit is MAX_NODES={MAX_NODES:,}"), err


def test_an_alias_inside_what_it_names_is_refused(tmp_path, capsys):
    path = tmp_path / "loop.yaml"
    path.write_text("train:\n  loggers: &x [tensorboard, *x]\n")
    err = _refused(path, capsys)
    assert f"{path}: refused: an alias refers to a node that contains it (line 2)" in err[-1], err


def test_nesting_deeper_than_the_limit_is_refused(tmp_path, capsys):
    path = tmp_path / "deep.yaml"
    path.write_text("train:\n  loggers: " + "[" * 10_000 + "]" * 10_000 + "\n")
    err = _refused(path, capsys)
    assert f"{path}: refused: nesting deeper than {MAX_DEPTH} levels" in err[-1], err


def test_an_override_is_bounded_too():
    with pytest.raises(configtools.ConfigError, match="nesting deeper than"):
        load_config(None, ["train.loggers=" + "[" * 1000 + "]" * 1000])


def test_anchors_and_merge_keys_of_an_ordinary_config_still_load(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("agents:\n  solver: &agent {max_new_tokens: 16, temperature: 0.7}\n"
                    "  verifier: {<<: *agent, temperature: 0.5}\n")
    cfg = load_config(path)
    assert (cfg.agents["verifier"].max_new_tokens, cfg.agents["verifier"].temperature) == (16, 0.5)
