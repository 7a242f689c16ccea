"""teamrl ablate: the resumable grid of presets and seeds, run in process or as jobs."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from teamrl.cli import main
from teamrl.study.ablate import CellsFailed, Job, ablate, grid, parse_presets, parse_seeds, run_jobs, run_state
from teamrl.study.evaluate import parse_benchmarks
from teamrl.study.report import (
    comparison,
    load_run,
)
from tests.study.runs import TINY, fake_run


def test_ablate_skips_finished_runs_and_resumes_interrupted_ones(tmp_path):
    out = tmp_path / "grid"
    fake_run(out / "grpo_seed0", "grpo", 0, [0.1], [1.0], 0.5, 0)  # finished
    ckpt = out / "grpo_seed1" / "checkpoints"
    (ckpt / "step_1").mkdir(parents=True)
    (ckpt / "step_1" / "trainer.safetensors").write_bytes(b"")
    (ckpt / "latest").write_text("step_1")  # interrupted after a checkpoint
    assert [run_state(out / n) for n in ("grpo_seed0", "grpo_seed1", "drmas_seed0")] == ["done", "resume", "new"]
    calls = []

    def fake_train(cfg, resume):
        calls.append((cfg.algo.estimator, cfg.train.seed, resume, cfg.run_dir))
        run = out / f"{cfg.algo.estimator}_seed{cfg.train.seed}"
        run.mkdir(parents=True, exist_ok=True)
        (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "rollout/reward_mean": 0.5}) + "\n")
        (run / "summary.json").write_text("{}")

    report = ablate(None, ["grpo", "drmas"], 2, ["train.steps=1"], out, train=fake_train)
    assert [c[:3] for c in calls] == [("grpo", 1, True), ("drmas", 0, False), ("drmas", 1, False)]
    assert calls[0][3] == str(out / "grpo_seed1") and report == out / "report.html"
    calls.clear()
    ablate(None, ["grpo", "drmas"], 2, ["train.steps=1"], out, train=fake_train)
    assert calls == []  # everything finished: nothing reruns


def test_ablate_arguments_are_checked(tmp_path, capsys):
    assert parse_presets("grpo,drmas") == ["grpo", "drmas"]
    assert main(["ablate", "--presets", "drmas", "--k", "8", "--out", str(tmp_path / "g")]) == 2
    assert "error: --k and --samples set the evaluation of --benchmarks" in capsys.readouterr().err
    assert main(["ablate", "--presets", "drmas", "--baseline", "grpo", "--out", str(tmp_path / "g")]) == 2
    assert "error: --baseline 'grpo' is not among --presets (drmas)" in capsys.readouterr().err
    assert main(["ablate", "--presets", "drmas", "--benchmarks", f"gsm8k={tmp_path / 'none.jsonl'}",
                 "--out", str(tmp_path / "g")]) == 2
    assert f"error: --benchmarks gsm8k={tmp_path / 'none.jsonl'}: cannot be read (data file not found" in capsys.readouterr().err
    assert main(["ablate", "--presets", "drmas", "--benchmarks", "a=b.jsonl", "--k", "4", "--samples", "2",
                 "--out", str(tmp_path / "g")]) == 2
    assert "error: --k 4 must be between 1 and --samples 2" in capsys.readouterr().err
    assert not (tmp_path / "g").exists()  # all rejected before anything ran
    with pytest.raises(ValueError, match="--presets: unknown advantage estimator 'dr_mas'.*did you mean 'drmas'"):
        parse_presets("grpo,dr_mas")
    with pytest.raises(ValueError, match="--seeds 0"):
        grid(["grpo"], 0, tmp_path)
    with pytest.raises(ValueError, match="NAME=PATH"):
        parse_benchmarks(["gsm8k"])


def test_seeds_argument():
    assert parse_seeds("2") == [0, 1] and parse_seeds("5-7") == [5, 6, 7] and parse_seeds("1,3-4,3") == [1, 3, 4]
    for bad, message in (("0", "--seeds 0 must be >= 1"), ("x", "--seeds 'x' is not a number of seeds"),
                         ("4-2", "'4-2' is not a seed or an increasing range"), ("-1", "is not a number of seeds")):
        with pytest.raises(ValueError, match=re.escape(message)):
            parse_seeds(bad)
    assert [d.name for _, _, d in grid(["drmas"], [3, 4], Path("g"))] == ["drmas_seed3", "drmas_seed4"]


_JOB = """import json, sys, time
from pathlib import Path
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
(out / "start").write_text(repr(time.time())); time.sleep(float(sys.argv[2]))
print("hello from", out.name); (out / "end").write_text(repr(time.time())); sys.exit(int(sys.argv[3]))
"""


def test_run_jobs_runs_at_most_n_at_once_and_collects_exit_statuses(tmp_path):
    jobs = [Job(f"j{i}", [sys.executable, "-c", _JOB, str(tmp_path / f"j{i}"), "1.0", str(int(i == 2))],
                tmp_path / f"j{i}" / "train.log") for i in range(4)]
    status = run_jobs(jobs, 2, poll_s=0.05)
    assert status == {"j0": 0, "j1": 0, "j2": 1, "j3": 0}
    spans = [(float((tmp_path / f"j{i}" / "start").read_text()), float((tmp_path / f"j{i}" / "end").read_text()))
             for i in range(4)]
    most = max(sum(a <= t < b for a, b in spans) for t, _ in spans)
    assert most == 2  # two at a time, never more
    text = (tmp_path / "j2" / "train.log").read_text()
    assert text.startswith("=== ") and "hello from j2" in text
    with pytest.raises(ValueError, match="--jobs 0 must be >= 1"):
        run_jobs(jobs, 0)


_FAKE_TRAIN = """import json, sys
from pathlib import Path
args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
run = Path(args["run_dir"]); run.mkdir(parents=True, exist_ok=True)
print("argv", sys.argv[1:])
if args["algo.estimator"] == "drmas" and args["train.seed"] == "1":
    sys.exit("drmas seed 1 breaks")
