"""teamrl eval: untrained and from a checkpoint, on real benchmarks, and format_eval's table."""

from __future__ import annotations

import json

import pytest

from teamrl.cli import main
from teamrl.study.evaluate import format_eval
from tests.study.runs import TINY


def test_environment_rows_show_success_rate_and_turns():
    results = {"checkpoint": "untrained", "k": 1, "benchmarks": {
        "plan_path": {"avg@n": 0.25, "pass@1": 0.25, "n": 1, "problems": 4, "success_rate": 0.25, "avg_turns": 2.5},
        "arith": {"avg@n": 0.5, "pass@1": 0.5, "n": 1, "problems": 4}}}
    text = format_eval(results)
    assert "| environment | success rate | average turns |" in text
    assert "| plan_path | 0.250 | 2.50 |" in text and "| arith | 0.250" not in text
    assert "average turns" not in format_eval({**results, "benchmarks": {"arith": results["benchmarks"]["arith"]}})


def test_eval_command_untrained_and_from_a_checkpoint(tmp_path, tiny_model_dir):
    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(3)))
    train_dir = tmp_path / "trained"
    assert main(["train", f"run_dir={train_dir}", f"models.main.path={tiny_model_dir}", *TINY,
                 "eval.before=false", "eval.after=false"]) == 0
    for which in (["--untrained"], ["--checkpoint", str(train_dir)]):
        out = tmp_path / ("eval_" + which[0].strip("-"))
        rc = main(["eval", f"models.main.path={tiny_model_dir}", *TINY, *which, "--benchmarks", f"tiny={bench}",
                   "--k", "2", "--samples", "3", "--out", str(out)])
        assert rc == 0
        result = json.loads((out / "eval.json").read_text())
        r = result["benchmarks"]["tiny"]
        assert (r["problems"], r["n"]) == (2, 3) and {"avg@n", "pass@1", "pass@2", "pass@3"} <= r.keys()
        assert result["checkpoint"] == (str(train_dir) if which[0] == "--checkpoint" else "untrained")
    assert main(["eval", f"models.main.path={tiny_model_dir}", *TINY, "--untrained", "--k", "3", "--samples", "2",
                 "--out", str(tmp_path / "bad")]) == 2


def test_eval_on_real_benchmarks(tmp_path, tiny_model_dir):
    from tests.conftest import shared_data

    data = shared_data()
    paths = {n: data / n / "test.jsonl" for n in ("gsm8k", "math500", "aime24", "aime25", "amc23", "olympiadbench")}
    if not all(p.is_file() for p in paths.values()):
        pytest.skip(f"benchmark data not found under {data} (set TEAMRL_DATA)")
    out = tmp_path / "eval"
    spec = ",".join(f"{n}={p}" for n, p in paths.items())
    single = [t for t in TINY if not t.startswith("agents.verifier.")]  # one agent: the verifier's settings go
    assert main(["eval", f"models.main.path={tiny_model_dir}", *single, "eval.problems=1", "workflow.name=single",
                 "--untrained", "--benchmarks", spec, "--k", "1", "--out", str(out)]) == 0
    result = json.loads((out / "eval.json").read_text())["benchmarks"]
    assert set(result) == set(paths) and all(r["problems"] == 1 for r in result.values())
