"""Code-RL problem files a user brings, read into :class:`~teamrl.domains.code.code.CodeProblem` s, and the task ``code_files``.

Each layout is registered with a detector (does a row look like it?) and a converter; ``format:
auto`` detects the layout from the first row (like the QA layouts of the search task). Rows are read
with :func:`teamrl.tasks.rows.load_rows` (.jsonl, .json, .parquet, dataset folders). Built in, in
detection order:

================  ========================================================================
``humaneval``     ``task_id``, ``prompt``, ``test`` (defines ``check``), ``entry_point``:
                  function-call tests, the prompt placed before the reply (HumanEval, MultiPL-E's
                  Python rows, HumanEval+ without its extra inputs)
``mbpp``          ``text`` or ``prompt``, ``test_list`` (assert statements), optional
                  ``test_setup_code`` / ``test_imports``: function-call tests (MBPP, sanitized MBPP)
``apps``          ``question``, ``input_output`` (JSON text of ``inputs`` / ``outputs``; with
                  ``fn_name`` the inputs are argument lists: function-call tests), else stdin/stdout
``codecontests``  ``description`` and ``public_tests`` / ``private_tests`` / ``generated_tests``
                  (``{input: [...], output: [...]}``): stdin/stdout tests
``livecodebench`` ``question_content``, ``public_test_cases`` / ``private_test_cases`` (JSON text of
                  ``{input, output, testtype}``); stdin rows only. Private cases stored compressed
                  with pickle are not read (unpickling runs code); public ones are used then
``plain``         ``prompt`` (or ``question``) and ``tests``: a list of assert statements (with
                  ``entry_point``) or of ``{input, output}`` pairs
================  ========================================================================

Left out: LiveCodeBench's functional (LeetCode class) rows, special judges (several right outputs,
float tolerance) and languages other than Python.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from teamrl.domains.code.code import CallTests, CodeProblem, IOTests
from teamrl.domains.code.code_task import CodeScoring, CodeTaskBase
from teamrl.domains.code.pyfunc import smoke_as_pyfunc
from teamrl.suggest import did_you_mean
from teamrl.tasks.base import Problem, check_split, config_from, register_task
from teamrl.tasks.rows import BadLine, load_rows

__all__ = ["CODE_FORMATS", "CodeFilesConfig", "CodeFilesTask", "detect_code_format", "load_code_problems",
           "register_code_format"]

log = logging.getLogger(__name__)

Convert = Callable[[dict[str, Any], int, int], "CodeProblem | None"]
CODE_FORMATS: dict[str, tuple[Callable[[dict[str, Any]], bool], Convert]] = {}
"""Registered layouts, in detection order: name -> (detector, converter(row, index, max_tests))."""


def register_code_format(name: str, *, detect: Callable[[dict[str, Any]], bool]) -> Callable[[Convert], Convert]:
    """Register the decorated ``convert(row, index, max_tests) -> CodeProblem | None`` as layout ``name``."""
    def deco(convert: Convert) -> Convert:
        if name in CODE_FORMATS:
            raise ValueError(f"code file format {name!r} is already registered")
        CODE_FORMATS[name] = (detect, convert)
        return convert
    return deco


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _io(inputs: list[Any], outputs: list[Any], max_tests: int) -> IOTests:
    cases = tuple((str(i), str(o)) for i, o in zip(inputs, outputs, strict=False))
    if not cases:
        raise ValueError("no test cases")
    return IOTests(cases[:max_tests] if max_tests else cases)


def _cap(items: tuple[str, ...], max_tests: int) -> tuple[str, ...]:
    return items[:max_tests] if max_tests else items


@register_code_format("humaneval", detect=lambda r: {"prompt", "test", "entry_point"} <= r.keys())
def _humaneval(row: dict[str, Any], index: int, max_tests: int) -> CodeProblem:
    entry = str(row["entry_point"])
    return CodeProblem(str(row.get("task_id", index)), str(row["prompt"]),
                       CallTests((f"check({entry})",), setup=str(row["test"])), entry, prefix=str(row["prompt"]))


@register_code_format("mbpp", detect=lambda r: "test_list" in r and ("text" in r or "prompt" in r))
def _mbpp(row: dict[str, Any], index: int, max_tests: int) -> CodeProblem:
    tests = tuple(str(t) for t in row["test_list"])
    if not tests:
        raise ValueError("empty test_list")
    setup = "\n".join([str(row.get("test_setup_code") or ""), *map(str, row.get("test_imports") or [])]).strip()
    text = str(row.get("text") or row.get("prompt"))
    prompt = f"{text}\nYour code should pass this test:\n{tests[0]}"
    return CodeProblem(str(row.get("task_id", index)), prompt, CallTests(_cap(tests, max_tests), setup=setup))


@register_code_format("apps", detect=lambda r: "question" in r and "input_output" in r)
def _apps(row: dict[str, Any], index: int, max_tests: int) -> CodeProblem:
    io = _json(row["input_output"]) or {}
    pid = str(row.get("problem_id", index))
    if io.get("fn_name"):
        fn = str(io["fn_name"])
        asserts = tuple(f"assert {fn}(*{args!r}) == {out!r}" for args, out in zip(io["inputs"], io["outputs"],
                                                                                 strict=False))
        starter = str(row.get("starter_code") or "")
        return CodeProblem(pid, f"{row['question']}\n{starter}".strip(), CallTests(_cap(asserts, max_tests)), fn)
    return CodeProblem(pid, str(row["question"]), _io(io.get("inputs", []), io.get("outputs", []), max_tests))


@register_code_format("codecontests", detect=lambda r: "description" in r and "public_tests" in r)
def _codecontests(row: dict[str, Any], index: int, max_tests: int) -> CodeProblem:
    inputs: list[Any] = []
    outputs: list[Any] = []
    for key in ("public_tests", "private_tests", "generated_tests"):
        part = _json(row.get(key)) or {}
        inputs += list(part.get("input", []))
        outputs += list(part.get("output", []))
    return CodeProblem(str(row.get("name", index)), str(row["description"]), _io(inputs, outputs, max_tests))


def _lcb_cases(value: Any) -> list[dict[str, Any]]:
    try:
        cases = _json(value)
    except (json.JSONDecodeError, TypeError):
        return []  # compressed with pickle: never unpickled
    return [c for c in cases or [] if isinstance(c, dict)]


@register_code_format("livecodebench", detect=lambda r: "question_content" in r and "public_test_cases" in r)
def _livecodebench(row: dict[str, Any], index: int, max_tests: int) -> CodeProblem | None:
    cases = _lcb_cases(row["public_test_cases"]) + _lcb_cases(row.get("private_test_cases"))
    if any(c.get("testtype") == "functional" for c in cases):
        return None
    return CodeProblem(str(row.get("question_id", index)), str(row["question_content"]),
                       _io([c["input"] for c in cases], [c["output"] for c in cases], max_tests))


@register_code_format("plain", detect=lambda r: "tests" in r and ("prompt" in r or "question" in r))
def _plain(row: dict[str, Any], index: int, max_tests: int) -> CodeProblem:
    tests = list(row["tests"])
    prompt = str(row.get("prompt") or row.get("question"))
    pid = str(row.get("id", index))
    if tests and all(isinstance(t, str) for t in tests):
        return CodeProblem(pid, prompt, CallTests(_cap(tuple(tests), max_tests), setup=str(row.get("setup", ""))),
                           row.get("entry_point"))
    return CodeProblem(pid, prompt, _io([t["input"] for t in tests], [t["output"] for t in tests], max_tests))


def detect_code_format(row: Any, where: str = "row") -> str:
    """The first registered layout whose detector accepts ``row``; ValueError naming the keys otherwise."""
    if isinstance(row, dict):
        for name, (detect, _) in CODE_FORMATS.items():
            if detect(row):
                return name
    keys = sorted(row) if isinstance(row, dict) else type(row).__name__
    raise ValueError(f"{where}: no known code-problem layout matches a row with keys {keys}; name one with format= "
                     f"(one of {', '.join(CODE_FORMATS)}) or register your own with register_code_format")


def load_code_problems(source: str, fmt: str = "auto", *, max_tests: int = 0, skip_bad_rows: bool = False
                       ) -> list[CodeProblem]:
    """Read ``source`` into code problems.

    Args:
        source: A .jsonl / .json / .parquet file or dataset folder.
        fmt: A layout of :data:`CODE_FORMATS`, or "auto" (from the first row).
        max_tests: Most tests kept per problem; 0: all.
        skip_bad_rows: Skip rows that do not convert (one warning with the count) instead of failing.

    Returns:
        The problems, in file order.
    """
    if fmt != "auto" and fmt not in CODE_FORMATS:
        raise ValueError(f"unknown code file format {fmt!r}{did_you_mean(fmt, CODE_FORMATS)} "
                         f"(known: auto, {', '.join(CODE_FORMATS)})")
    out, skipped = [], 0
    for index, row in load_rows(source):
        if isinstance(row, BadLine):
            raise ValueError(f"{source}: row {index}: {row.reason}")
        name = detect_code_format(row, f"{source}: row {index}") if fmt == "auto" else fmt
        fmt = name
        try:
            problem = CODE_FORMATS[name][1](row, index, max_tests)
        except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
            if not skip_bad_rows:
                raise ValueError(f"{source}: row {index} is not a usable {name} row ({type(exc).__name__}: {exc}); "
                                 "fix it or set skip_bad_rows: true") from None
            problem = None
        if problem is None:
            skipped += 1
            continue
        out.append(problem)
    if skipped:
        log.warning("%s: skipped %d rows that are not usable %s rows", source, skipped, fmt)
    if not out:
        raise ValueError(f"{source}: no usable code problems")
    return out


def _question(code: CodeProblem) -> str:
    """The problem text: a function to complete is shown in a code block."""
    return f"Complete this Python function.\n\n```python\n{code.prompt}```" if code.prefix else code.prompt


@dataclass(kw_only=True)
class CodeFilesConfig(CodeScoring):
    """Where the code problems come from."""

    train_path: str | None = None
    """Train problems: .jsonl/.json/.parquet file or dataset folder in one of the layouts above."""
    test_path: str | None = None
    """Held-out problems, same forms."""
    format: str = "auto"
    """Layout of the files: auto (detected from the first row) or one of CODE_FORMATS."""
    max_tests: int = 0
    """Most hidden tests kept per problem; 0: all."""
    skip_bad_rows: bool = False
    """Skip rows that do not convert (one warning with the count); else the first one fails the load."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.format != "auto" and self.format not in CODE_FORMATS:
            raise ValueError(f"format {self.format!r}{did_you_mean(self.format, CODE_FORMATS)} must be auto or one of "
                             f"{', '.join(CODE_FORMATS)}")
        if self.max_tests < 0:
            raise ValueError(f"max_tests {self.max_tests} must be >= 0 (0: all)")


