"""Study tooling: reports from run directories, the resumable ablation grid, and evaluation."""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
import sys
from pathlib import Path

import pytest
import yaml

from teamrl.cli import main
from teamrl.study.ablate import CellsFailed, Job, ablate, grid, parse_presets, parse_seeds, run_jobs, run_state
from teamrl.study.evaluate import parse_benchmarks
from teamrl.study.report import (
    comparison,
    curve,
    dedupe,
    load_run,
    paired_comparison,
    run_rows,
    table_markdown,
    write_report,
)
from teamrl.study.stats import t_quantile


def _fake_run(path, estimator, seed, rewards, norms, accuracy, spikes, duplicate_last=False):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump({"algo": {"estimator": estimator}, "train": {"seed": seed}}))
    rows = [{"step": i, "rollout/reward_mean": r, "agent/solver/grad_norm": n, "agent/solver/amplification": 1.0,
             "agent/solver/grad_spikes": float(spikes), "perf/step_s": 2.0} for i, (r, n) in enumerate(zip(rewards, norms))]
    if duplicate_last:  # a resumed run logs the steps after its checkpoint again; the last entry wins
        rows.insert(-1, {**rows[-1], "agent/solver/grad_norm": 1000.0})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"after": {"accuracy": accuracy}, "grad_spikes": {"agents": {"solver": spikes}, "models": {"main": 0}}}
    (path / "summary.json").write_text(json.dumps(summary))


def test_comparison_table_by_hand(tmp_path):
    _fake_run(tmp_path / "drmas_seed0", "drmas", 0, [0.1, 0.2, 0.3], [1.0, 3.0, 2.0], 0.5, 1, duplicate_last=True)
    _fake_run(tmp_path / "drmas_seed1", "drmas", 1, [0.3, 0.4, 0.5], [2.0, 6.0, 4.0], 0.7, 3)
    _fake_run(tmp_path / "grpo_seed0", "grpo", 0, [0.0, 0.0, 0.1], [5.0, 5.0, 5.0], 0.2, 0)
    runs = [load_run(tmp_path / n) for n in ("drmas_seed0", "drmas_seed1", "grpo_seed0")]
    assert [m["agent/solver/grad_norm"] for m in runs[0].metrics] == [1.0, 3.0, 2.0]
    columns, rows = comparison(runs)
    assert columns == ["final_accuracy", "grad_norm_max/solver", "grad_norm_median/solver", "spikes/solver", "wall_s"]
    drmas, grpo = rows
    assert (drmas["label"], drmas["runs"], grpo["label"], grpo["runs"]) == ("drmas", 2, "grpo", 1)
    assert drmas["final_accuracy"] == pytest.approx(0.6)
    assert drmas["final_accuracy:se"] == pytest.approx(math.sqrt(0.02) / math.sqrt(2))  # std 0.1414 / sqrt 2 = 0.1
    assert drmas["grad_norm_max/solver"] == pytest.approx(4.5)  # max 3 and 6
    assert drmas["grad_norm_median/solver"] == pytest.approx(3.0)  # medians 2 and 4
    assert drmas["spikes/solver"] == 2.0 and drmas["wall_s"] == 6.0
    assert grpo["final_accuracy:se"] == 0.0


def test_held_out_pass_at_k_and_answer_metrics_are_columns(tmp_path):
    """pass@k of the largest k and the task's answer metrics (search: em, f1) are averaged like accuracy; a run
    that lacks one (evaluated with one sample) counts as missing, not as 0."""
    for seed, (p4, em) in enumerate([(0.5, 0.1), (0.7, 0.3)]):
        _fake_run(tmp_path / f"drmas_seed{seed}", "drmas", seed, [0.1], [1.0], 0.2, 0)
        s = json.loads((tmp_path / f"drmas_seed{seed}" / "summary.json").read_text())
        s["after"] |= {"pass@1": 0.2, "pass@2": 0.3, "pass@4": p4, "metrics": {"em": em, "f1": 2 * em}}
        (tmp_path / f"drmas_seed{seed}" / "summary.json").write_text(json.dumps(s))
    _fake_run(tmp_path / "grpo_seed0", "grpo", 0, [0.1], [1.0], 0.2, 0)
    columns, rows = comparison([load_run(tmp_path / n) for n in ("drmas_seed0", "drmas_seed1", "grpo_seed0")])
    assert columns[:4] == ["final_accuracy", "final_pass@4", "final_em", "final_f1"]
    drmas, grpo = rows
    assert drmas["final_pass@4"] == pytest.approx(0.6) and drmas["final_em"] == pytest.approx(0.2)
    assert drmas["final_f1"] == pytest.approx(0.4)
    assert math.isnan(grpo["final_pass@4"])


