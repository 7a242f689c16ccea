"""``teamrl eval`` needs only the test split; ``teamrl train`` needs the train split and says so."""

from __future__ import annotations

import json

import pytest

from teamrl.cli import main
from tests.conftest import shared_data

TINY = ["rollout.batch_size=2", "rollout.group_size=2", "train.steps=1", "eval.samples=1",
        "agents.solver.max_new_tokens=4", "workflow.name=single"]


def _test_only_file(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(3)))
    return path


def test_eval_with_only_a_test_file(tmp_path, tiny_model_dir):
    test = _test_only_file(tmp_path)
    out = tmp_path / "eval"
    rc = main(["eval", f"models.main.path={tiny_model_dir}", *TINY, "task.name=math", f"task.math.test_path={test}",
               "--untrained", "--k", "1", "--out", str(out)])
    assert rc == 0
    benchmarks = json.loads((out / "eval.json").read_text())["benchmarks"]
    assert list(benchmarks) == [f"{tmp_path.name}/test.jsonl"]  # named after the test file
    result = benchmarks[f"{tmp_path.name}/test.jsonl"]
    assert (result["problems"], result["n"]) == (3, 1)


def test_train_without_a_train_file_says_so(tmp_path, tiny_model_dir, capsys):
    test = _test_only_file(tmp_path)
    rc = main(["train", f"models.main.path={tiny_model_dir}", *TINY, "task.name=math", f"task.math.test_path={test}",
               f"run_dir={tmp_path / 'run'}", "eval.before=true"])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("error: math task has no train_path (training needs the train split); set task.math.train_path "
                       "to a data file, a dataset folder or a Hugging Face dataset id")
    assert not (tmp_path / "run" / "eval_before.json").exists()  # failed before evaluating anything


def test_eval_with_only_a_shared_test_split(tmp_path, tiny_model_dir):
    test = shared_data() / "gsm8k" / "test.jsonl"
    if not test.is_file():
        pytest.skip(f"{test} is not present (set TEAMRL_DATA)")
    out = tmp_path / "eval"
    rc = main(["eval", f"models.main.path={tiny_model_dir}", *TINY, "task.name=math", f"task.math.test_path={test}",
               "eval.problems=2", "--untrained", "--k", "1", "--out", str(out)])
    assert rc == 0
    assert json.loads((out / "eval.json").read_text())["benchmarks"]["gsm8k/test.jsonl"]["problems"] == 2
