"""Numbers compare as numbers: e-notation, LaTeX scientific notation and plain digits
(Minerva-style golds such as ``4.5e33``), with the relative tolerance NUMBER_REL_TOL."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from teamrl.domains.math.math import MathConfig, MathTask
from teamrl.tasks.grading import NUMBER_REL_TOL, grade_answer, parse_number
from tests.conftest import shared_data


def renderings(value: Decimal) -> list[str]:
    """Ways of writing ``value``: e-notation (e, E, e+), LaTeX scientific notation, plain digits."""
    sign, digits, exponent = value.normalize().as_tuple()
    assert isinstance(exponent, int)
    k = len(digits) - 1 + exponent  # value = m * 10^k with 1 <= |m| < 10
    mantissa = ("-" if sign else "") + str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
    plus = "+" if k >= 0 else ""
    return [
        f"{mantissa}e{k}",
        f"{mantissa}E{k}",
        f"{mantissa}e{plus}{k}",
        f"{mantissa} \\times 10^{{{k}}}",
        f"{mantissa}\\cdot10^{{{k}}}",
        f"${mantissa}\\times10^{{{k}}}$",
        format(value, "f"),
    ]


@pytest.mark.parametrize(
    "pred",
    ["4.5 \\times 10^{33}", "4.5E33", "4.5e+33", "4.5\\cdot10^{33}", "4500000000000000000000000000000000",
     "$4.5\\times10^{33}$", "4.50e33", "45e32"],
)
def test_e_notation_gold_matches_equivalent_forms(pred: str) -> None:
    assert grade_answer("4.5e33", pred) == 1.0
    assert grade_answer(pred, "4.5e33") == 1.0  # and the other way round


@pytest.mark.parametrize(
    ("gold", "pred"),
    [
        ("4.5e33", "4.6e33"),  # 2% off
        ("4.5e33", "4.6 \\times 10^{33}"),
        ("4.5e33", "4.5e32"),  # a factor of ten
        ("45", "4.5"),
        ("4.5", "45"),
        ("1.2e-8", "1.3E-8"),  # math-verify alone rounds both to 0.000000
        ("1.2 \\times 10^{-8}", "1.3e-8"),
        ("4500000000000000000000000000000000", "4.5000001e33"),  # an integer gold is matched exactly
        ("10000", "10000.5"),
        ("4.5e33", "-4.5e33"),
        ("0", "1e-9"),
    ],
)
def test_different_numbers_do_not_match(gold: str, pred: str) -> None:
    assert grade_answer(gold, pred) == 0.0
    assert grade_answer(pred, gold) == 0.0


def test_relative_tolerance() -> None:
    # |2.7778e-6 - 2.778e-6| / 2.778e-6 = 7.2e-5 <= 1e-4: rounding in the fifth significant digit passes
    assert NUMBER_REL_TOL == 1e-4
    assert grade_answer("2.7778e-6", "2.778 \\times 10^{-6}") == 1.0
    # 1.0002e5 vs 1e5: 2e-4 > 1e-4
    assert grade_answer("1e5", "1.0002e5") == 0.0


def test_e_notation_inside_larger_answers_goes_to_math_verify() -> None:
    assert grade_answer("(4.5e33, 2)", "(4.5\\times10^{33}, 2)") == 1.0
    assert grade_answer("(4.5e33, 2)", "(4.6\\times10^{33}, 2)") == 0.0
    assert grade_answer("(4.5e33, 2)", "(4.5\\times10^{33}, 2)", backend="process") == 1.0  # helper process too


@pytest.mark.parametrize(
    ("text", "value", "integer"),
    [
        ("42", "42", True),
        ("-0.5", "-0.5", False),
        ("4.5e33", "4.5e33", False),
        ("4.5E+33", "4.5e33", False),
        ("$4.5 \\times 10^{33}$", "4.5e33", False),
        ("4.5\\cdot10^{-3}", "0.0045", False),
        ("10^{5}", "100000", False),
        ("10^5", "100000", False),
    ],
)
def test_parse_number(text: str, value: str, integer: bool) -> None:
    assert parse_number(text) == (Decimal(value), integer)


@pytest.mark.parametrize("text", ["x", "2e", "1,000", "4.5e33 m", "e^{3}", "3 + 4", "\\frac{1}{2}", ""])
def test_parse_number_rejects_other_answers(text: str) -> None:
    assert parse_number(text) is None


_MANTISSAS = st.decimals(min_value=Decimal("1"), max_value=Decimal("9.9999"), places=4, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(mantissa=_MANTISSAS, exponent=st.integers(-40, 40), negative=st.booleans())
def test_number_matches_its_own_renderings(mantissa: Decimal, exponent: int, negative: bool) -> None:
    value = mantissa.scaleb(exponent) * (-1 if negative else 1)
    forms = renderings(value)
    for gold in forms:
        for pred in forms:
            assert grade_answer(gold, pred) == 1.0, (gold, pred)


@settings(max_examples=200, deadline=None)
@given(mantissa=_MANTISSAS, exponent=st.integers(-40, 40), factor=st.sampled_from(["10", "0.1", "1.001", "0.999", "-1"]))
def test_number_never_matches_a_changed_value(mantissa: Decimal, exponent: int, factor: str) -> None:
    value = mantissa.scaleb(exponent)
    changed = value * Decimal(factor)
    for gold, pred in zip(renderings(value), renderings(changed)):
        assert grade_answer(gold, pred) == 0.0, (gold, pred)


# Numeric golds in the benchmark files and how many of them are in e-notation. minerva_math
# (simpleRL-reason's examples/simplelr_math_eval/data/minerva_math/test.jsonl, 272 problems, golds
# read from the last \boxed{} of "solution") has 58 (21%); the other benchmarks have none.
BENCHMARKS = [
    ("minerva_math/test.jsonl", 58),
    ("olympiadbench/test.jsonl", 0),
    ("math500/test.jsonl", 0),
    ("gsm8k/test.jsonl", 0),
    ("aime24/test.jsonl", 0),
    ("aime25/test.jsonl", 0),
    ("amc23/test.jsonl", 0),
    ("math_train/train.json", 0),
    ("aime_1983_2023/train.json", 0),
]


@pytest.mark.parametrize(("name", "e_golds"), BENCHMARKS)
def test_benchmark_numeric_golds_match_equivalent_forms(name: str, e_golds: int) -> None:
    path = shared_data() / name
    if not path.is_file():
        pytest.skip(f"{path} is not present")
    golds = [p.answer for p in MathTask(MathConfig(test_path=str(path), skip_bad_rows=True)).problems("test")]
    numbers = [(g, parse_number(g)) for g in golds]
    numbers = [(g, n[0]) for g, n in numbers if n is not None]
    in_e_notation = [g for g, _ in numbers if re.search(r"\d[eE]", g)]
    assert len(in_e_notation) == e_golds, in_e_notation
    assert numbers, f"{name} has no numeric golds"
    for gold, value in numbers:
        for form in renderings(value):
            assert grade_answer(gold, form) == 1.0, (gold, form)
            assert grade_answer(form, gold) == 1.0, (form, gold)
        if value != 0:
            assert grade_answer(gold, renderings(value * 10)[0]) == 0.0, gold
