"""The default test run cannot flake on a loaded machine: no test outside ``-m slow``/``ray``/``vllm`` asserts that
something took less than 5 s of wall-clock time. A test shows behaviour (a timeout path taken, calls that overlapped,
no retry slept) and may keep a hang guard of ``tests.conftest.HANG_S``; speed is measured by ``benchmarks/``.

The check reads each test function's source: a comparison ``<``/``<=`` (or ``>``/``>=`` reversed) between a number
under 5 and an expression that reads a clock (``time.perf_counter()``, ``time.monotonic()``, ``time.time()``), a name
assigned from one, or a name that says it holds a duration (``elapsed``, ``seconds``, ``took``, ``wall``, ...)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from tests.conftest import HANG_S, REPO

MIN_BOUND_S = 5.0
CLOCKS = {"perf_counter", "monotonic", "time", "perf_counter_ns", "monotonic_ns"}
DURATION_WORDS = ("elapsed", "second", "took", "wall", "duration", "latency")
NOT_DEFAULT = {"slow", "ray", "vllm"}  # deselected by the default addopts (pyproject.toml)


def _reads_a_clock(node: ast.AST, timed: set[str]) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            f = sub.func
            if (isinstance(f, ast.Attribute) and f.attr in CLOCKS) or (isinstance(f, ast.Name) and f.id in CLOCKS):
                return True
        name = sub.id if isinstance(sub, ast.Name) else sub.attr if isinstance(sub, ast.Attribute) else None
        if name is not None and (name in timed or any(w in name.lower() for w in DURATION_WORDS)):
            return True
    return False


def _number(node: ast.AST) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    return None


def _marks(decorators: list[ast.expr]) -> set[str]:
    """``pytest.mark.<name>`` names among decorators or a ``pytestmark`` value."""
    found = set()
    for dec in decorators:
        for sub in ast.walk(dec):
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute) and sub.value.attr == "mark":
                found.add(sub.attr)
    return found


def short_wall_clock_bounds(source: str) -> Iterator[tuple[str, int, float]]:
    """(function, line, bound) for each wall-clock bound under ``MIN_BOUND_S`` in the default run's tests."""
    tree = ast.parse(source)
    module_marks = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            module_marks |= _marks([node.value])
    if module_marks & NOT_DEFAULT:
        return
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or _marks(fn.decorator_list) & NOT_DEFAULT:
            continue
        timed: set[str] = set()
        for _ in range(3):  # start = clock(); elapsed = clock() - start; seconds = elapsed; ...
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign) and _reads_a_clock(node.value, timed):
                    timed |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        for node in ast.walk(fn):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, sides, sides[1:]):
                if isinstance(op, (ast.Lt, ast.LtE)):
                    clock, bound = left, _number(right)
                elif isinstance(op, (ast.Gt, ast.GtE)):
                    clock, bound = right, _number(left)
                else:
                    continue
                if bound is not None and bound < MIN_BOUND_S and _reads_a_clock(clock, timed):
                    yield fn.name, node.lineno, bound


def test_the_check_finds_short_bounds() -> None:
    source = '''
import time, pytest
def test_a():
    start = time.perf_counter()
    elapsed = time.perf_counter() - start
    assert 0.1 <= elapsed < 1.5
def test_b(run):
    assert run.seconds <= 2 and 3 > time.monotonic()
def test_guard():
    start = time.monotonic()
    assert time.monotonic() - start < 30 and len([]) < 2
@pytest.mark.slow
def test_slow():
    assert time.monotonic() < 1
'''
    assert list(short_wall_clock_bounds(source)) == [("test_a", 6, 1.5), ("test_b", 8, 2.0), ("test_b", 8, 3.0)]
    assert list(short_wall_clock_bounds("import pytest\npytestmark = pytest.mark.slow\n" + source)) == []


def test_no_default_test_asserts_a_wall_clock_bound_under_5_s() -> None:
    assert HANG_S >= MIN_BOUND_S
    found = [f"{path.relative_to(REPO)}:{line} {name}: < {bound:g} s"
             for path in sorted((REPO / "tests").rglob("*.py"))
             for name, line, bound in short_wall_clock_bounds(path.read_text(encoding="utf-8"))]
    assert found == [], "wall-clock bounds a loaded machine can break (bound the behaviour; keep HANG_S as a guard):\n" \
        + "\n".join(found)