@register_task("code_files", config=CodeFilesConfig, smoke=smoke_as_pyfunc)
class CodeFilesTask(CodeTaskBase):
    """Code problems from the user's files (HumanEval/MBPP call tests, APPS/CodeContests/LiveCodeBench I/O)."""

    name = "code_files"

    def __init__(self, cfg: CodeFilesConfig | dict | None = None) -> None:
        self.cfg: CodeFilesConfig = config_from(CodeFilesConfig, cfg)
        if not (self.cfg.train_path or self.cfg.test_path):
            raise ValueError("task code_files needs train_path or test_path (a code-problem file)")
        self._splits: dict[str, list[Problem]] = {}

    def problems(self, split: str) -> list[Problem]:
        """The problems of ``split``'s file; ValueError when that path is not set."""
        if check_split(split) not in self._splits:
            path = self.cfg.train_path if split == "train" else self.cfg.test_path
            if not path:
                raise ValueError(f"task code_files has no {split}_path; set task.code_files.{split}_path")
            codes = load_code_problems(path, self.cfg.format, max_tests=self.cfg.max_tests,
                                       skip_bad_rows=self.cfg.skip_bad_rows)
            self._splits[split] = [Problem(f"{split}-{c.id}", _question(c), "", {"code": c}) for c in codes]
        return self._splits[split]
