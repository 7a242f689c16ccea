"""Code problems, their tests, running a program against them in the sandbox, and feedback text.

Contract (what code tasks and workflows rely on):

* :class:`CodeProblem` holds a problem's text and its tests: :class:`CallTests` (statements such
  as ``assert add(1, 2) == 3`` run after the program in its namespace, as in HumanEval/MBPP; HumanEval's
  ``def check(candidate)`` goes in ``setup`` and the one test is ``check(entry_point)``) or
  :class:`IOTests` (stdin -> expected stdout pairs, as in APPS/CodeContests/LiveCodeBench; outputs
  compared line by line with trailing whitespace and trailing blank lines ignored). ``prefix`` is
  code placed before the candidate (HumanEval's prompt: its imports and helpers).
* :func:`extract_code` takes the last ```python (or bare ```) block of a reply; None when there is
  none (format invalid).
* :func:`run_tests` (one program) and :func:`run_tests_many` (a batch, in parallel) run the
  program in :mod:`teamrl.sandbox` and return a :class:`Verdict`: ``status`` one of
  :data:`STATUSES` (passed / failed / error / timeout / memory / output_limit / killed), the pass
  counts, the first failing test with its input, expected and actual output (trimmed) or the
  exception type and trimmed traceback.
* :func:`feedback` turns a verdict into the text a refining agent is shown.

Left out: reading problem files (``code_files``), tasks and rewards (``humaneval``, ``pyfunc``,
``code_files``), and the harness itself (``code_harness``, run inside the sandbox).
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from teamrl.sandbox import Job, Limits, Run, Sandbox, default_sandbox, trim

__all__ = ["STATUSES", "CallTests", "CodeProblem", "IOTests", "Verdict", "extract_code", "feedback",
           "outputs_match", "run_tests", "run_tests_many"]

STATUSES: tuple[str, ...] = ("passed", "failed", "error", "timeout", "memory", "output_limit", "killed")
"""Verdict statuses: every test passed; a test's answer was wrong; an exception (or a non-zero exit);
or the run's limit that ended it."""

_HARNESS = Path(__file__).with_name("code_harness.py").read_text()
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_TRIM = 400


@dataclass(frozen=True)
class CallTests:
    """Function-call tests: Python statements run after the program, each one test."""

    asserts: tuple[str, ...]
    """e.g. ``("assert add(1, 2) == 3", "assert add(0, 0) == 0")``."""
    setup: str = ""
    """Code run once after the program and before the tests (imports, ``def check``)."""


@dataclass(frozen=True)
class IOTests:
    """Standard input/output tests: the program is run once per case."""

    cases: tuple[tuple[str, str], ...]
    """(stdin, expected stdout) pairs."""


@dataclass(frozen=True)
class CodeProblem:
    """A programming problem and its hidden tests."""

    id: str
    prompt: str
    """The problem as shown to the model."""
    tests: CallTests | IOTests
    entry_point: str | None = None
    """Name of the function to write (call tests), when there is one."""
    prefix: str = ""
    """Code placed before the candidate program (its imports, helpers, signature stub)."""
    limits: Limits | None = None
    """Limits of each run (None: the caller's)."""


@dataclass(frozen=True)
class Verdict:
    """How a program did on a problem's tests."""

    status: str
    """One of :data:`STATUSES`."""
    passed: int
    """Tests passed."""
    total: int
    """Tests run or meant to run."""
    test: int | None = None
    """Index of the first test that did not pass (None: passed, or the program failed before any test)."""
    input: str | None = None
    """That test: the statement (call tests) or the stdin (I/O tests), trimmed."""
    expected: str | None = None
    actual: str | None = None
    error: str | None = None
    """Exception type name, or a short reason for a limit."""
    traceback: str | None = None
    """Trimmed traceback (or stderr tail)."""

    @property
    def fraction(self) -> float:
        """Share of the tests that passed (0.0 with no tests)."""
        return self.passed / self.total if self.total else 0.0

    @property
    def ok(self) -> bool:
        """True when every test passed."""
        return self.status == "passed"


