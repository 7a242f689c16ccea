"""The test harness that runs inside the sandbox for function-call tests (standard library only).

It is copied into the sandbox as ``main.py`` beside ``solution.py`` (the candidate program),
``tests.py`` (setup code, e.g. HumanEval's ``def check``) and ``tests.json`` (the test statements).
It reads a one-line nonce from stdin, runs the program as module ``solution``, then the setup, then
every test statement in that namespace, and writes one line ``<nonce> <json>`` per event to the
original stdout (the program's own prints go to stderr): ``{"stage": "program"|"setup", ...}`` when
those raise, ``{"test": i, "ok": bool, ...}`` per test, ``{"done": true}`` at the end. A run
without the final line did not finish its tests (exit, crash, limit). An ``assert a == b`` test
that fails reports ``repr(a)`` and ``repr(b)``; an exception reports its type and the traceback
without the harness's frames.

Left out: protection against a program that inspects the harness's frames to learn the nonce
(the sandbox contains such a program; only its reward could be forged).
"""

import ast
import json
import os
import sys
import traceback

_REPR_CAP = 400
_TB_CAP = 1200


def _short(text, cap):
    return text if len(text) <= cap else text[: cap // 2] + " ... " + text[-cap // 2:]


def _tb(exc):
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
    return _short("".join(lines), _TB_CAP)


def _compare(stmt):
    """The (left, right) expressions of a lone ``assert left == right``, else None."""
    tree = ast.parse(stmt)
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        return None
    test = tree.body[0].test
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        return ast.Expression(test.left), ast.Expression(test.comparators[0])
    return None


def _run_test(stmt, ns):
    """Result record of one test statement."""
    try:
        pair = _compare(stmt)
        if pair is None:
            exec(compile(stmt, "<test>", "exec"), ns)
            return {"ok": True}
        actual = eval(compile(pair[0], "<test>", "eval"), ns)
        expected = eval(compile(pair[1], "<test>", "eval"), ns)
        if actual == expected:
            return {"ok": True}
        return {"ok": False, "actual": _short(repr(actual), _REPR_CAP), "expected": _short(repr(expected), _REPR_CAP)}
    except AssertionError as exc:
        return {"ok": False, "error": "AssertionError", "traceback": _tb(exc)}
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are the program's too
        return {"ok": False, "error": type(exc).__name__, "traceback": _tb(exc)}


def main():
    nonce = sys.stdin.readline().strip()
    with open("tests.json") as fh:
        tests = json.load(fh)
    with open("solution.py") as fh:
        program = fh.read()
    with open("tests.py") as fh:
        setup = fh.read()
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def report(record):
        channel.write(nonce + " " + json.dumps(record) + "\n")
        channel.flush()

    ns = {"__name__": "solution", "__builtins__": __builtins__}
    for stage, source, name in (("program", program, "solution.py"), ("setup", setup, "tests.py")):
        try:
            exec(compile(source, name, "exec"), ns)
        except BaseException as exc:  # noqa: BLE001
            report({"stage": stage, "error": type(exc).__name__, "traceback": _tb(exc)})
            return
    for i, stmt in enumerate(tests):
        record = _run_test(stmt, ns)
        record["test"] = i
        report(record)
    report({"done": True})


if __name__ == "__main__":
    main()