def test_report_writes_table_plots_and_html(tmp_path):
    for seed in range(2):
        _fake_run(tmp_path / f"drmas_seed{seed}", "drmas", seed, [0.1 * seed, 0.3, 0.6], [1.0, 2.0 + seed, 1.5], 0.5, 0)
    _fake_run(tmp_path / "grpo_seed0", "grpo", 0, [0.2, 0.2, 0.3], [2.0, 9.0, 2.5], 0.4, 1)
    report = write_report([tmp_path / "drmas_seed0", tmp_path / "drmas_seed1", tmp_path / "grpo_seed0"], tmp_path / "out")
    out = tmp_path / "out"
    html = report.read_text()
    for png in ("reward.png", "grad_norm.png", "amplification.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f'src="{png}"' in html
    assert "drmas" in html and "0.500 ± 0.000" in html
    rows = list(csv.DictReader((out / "comparison.csv").open()))
    assert [r["run"] for r in rows] == ["drmas", "grpo"] and float(rows[1]["spikes/solver"]) == 1.0
    assert "| drmas | 2 |" in (out / "comparison.md").read_text()


def test_table_cells_are_95_percent_t_intervals(tmp_path):
    for seed, acc in enumerate([0.1, 0.2, 0.6]):
        _fake_run(tmp_path / f"drmas_seed{seed}", "drmas", seed, [0.1], [1.0], acc, 0)
    _fake_run(tmp_path / "grpo_seed0", "grpo", 0, [0.1], [1.0], 0.25, 0)
    runs = [load_run(tmp_path / n) for n in ("drmas_seed0", "drmas_seed1", "drmas_seed2", "grpo_seed0")]
    _, (drmas, grpo) = comparison(runs)
    sd = statistics.stdev([0.1, 0.2, 0.6])
    t = 0.95 / math.sqrt(2 * 0.975 * 0.025)  # t_{0.975, 2}
    assert drmas["final_accuracy:ci"].mean == pytest.approx(0.3)
    assert drmas["final_accuracy:ci"].half == pytest.approx(t * sd / math.sqrt(3))
    assert math.isnan(grpo["final_accuracy:ci"].half)
    md = table_markdown(["final_accuracy"], [drmas, grpo])
    assert f"| drmas | 3 | 0.300 ± {t * sd / math.sqrt(3):.3f} |" in md
    assert "| grpo | 1 | 0.250 (n=1: no interval) |" in md


def test_paired_comparison_pairs_by_seed_and_reports_missing_pairs(tmp_path):
    accs = {"grpo": {0: 0.2, 1: 0.3, 2: 0.1, 4: 0.5}, "drmas": {0: 0.4, 1: 0.4, 2: 0.4, 3: 0.9}}
    for label, by_seed in accs.items():
        for seed, acc in by_seed.items():
            _fake_run(tmp_path / f"{label}_seed{seed}", label, seed, [0.1], [1.0], acc, 0)
    runs = [load_run(d) for d in sorted(tmp_path.iterdir())]
    _, (drmas,) = paired_comparison(runs, "grpo")
    assert (drmas["pairs"], drmas["no_baseline"], drmas["baseline_only"]) == ([0, 1, 2], [3], [4])
    diffs = [0.2, 0.1, 0.3]
    t = 0.95 / math.sqrt(2 * 0.975 * 0.025)
    assert drmas["final_accuracy"].mean == pytest.approx(0.2)
    assert drmas["final_accuracy"].half == pytest.approx(t * statistics.stdev(diffs) / math.sqrt(3))
    assert drmas["wall_s"].mean == 0.0  # same wall time in every run
    write_report(sorted(tmp_path.iterdir()), tmp_path / "out")
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "## Paired differences against grpo" in md
    assert "| drmas − grpo | 3 | no grpo run for seed 3; no drmas run for seed 4 | +0.200 [" in md
    paired = list(csv.DictReader((tmp_path / "out" / "paired.csv").open()))
    row = next(r for r in paired if r["metric"] == "final_accuracy")
    assert (row["run"], row["baseline"], row["pairs"]) == ("drmas", "grpo", "3")
    assert float(row["mean_diff"]) == pytest.approx(0.2) and row["seeds_without_baseline"] == "3"
    assert float(row["ci95_high"]) - float(row["ci95_low"]) == pytest.approx(2 * drmas["final_accuracy"].half)


def test_paired_comparison_baseline_absent_or_named_wrong(tmp_path):
    _fake_run(tmp_path / "drmas_seed0", "drmas", 0, [0.1], [1.0], 0.5, 0)
    write_report([tmp_path / "drmas_seed0"], tmp_path / "out")
    assert "no paired comparison: no run is labelled 'grpo' (labels: drmas)" in (tmp_path / "out" / "comparison.md").read_text()
    assert not (tmp_path / "out" / "paired.csv").exists()
    with pytest.raises(ValueError, match=r"--baseline 'agent_episode': no run is labelled so \(labels: drmas\)"):
        write_report([tmp_path / "drmas_seed0"], tmp_path / "out", baseline="agent_episode", require_baseline=True)


def test_report_command_baseline_option(tmp_path, capsys):
    for label in ("drmas", "agent_episode"):
        _fake_run(tmp_path / f"{label}_seed0", label, 0, [0.1], [1.0], 0.5, 0)
    runs = [str(tmp_path / "drmas_seed0"), str(tmp_path / "agent_episode_seed0")]
    assert main(["report", *runs, "--out", str(tmp_path / "out"), "--baseline", "grpo"]) == 2
    assert "error: --baseline 'grpo': no run is labelled so (labels: drmas, agent_episode)" in capsys.readouterr().err
    assert main(["report", *runs, "--out", str(tmp_path / "out"), "--baseline", "agent_episode"]) == 0
    assert "| drmas − agent_episode | 1 | none |" in (tmp_path / "out" / "comparison.md").read_text()


def test_runs_from_several_folders_merge_and_duplicates_count_once(tmp_path):
    """Grids run on two machines: the same label from two folders is more seeds; a (label, seed) given twice
    is one run: the finished copy is kept, the other listed."""
    _fake_run(tmp_path / "a" / "drmas_seed0", "drmas", 0, [0.1], [1.0], 0.2, 0)
    _fake_run(tmp_path / "b" / "drmas_seed1", "drmas", 1, [0.1], [1.0], 0.4, 0)
    _fake_run(tmp_path / "b" / "drmas_seed0", "drmas", 0, [0.1, 0.2], [1.0, 1.0], 0.9, 0)
    (tmp_path / "b" / "drmas_seed0" / "summary.json").unlink()  # an unfinished copy of a's seed 0
    dirs = [tmp_path / "b" / "drmas_seed0", tmp_path / "a" / "drmas_seed0", tmp_path / "b" / "drmas_seed1"]
    runs, dropped = dedupe([load_run(d) for d in dirs])
    assert [r.path for r in runs] == dirs[1:] and [(d.path, k.path) for d, k in dropped] == [(dirs[0], dirs[1])]
    _, (row,) = comparison(runs)
    assert row["runs"] == 2 and row["final_accuracy"] == pytest.approx(0.3)
    write_report(dirs, tmp_path / "out")
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "| drmas | 2 |" in md
    assert f"duplicate (label, seed) (drmas, 0): {dirs[0]} left out, {dirs[1]} kept" in md


def test_held_out_curves_and_multi_call_rates_are_reported(tmp_path):
    for seed in range(2):
        run = tmp_path / f"grpo_seed{seed}"
        _fake_run(run, "grpo", seed, [0.1, 0.2, 0.3], [1.0, 1.0, 1.0], 0.5, 0)
        rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
        rows = [{**r, "agent/solver/multi_call_rate": 0.25 * (seed + 1)} for r in rows]
        evals = [{"step": k, "eval/accuracy": 0.1 * k + 0.1 * seed, "eval/pass@2": 0.2} for k in (0, 2, 3)]
        lines = [rows[0], evals[0], rows[1], rows[2], evals[1], evals[2]]  # eval rows share steps with training rows
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    runs = [load_run(tmp_path / f"grpo_seed{s}") for s in range(2)]
    assert runs[0].metrics[2] == {**rows[2], "step": 2, "eval/accuracy": 0.2, "eval/pass@2": 0.2,
                                  "agent/solver/multi_call_rate": 0.25}  # the two rows of step 2, merged
    assert runs[0].trained_steps == 3
    steps, mean, half = curve(runs, "eval/accuracy")
    assert steps == [0, 2, 3] and mean == pytest.approx([0.05, 0.25, 0.35])
    assert half[0] == pytest.approx(12.7062047362 * statistics.stdev([0.0, 0.1]) / math.sqrt(2))
    columns, (row,) = comparison(runs)
    assert "multi_call_rate/solver" in columns and row["multi_call_rate/solver"] == pytest.approx(0.375)
    report = write_report([tmp_path / f"grpo_seed{s}" for s in range(2)], tmp_path / "out")
    html = report.read_text()
    for png in ("eval.png", "multi_call.png"):
        assert (tmp_path / "out" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f'src="{png}"' in html


def test_report_rejects_a_folder_that_is_not_a_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        write_report([tmp_path], tmp_path / "out")


def test_ablate_skips_finished_runs_and_resumes_interrupted_ones(tmp_path):
    out = tmp_path / "grid"
    _fake_run(out / "grpo_seed0", "grpo", 0, [0.1], [1.0], 0.5, 0)  # finished
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
    _fake_run(out / "grpo_seed0", "grpo", 0, [0.1], [1.0], 0.5, 0)  # finished: not run again
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


TINY = ["rollout.batch_size=2", "rollout.group_size=2", "train.steps=1", "eval.problems=2", "eval.samples=2",
        "agents.solver.max_new_tokens=4", "agents.verifier.max_new_tokens=3", "task.arith.n_test=10"]


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
    assert main(["eval", f"models.main.path={tiny_model_dir}", *TINY, "eval.problems=1", "workflow.name=single",
                 "--untrained", "--benchmarks", spec, "--k", "1", "--out", str(out)]) == 0
    result = json.loads((out / "eval.json").read_text())["benchmarks"]
    assert set(result) == set(paths) and all(r["problems"] == 1 for r in result.values())


def test_report_says_how_many_seeds_a_difference_would_need(tmp_path):
    """Three paired seeds with accuracy differences +0.1, 0.0, +0.2 (sd 0.1): detecting 0.05 at 80% power needs
    the paired t test's n for d_z = 0.5, 34 seeds."""
    for seed, (a, b) in enumerate([(0.3, 0.2), (0.2, 0.2), (0.5, 0.3)]):
        _fake_run(tmp_path / f"drmas_seed{seed}", "drmas", seed, [0.1], [1.0], a, 0)
        _fake_run(tmp_path / f"grpo_seed{seed}", "grpo", seed, [0.1], [1.0], b, 0)
    write_report(sorted(tmp_path.glob("*_seed*")), tmp_path / "out")
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "drmas − grpo: the per-seed differences in final_accuracy have sd 0.100" in md
    assert "needs 34 seeds" in md and md.count("needs 34 seeds") == 1


def test_the_2x2_effects_by_hand(tmp_path):
    """Two seeds of the four presets: per seed, per-agent statistics = mean of its two simple effects, per-call
    counting likewise, interaction = difference of the simple effects; the report's table and effects.csv."""
    acc = {0: {"grpo": 0.2, "grpo_step": 0.3, "agent_episode": 0.25, "drmas": 0.45},
           1: {"grpo": 0.3, "grpo_step": 0.3, "agent_episode": 0.35, "drmas": 0.45}}
    for seed, cells in acc.items():
        for preset, a in cells.items():
            _fake_run(tmp_path / f"{preset}_seed{seed}", preset, seed, [0.1], [1.0], a, 0)
    _fake_run(tmp_path / "drmas_seed2", "drmas", 2, [0.1], [1.0], 0.9, 0)  # no other preset at seed 2: left out
    runs = [load_run(p) for p in sorted(tmp_path.glob("*_seed*"))]
    from teamrl.study.effects import factorial_effects

    effects, seeds = factorial_effects(runs, *run_rows(runs))
    assert seeds == [0, 1]
    by = {r["effect"]: r["final_accuracy"] for r in effects}
    # seed 0: agent (0.05 + 0.15) / 2 = 0.10, call (0.10 + 0.20) / 2 = 0.15, interaction 0.15 - 0.05 = 0.10
    # seed 1: agent (0.05 + 0.15) / 2 = 0.10, call (0.00 + 0.10) / 2 = 0.05, interaction 0.15 - 0.05 = 0.10
    assert by["per-agent statistics"].mean == pytest.approx(0.10) and by["per-agent statistics"].half == pytest.approx(0)
    assert by["per-call counting"].mean == pytest.approx(0.10)
    assert by["per-call counting"].half == pytest.approx(t_quantile(0.975, 1) * statistics.stdev([0.15, 0.05]) / math.sqrt(2))
    assert by["interaction"].mean == pytest.approx(0.10)
    write_report(sorted(tmp_path.glob("*_seed*")), tmp_path / "out")
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "## The 2×2 grid: main effects and interaction (2 seeds: 0,1)" in md
    rows = list(csv.DictReader((tmp_path / "out" / "effects.csv").open()))
    row = next(r for r in rows if r["effect"] == "per-call counting" and r["metric"] == "final_accuracy")
    assert float(row["mean"]) == pytest.approx(0.10) and row["seeds"] == "0,1"
    assert "main effects and interaction" in (tmp_path / "out" / "report.html").read_text()


def test_no_effects_without_the_whole_grid(tmp_path):
    for preset in ("grpo", "drmas"):
        _fake_run(tmp_path / f"{preset}_seed0", preset, 0, [0.1], [1.0], 0.2, 0)
    write_report(sorted(tmp_path.glob("*_seed*")), tmp_path / "out")
    assert "2×2" not in (tmp_path / "out" / "comparison.md").read_text()
    assert not (tmp_path / "out" / "effects.csv").exists()


def test_a_torn_last_metrics_line_is_left_out_of_a_report_and_a_damaged_one_named(tmp_path, caplog):
    _fake_run(tmp_path / "grpo_seed0", "grpo", 0, [0.1, 0.2], [1.0, 2.0], 0.5, 0)
    metrics = tmp_path / "grpo_seed0" / "metrics.jsonl"
    with metrics.open("a") as f:
        f.write('{"step": 2, "rollout/rew')  # a run killed mid-append
    with caplog.at_level("WARNING"):
        assert len(load_run(tmp_path / "grpo_seed0").metrics) == 2
    assert f"{metrics} line 3: left out a torn last line" in caplog.text
    metrics.write_text(metrics.read_text() + '\n{"step": 3}\n')
    with pytest.raises(ValueError, match=rf"{metrics} line 3 is not a JSON row"):
        load_run(tmp_path / "grpo_seed0")
def test_mismatch_metrics_are_reported(tmp_path):
    for seed in range(2):
        run = tmp_path / f"grpo_seed{seed}"
        _fake_run(run, "grpo", seed, [0.1, 0.2], [1.0, 1.0], 0.5, 0)
        rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
        rows = [{**r, "mismatch/solver/kl_k3": 0.01 * (i + 1) * (seed + 1), "mismatch/solver/ratio_max": 1.5 + i,
                 "mismatch/model/main/kl_k3": 0.5} for i, r in enumerate(rows)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    columns, (row,) = comparison([load_run(tmp_path / f"grpo_seed{s}") for s in range(2)])
    assert "mismatch_kl_k3/solver" in columns and "mismatch_kl_k3/model" not in columns
    assert row["mismatch_kl_k3/solver"] == pytest.approx((0.015 + 0.03) / 2)  # seed means 0.015 and 0.03
    assert row["mismatch_ratio_max/solver"] == pytest.approx(2.5)  # max 1.5 and 2.5 in both seeds
    report = write_report([tmp_path / f"grpo_seed{s}" for s in range(2)], tmp_path / "out")
    assert (tmp_path / "out" / "mismatch.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 'src="mismatch.png"' in report.read_text()