def extract_code(reply: str) -> str | None:
    """The program in a reply: its last ```python / ```py block, else its last bare ``` block.

    >>> extract_code("Here:\\n```python\\ndef f():\\n    return 1\\n```\\nDone.")
    'def f():\\n    return 1\\n'
    >>> extract_code("no code") is None
    True
    """
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(reply)]
    python = [body for lang, body in blocks if lang in ("python", "py", "python3")]
    bare = [body for lang, body in blocks if not lang]
    chosen = python or bare
    if not chosen or not chosen[-1].strip():
        return None
    return chosen[-1]


def outputs_match(actual: str, expected: str) -> bool:
    """Compare program outputs line by line, ignoring trailing spaces and trailing blank lines.

    >>> outputs_match("3 \\n4\\n\\n", "3\\n4")
    True
    >>> outputs_match("3\\n5", "3\\n4")
    False
    """
    def lines(text: str) -> list[str]:
        out = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
        while out and not out[-1]:
            out.pop()
        return out
    return lines(actual) == lines(expected)


def _program(problem: CodeProblem, program: str) -> str:
    return f"{problem.prefix}\n\n{program}" if problem.prefix else program


def _jobs(problem: CodeProblem, program: str, limits: Limits) -> tuple[list[Job], str]:
    """The sandbox runs testing ``program`` on ``problem``, and the harness nonce."""
    limits = problem.limits or limits
    source = _program(problem, program)
    if isinstance(problem.tests, IOTests):
        return [Job(source, stdin, {}, limits) for stdin, _ in problem.tests.cases], ""
    nonce = secrets.token_hex(16)
    files = {"solution.py": source, "tests.py": problem.tests.setup, "tests.json": json.dumps(list(problem.tests.asserts))}
    return [Job(_HARNESS, nonce + "\n", files, limits)], nonce


def _limit_verdict(run: Run, passed: int, total: int, test: int | None) -> Verdict:
    reason = {"timeout": "time limit", "memory": "memory limit", "output_limit": "output limit",
              "killed": f"killed by a signal (exit {run.exit_code})"}.get(run.verdict, run.verdict)
    return Verdict(run.verdict, passed, total, test, error=reason, traceback=trim(run.stderr.strip(), _TRIM) or None)


def _io_verdict(problem: CodeProblem, runs: Sequence[Run]) -> Verdict:
    assert isinstance(problem.tests, IOTests)
    cases = problem.tests.cases
    good = [run.ok and outputs_match(run.stdout, want) for run, (_, want) in zip(runs, cases, strict=True)]
    passed, total = sum(good), len(cases)
    if all(good):
        return Verdict("passed", passed, total)
    i = good.index(False)
    run, (stdin, want) = runs[i], cases[i]
    if run.ok:
        return Verdict("failed", passed, total, i, trim(stdin, _TRIM), trim(want, _TRIM), trim(run.stdout, _TRIM))
    if run.verdict == "error":
        last = run.stderr.strip().splitlines()[-1:] or [f"exit status {run.exit_code}"]
        return Verdict("error", passed, total, i, trim(stdin, _TRIM), error=last[0].split(":")[0][:80],
                       traceback=trim(run.stderr.strip(), _TRIM * 2))
    return dataclasses.replace(_limit_verdict(run, passed, total, i), input=trim(stdin, _TRIM))