(run / "metrics.jsonl").write_text(json.dumps({"step": 0, "rollout/reward_mean": 0.5}) + "\\n")
(run / "summary.json").write_text(json.dumps({"after": {"accuracy": 0.1 * int(args["train.seed"])}}))
"""


def test_ablate_jobs_runs_cells_as_processes_skips_finished_ones_and_reports_failures(tmp_path, monkeypatch):
    import teamrl.study.ablate as ablate_module

    out = tmp_path / "grid"
    fake_run(out / "grpo_seed0", "grpo", 0, [0.1], [1.0], 0.5, 0)  # finished: not run again
    ckpt = out / "grpo_seed1" / "checkpoints" / "step_1"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer.safetensors").write_bytes(b"")
    (ckpt.parent / "latest").write_text("step_1")  # interrupted after a checkpoint: resumes
    (out / "drmas_seed0").mkdir(parents=True)  # killed before its first checkpoint: starts again without its rows
    (out / "drmas_seed0" / "metrics.jsonl").write_text(json.dumps({"step": 0, "rollout/reward_mean": 9.0}) + "\n")
    commands = []

    def fake_command(config, overrides, *, resume, imports=(), allocator="tcmalloc"):
        commands.append((overrides[-1], resume, list(imports), allocator))
        return [sys.executable, "-c", _FAKE_TRAIN, *overrides, *(["--resume"] if resume else [])]

    monkeypatch.setattr(ablate_module, "train_command", fake_command)
    with pytest.raises(CellsFailed, match=r"1 job\(s\) of the grid of 4 runs failed: drmas_seed1 \(exit status 1, log .*drmas_seed1/train.log\)"):
        ablate(None, ["grpo", "drmas"], 2, ["train.steps=1"], out, jobs=3, imports=["x.py"], allocator="system")
    assert sorted(commands) == [(f"run_dir={out / 'drmas_seed0'}", False, ["x.py"], "system"),
                                (f"run_dir={out / 'drmas_seed1'}", False, ["x.py"], "system"),
                                (f"run_dir={out / 'grpo_seed1'}", True, ["x.py"], "system")]
    assert "drmas seed 1 breaks" in (out / "drmas_seed1" / "train.log").read_text()
    assert "--resume" in (out / "grpo_seed1" / "train.log").read_text()
    assert [json.loads(l)["rollout/reward_mean"] for l in (out / "drmas_seed0" / "metrics.jsonl").read_text().splitlines()] == [0.5]
    md = (out / "comparison.md").read_text()  # the report of the runs that finished
    assert "| grpo | 2 |" in md and "| drmas | 1 |" in md
    commands.clear()
    with pytest.raises(CellsFailed, match=r"1 job\(s\) of the grid of 4 runs failed: drmas_seed1"):
        ablate(None, ["grpo", "drmas"], 2, ["train.steps=1"], out, jobs=2)
    assert commands == [(f"run_dir={out / 'drmas_seed1'}", False, [], "tcmalloc")]  # only the failed one runs again


@pytest.mark.slow  # three training processes of its own (about 10 s)
def test_ablate_command_end_to_end_with_a_tiny_model(tmp_path, tiny_model_dir):
    """The grid in this process, then each trained run scored on a benchmark file (as teamrl eval does)."""
    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(3)))
    out = tmp_path / "ablate"
    rc = main(["ablate", "--presets", "grpo,drmas", "--seeds", "1", "--out", str(out), "--benchmarks", f"tiny={bench}",
               "--k", "2", f"models.main.path={tiny_model_dir}", *TINY])
    assert rc == 0
    for cell in ("grpo_seed0", "drmas_seed0"):
        result = json.loads((out / cell / "benchmarks" / "eval.json").read_text())
        assert result["checkpoint"] == str(out / cell) and result["k"] == 2
        assert (result["benchmarks"]["tiny"]["problems"], result["benchmarks"]["tiny"]["n"]) == (2, 2)  # eval.problems
    _, rows = comparison([load_run(out / "grpo_seed0"), load_run(out / "drmas_seed0")])
    assert rows[0]["tiny/avg@n"] == json.loads((out / "grpo_seed0" / "benchmarks" / "eval.json").read_text())[
        "benchmarks"]["tiny"]["avg@n"]
    assert "tiny/pass@2" in (out / "comparison.md").read_text()
    assert {"grpo_seed0", "drmas_seed0", "report.html", "comparison.md", "comparison.csv", "reward.png",
            "grad_norm.png"} <= {p.name for p in out.iterdir()}
    assert json.loads((out / "drmas_seed0" / "summary.json").read_text())["grad_spikes"]["models"] == {"main": 0}
    assert yaml.safe_load((out / "grpo_seed0" / "config.yaml").read_text())["algo"]["estimator"] == "grpo"


@pytest.mark.slow
def test_ablate_jobs_end_to_end_with_a_tiny_model(tmp_path, tiny_model_dir):
    """Two cells trained at once as teamrl train processes, with held-out curves, then a second grid folder with
    other seeds merged into one report."""
    a, b = tmp_path / "a", tmp_path / "b"
    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(3)))
    common = [f"models.main.path={tiny_model_dir}", *TINY, "train.steps=2", "eval.every=1", "train.threads=1"]
    assert main(["ablate", "--jobs", "2", "--presets", "grpo,drmas", "--seeds", "1", "--out", str(a), *common,
                 "--benchmarks", f"tiny={bench}", "--k", "1"]) == 0
    for cell in ("grpo_seed0", "drmas_seed0"):  # scored by a teamrl eval process
        assert json.loads((a / cell / "benchmarks" / "eval.json").read_text())["checkpoint"] == str(a / cell)
        assert "weights: " + str(a / cell) in (a / cell / "eval.log").read_text()
    for cell in ("grpo_seed0", "drmas_seed0"):
        text = (a / cell / "train.log").read_text()  # the command, then the run's own output
        assert text.startswith("=== ") and f"run directory: {a / cell}" in text
        rows = [json.loads(l) for l in (a / cell / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if "eval/accuracy" in r] == [0, 1, 2]
    assert (a / "eval.png").is_file()
    assert main(["ablate", "--presets", "grpo,drmas", "--seeds", "1-1", "--out", str(b), *common]) == 0
    assert main(["report", *map(str, sorted(a.glob("*_seed*"))), *map(str, sorted(b.glob("*_seed*"))),
                 "--out", str(tmp_path / "both")]) == 0
    md = (tmp_path / "both" / "comparison.md").read_text()
    assert "| grpo | 2 |" in md and "| drmas − grpo | 2 | none |" in md
