"""format_eval: environment tasks add their success rate and average turns."""

from __future__ import annotations

from teamrl.study.evaluate import format_eval


def test_environment_rows_show_success_rate_and_turns():
    results = {"checkpoint": "untrained", "k": 1, "benchmarks": {
        "plan_path": {"avg@n": 0.25, "pass@1": 0.25, "n": 1, "problems": 4, "success_rate": 0.25, "avg_turns": 2.5},
        "arith": {"avg@n": 0.5, "pass@1": 0.5, "n": 1, "problems": 4}}}
    text = format_eval(results)
    assert "| environment | success rate | average turns |" in text
    assert "| plan_path | 0.250 | 2.50 |" in text and "| arith | 0.250" not in text
    assert "average turns" not in format_eval({**results, "benchmarks": {"arith": results["benchmarks"]["arith"]}})
