"""Answer normalisation and the EM / F1 / substring metrics, values computed by hand."""

from __future__ import annotations

import pytest

from teamrl.domains.search.metrics import METRICS, exact_match, f1, normalize_answer, substring_em


@pytest.mark.parametrize("raw,normal", [
    ("  The Beatles!! ", "beatles"),
    ("An apple a day", "apple day"),
    ("U.S.A.", "usa"),
    ("Theatre of the Absurd", "theatre of absurd"),  # "the" only as a whole word
    ("Rock-'n'-roll\tmusic\n", "rocknroll music"),
    ("", ""),
])
def test_normalize_answer(raw, normal):
    assert normalize_answer(raw) == normal


def test_exact_match_is_max_over_golds():
    assert exact_match("the Beatles.", ["The Rolling Stones", "Beatles"]) == 1.0
    assert exact_match("Beatles band", ["Beatles"]) == 0.0
    assert exact_match("", ["a"]) == 1.0  # both normalise to ""
    assert exact_match("x", []) == 0.0


def test_f1_hand_computed():
    # [big, red, dog] vs [red, dog]: overlap 2, P = 2/3, R = 1, F1 = 2PR/(P+R) = 0.8
    assert f1("the big red dog", ["red dog"]) == pytest.approx(0.8)
    # counts are clipped: {dog:2, cat:1} & {dog:1, cat:2} = 2 tokens, P = R = 2/3
    assert f1("dog dog cat", ["dog cat cat"]) == pytest.approx(2 / 3)
    assert f1("paris", ["city of paris", "Paris"]) == 1.0
    assert f1("london", ["paris"]) == 0.0
    assert f1("", ["paris"]) == 0.0
    assert f1("the", ["a"]) == 0.0  # both empty after normalisation: no overlap


def test_substring_em():
    assert substring_em("It was Paris, France", ["paris"]) == 1.0
    assert substring_em("Parisian", ["Paris"]) == 1.0  # plain substring, as Search-R1's subEM
    assert substring_em("Lyon", ["Paris", "Marseille"]) == 0.0
    assert substring_em("anything", ["The"]) == 0.0  # an empty normalised gold matches nothing


def test_metrics_are_registered():
    assert set(METRICS) == {"em", "f1", "substring_em"}