def _call_verdict(problem: CodeProblem, run: Run, nonce: str) -> Verdict:
    assert isinstance(problem.tests, CallTests)
    tests = problem.tests.asserts
    records = []
    for line in run.stdout.splitlines():
        if line.startswith(nonce + " "):
            try:
                records.append(json.loads(line[len(nonce) + 1:]))
            except json.JSONDecodeError:
                continue
    total = len(tests)
    results = [r for r in records if isinstance(r.get("test"), int) and 0 <= r["test"] < total]
    passed = sum(1 for r in results if r.get("ok") is True)
    done = any(r.get("done") is True for r in records)
    stage = next((r for r in records if "stage" in r), None)
    first = next((r for r in results if r.get("ok") is not True), None)
    if stage is not None:
        status = "memory" if stage.get("error") == "MemoryError" else "error"
        return Verdict(status, 0, total, None, None, error=f"{stage.get('error')} (in the {stage['stage']})",
                       traceback=trim(str(stage.get("traceback", "")), _TRIM * 2))
    if first is not None:
        i = first["test"]
        error = first.get("error")
        status = "failed" if error in (None, "AssertionError") else "memory" if error == "MemoryError" else "error"
        return Verdict(status, passed, total, i, trim(tests[i], _TRIM), first.get("expected"), first.get("actual"),
                       error, trim(str(first["traceback"]), _TRIM * 2) if first.get("traceback") else None)
    if done and passed == total:
        return Verdict("passed", passed, total)
    nxt = len(results) if len(results) < total else None
    if run.verdict in ("ok", "error"):
        return Verdict("error", passed, total, nxt, trim(tests[nxt], _TRIM) if nxt is not None else None,
                       error="exited before the tests finished", traceback=trim(run.stderr.strip(), _TRIM) or None)
    return dataclasses.replace(_limit_verdict(run, passed, total, nxt),
                               input=trim(tests[nxt], _TRIM) if nxt is not None else None)


def run_tests_many(items: Sequence[tuple[CodeProblem, str]], *, sandbox: Sandbox | None = None,
                   limits: Limits | None = None) -> list[Verdict]:
    """Run each (problem, program) pair's tests, all runs in parallel on the sandbox's workers.

    Args:
        items: (problem, program source) pairs; the program is the candidate without ``problem.prefix``.
        sandbox: Where to run (default: :func:`teamrl.sandbox.default_sandbox`).
        limits: Limits of each run when the problem has none (default :class:`teamrl.sandbox.Limits`).

    Returns:
        One :class:`Verdict` per pair, in order.
    """
    box = sandbox or default_sandbox()
    planned = [_jobs(problem, program, limits or Limits()) for problem, program in items]
    futures = [[box.submit(job) for job in jobs] for jobs, _ in planned]
    verdicts = []
    for (problem, _), (_, nonce), pending in zip(items, planned, futures, strict=True):
        runs = [f.result() for f in pending]
        if isinstance(problem.tests, IOTests):
            verdicts.append(_io_verdict(problem, runs))
        else:
            verdicts.append(_call_verdict(problem, runs[0], nonce))
    return verdicts


def run_tests(problem: CodeProblem, program: str, *, sandbox: Sandbox | None = None,
              limits: Limits | None = None) -> Verdict:
    """Run ``program`` against ``problem``'s tests in the sandbox (see :func:`run_tests_many`)."""
    return run_tests_many([(problem, program)], sandbox=sandbox, limits=limits)[0]


def feedback(verdict: Verdict) -> str:
    """What a refining agent is told about its parent program's run.

    >>> feedback(Verdict("failed", 1, 2, 1, "add(2, 2)", "4", "5"))
    'Failed test 2 of 2 (1 passed).\\nInput: add(2, 2)\\nExpected: 4\\nGot: 5'
    >>> feedback(Verdict("passed", 2, 2))
    'All 2 tests passed.'
    """
    if verdict.status == "passed":
        return f"All {verdict.total} tests passed."
    where = f"test {verdict.test + 1} of {verdict.total}" if verdict.test is not None else "the program"
    lines = {
        "failed": [f"Failed {where} ({verdict.passed} passed)."],
        "error": [f"Error in {where}: {verdict.error}."],
    }.get(verdict.status, [f"Stopped in {where} ({verdict.passed} passed): {verdict.error}."])
    if verdict.input is not None:
        lines.append(f"Input: {verdict.input.rstrip()}")
    if verdict.expected is not None:
        lines.append(f"Expected: {verdict.expected.rstrip()}")
    if verdict.actual is not None:
        lines.append(f"Got: {verdict.actual.rstrip()}")
    if verdict.traceback:
        lines.append(verdict.traceback.rstrip())
    return "\n".join(lines)
