"""Code-problem files in the layouts users bring, detected and read, then scored in the sandbox."""

from __future__ import annotations

import base64
import json
import pickle
import shutil
import zlib

import pytest

from teamrl.domains.code.code import CallTests, IOTests
from teamrl.domains.code.code_files import detect_code_format, load_code_problems
from teamrl.tasks.base import build_task

ROWS = {
    "humaneval": {"task_id": "H/0", "prompt": "def inc(x):\n    \"\"\"x + 1\"\"\"\n", "canonical_solution": "",
                  "test": "def check(candidate):\n    assert candidate(1) == 2\n", "entry_point": "inc"},
    "mbpp": {"task_id": 2, "text": "Write inc(x) returning x + 1.", "code": "",
             "test_list": ["assert inc(1) == 2", "assert inc(-1) == 0"], "test_setup_code": ""},
    "apps": {"problem_id": 7, "question": "Read two numbers, print their sum.",
             "input_output": json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]})},
    "codecontests": {"name": "sum", "description": "Print a + b.", "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
                     "private_tests": {"input": ["3 4\n"], "output": ["7\n"]},
                     "generated_tests": {"input": [], "output": []}},
    "livecodebench": {"question_id": "1", "question_title": "sum", "question_content": "Print a + b.",
                      "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
                      "private_test_cases": json.dumps([{"input": "3 4\n", "output": "7\n", "testtype": "stdin"}])},
    "plain": {"id": "p", "prompt": "Print a + b.", "tests": [{"input": "1 2\n", "output": "3\n"}]},
}
RIGHT = {"humaneval": "def inc(x):\n    return x + 1", "mbpp": "def inc(x):\n    return x + 1",
         **dict.fromkeys(("apps", "codecontests", "livecodebench", "plain"), "a, b = map(int, input().split())\nprint(a + b)")}


def _write(tmp_path, name, rows):
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("layout", sorted(ROWS))
def test_each_layout_is_detected_and_read(tmp_path, layout):
    assert detect_code_format(ROWS[layout]) == layout
    (problem,) = load_code_problems(str(_write(tmp_path, layout, [ROWS[layout]])))
    kind = CallTests if layout in ("humaneval", "mbpp") else IOTests
    assert isinstance(problem.tests, kind)
    if layout in ("apps", "codecontests", "livecodebench"):
        assert problem.tests.cases == (("1 2\n", "3\n"), ("3 4\n", "7\n"))


def test_apps_with_fn_name_becomes_call_tests(tmp_path):
    row = {"question": "q", "input_output": json.dumps({"fn_name": "f", "inputs": [[1, 2]], "outputs": [3]})}
    (problem,) = load_code_problems(str(_write(tmp_path, "apps_fn", [row])))
    assert problem.tests == CallTests(("assert f(*[1, 2]) == 3",)) and problem.entry_point == "f"


def test_pickled_private_cases_are_never_unpickled(tmp_path):
    class Boom:
        def __reduce__(self):
            return (exec, ("raise SystemExit('unpickled')",))
    packed = base64.b64encode(zlib.compress(pickle.dumps(Boom()))).decode()
    row = {**ROWS["livecodebench"], "private_test_cases": packed}
    (problem,) = load_code_problems(str(_write(tmp_path, "lcb", [row])))
    assert problem.tests.cases == (("1 2\n", "3\n"),)  # the public case only


def test_unknown_rows_and_bad_rows_give_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match="no known code-problem layout matches a row with keys \\['foo'\\]"):
        load_code_problems(str(_write(tmp_path, "bad", [{"foo": 1}])))
    bad = {"task_id": 1, "text": "t", "test_list": []}
    with pytest.raises(ValueError, match="row 1 is not a usable mbpp row.*skip_bad_rows"):
        load_code_problems(str(_write(tmp_path, "mbpp_bad", [bad])))
    assert len(load_code_problems(str(_write(tmp_path, "mbpp_mixed", [bad, ROWS["mbpp"]])), skip_bad_rows=True)) == 1
    with pytest.raises(ValueError, match="did you mean 'mbpp'"):
        build_task("code_files", {"test_path": "x.jsonl", "format": "mbp"})
    with pytest.raises(ValueError, match="needs train_path or test_path"):
        build_task("code_files", {})


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_every_layout_scores_a_right_and_a_wrong_program(tmp_path):
    for layout, row in ROWS.items():
        task = build_task("code_files", {"test_path": str(_write(tmp_path, layout, [row])), "max_tests": 5})
        (problem,) = task.problems("test")
        assert task.score(problem, f"```python\n{RIGHT[layout]}\n```") == 1.0, layout
        assert task.score(problem, "```python\nprint(0)\ndef inc(x):\n    return x\n```") == 0.0, layout
        with pytest.raises(ValueError, match="no train_path"):
            task.problems("train")
