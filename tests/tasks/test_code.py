"""Running programs against call and stdin/stdout tests: every status, the failing test's details, feedback."""

from __future__ import annotations

import shutil

import pytest

from teamrl.domains.code.code import (
    CallTests,
    CodeProblem,
    IOTests,
    Verdict,
    extract_code,
    feedback,
    outputs_match,
    run_tests_many,
)
from teamrl.sandbox import Limits, Sandbox

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

LIMITS = Limits(cpu_seconds=1, wall_seconds=2, memory_bytes=256 * 2**20, output_bytes=32 * 1024)
ADD = CodeProblem("add", "add", CallTests(("assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(0, 0) == 0")),
                  "add")
SUM = CodeProblem("sum", "sum", IOTests((("1 2\n", "3\n"), ("5 5\n", "10\n"))))


@pytest.fixture(scope="module")
def verdicts():
    box = Sandbox(workers=4)
    items = {
        "call_ok": (ADD, "def add(a, b):\n    return a + b"),
        "call_wrong": (ADD, "def add(a, b):\n    return a * b + 1"),
        "call_raises": (ADD, "def add(a, b):\n    return a / 0"),
        "call_syntax": (ADD, "def add(a, b) return"),
        "call_exit_early": (ADD, "import os\nos._exit(0)"),
        "call_sys_exit_in_test": (ADD, "import sys\ndef add(a, b):\n    sys.exit(0)"),
        "call_forged_output": (ADD, "print('{\"done\": true}')\ndef add(a, b):\n    return 0"),
        "call_loops": (ADD, "def add(a, b):\n    if a == 2:\n        while True:\n            pass\n    return a + b"),
        "call_memory": (ADD, "def add(a, b):\n    return len(bytearray(10**10))"),
        "call_prints_a_lot": (ADD, "def add(a, b):\n    print('x' * 100000)\n    return a + b"),
        "io_ok": (SUM, "a, b = map(int, input().split())\nprint(a + b)"),
        "io_wrong": (SUM, "a, b = map(int, input().split())\nprint(a * b)"),
        "io_raises": (SUM, "print(int(input()))"),
        "io_crash": (SUM, "import os\nos.abort()"),
    }
    found = run_tests_many(list(items.values()), sandbox=box, limits=LIMITS)
    box.close()
    return dict(zip(items, found, strict=True))


@pytest.mark.parametrize(("name", "status", "passed", "test"), [
    ("call_ok", "passed", 3, None), ("call_wrong", "failed", 1, 1), ("call_raises", "error", 0, 0),
    ("call_syntax", "error", 0, None), ("call_exit_early", "error", 0, 0), ("call_sys_exit_in_test", "error", 0, 0),
    ("call_forged_output", "failed", 1, 0), ("call_loops", "timeout", 1, 1), ("call_memory", "memory", 0, 0),
    ("call_prints_a_lot", "output_limit", 0, 0), ("io_ok", "passed", 2, None), ("io_wrong", "failed", 0, 0),
    ("io_raises", "error", 0, 0), ("io_crash", "killed", 0, 0),
])
def test_each_outcome_gets_its_status(verdicts, name, status, passed, test):
    v = verdicts[name]
    assert (v.status, v.passed, v.test) == (status, passed, test), v


def test_the_failing_test_is_described(verdicts):
    wrong = verdicts["call_wrong"]
    assert (wrong.input, wrong.expected, wrong.actual, wrong.fraction) == ("assert add(2, 2) == 4", "4", "5", 1 / 3)
    assert verdicts["call_raises"].error == "ZeroDivisionError"
    assert "a / 0" in verdicts["call_raises"].traceback and "code_harness" not in verdicts["call_raises"].traceback
    assert verdicts["call_syntax"].error.startswith("SyntaxError")
    assert verdicts["call_sys_exit_in_test"].error == "SystemExit"
    io = verdicts["io_wrong"]
    assert (io.input, io.expected, io.actual) == ("1 2\n", "3\n", "2\n")
    assert verdicts["io_raises"].error == "ValueError"


def test_feedback_shows_what_a_refiner_needs(verdicts):
    assert feedback(verdicts["call_wrong"]) == ("Failed test 2 of 3 (1 passed).\nInput: assert add(2, 2) == 4\n"
                                                "Expected: 4\nGot: 5")
    text = feedback(verdicts["call_raises"])
    assert text.startswith("Error in test 1 of 3: ZeroDivisionError.") and "ZeroDivisionError: division by zero" in text
    assert feedback(verdicts["call_loops"]).startswith("Stopped in test 2 of 3 (1 passed): time limit.")
    assert feedback(verdicts["io_ok"]) == "All 2 tests passed."


def test_extract_code_takes_the_last_python_block():
    reply = "```\nplain\n```\nthen\n```python\nfirst\n```\nand\n```py\nsecond\n```"
    assert extract_code(reply) == "second\n"
    assert extract_code("```\nonly bare\n```") == "only bare\n"
    assert extract_code("```python\n   \n```") is None
    assert extract_code("```python\nunclosed") == "unclosed"


def test_outputs_match_ignores_trailing_space_only():
    assert outputs_match("1\r\n2  \n\n", "1\n2")
    assert not outputs_match("1 2", "1  2")
    assert not outputs_match("", "0")


def test_a_verdict_without_tests_has_fraction_zero():
    assert Verdict("error", 0, 0).fraction == 0.0
