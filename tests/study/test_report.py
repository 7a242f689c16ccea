"""teamrl report: comparison tables with intervals, paired comparisons, curves, plots and the 2x2 effects, from run folders."""

from __future__ import annotations

import csv
import json
import math
import statistics

import pytest

from teamrl.cli import main
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
from tests.study.runs import fake_run


def test_comparison_table_by_hand(tmp_path):
    fake_run(tmp_path / "drmas_seed0", "drmas", 0, [0.1, 0.2, 0.3], [1.0, 3.0, 2.0], 0.5, 1, duplicate_last=True)
    fake_run(tmp_path / "drmas_seed1", "drmas", 1, [0.3, 0.4, 0.5], [2.0, 6.0, 4.0], 0.7, 3)
    fake_run(tmp_path / "grpo_seed0", "grpo", 0, [0.0, 0.0, 0.1], [5.0, 5.0, 5.0], 0.2, 0)
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
        fake_run(tmp_path / f"drmas_seed{seed}", "drmas", seed, [0.1], [1.0], 0.2, 0)
        s = json.loads((tmp_path / f"drmas_seed{seed}" / "summary.json").read_text())
        s["after"] |= {"pass@1": 0.2, "pass@2": 0.3, "pass@4": p4, "metrics": {"em": em, "f1": 2 * em}}
        (tmp_path / f"drmas_seed{seed}" / "summary.json").write_text(json.dumps(s))
    fake_run(tmp_path / "grpo_seed0", "grpo", 0, [0.1], [1.0], 0.2, 0)
    columns, rows = comparison([load_run(tmp_path / n) for n in ("drmas_seed0", "drmas_seed1", "grpo_seed0")])
    assert columns[:4] == ["final_accuracy", "final_pass@4", "final_em", "final_f1"]
    drmas, grpo = rows
    assert drmas["final_pass@4"] == pytest.approx(0.6) and drmas["final_em"] == pytest.approx(0.2)
    assert drmas["final_f1"] == pytest.approx(0.4)
    assert math.isnan(grpo["final_pass@4"])


def test_report_writes_table_plots_and_html(tmp_path):
    for seed in range(2):
        fake_run(tmp_path / f"drmas_seed{seed}", "drmas", seed, [0.1 * seed, 0.3, 0.6], [1.0, 2.0 + seed, 1.5], 0.5, 0)
    fake_run(tmp_path / "grpo_seed0", "grpo", 0, [0.2, 0.2, 0.3], [2.0, 9.0, 2.5], 0.4, 1)
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
        fake_run(tmp_path / f"drmas_seed{seed}", "drmas", seed, [0.1], [1.0], acc, 0)
    fake_run(tmp_path / "grpo_seed0", "grpo", 0, [0.1], [1.0], 0.25, 0)
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
            fake_run(tmp_path / f"{label}_seed{seed}", label, seed, [0.1], [1.0], acc, 0)
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
    fake_run(tmp_path / "drmas_seed0", "drmas", 0, [0.1], [1.0], 0.5, 0)
    write_report([tmp_path / "drmas_seed0"], tmp_path / "out")
    assert "no paired comparison: no run is labelled 'grpo' (labels: drmas)" in (tmp_path / "out" / "comparison.md").read_text()
    assert not (tmp_path / "out" / "paired.csv").exists()
    with pytest.raises(ValueError, match=r"--baseline 'agent_episode': no run is labelled so \(labels: drmas\)"):
        write_report([tmp_path / "drmas_seed0"], tmp_path / "out", baseline="agent_episode", require_baseline=True)


def test_report_command_baseline_option(tmp_path, capsys):
    for label in ("drmas", "agent_episode"):
        fake_run(tmp_path / f"{label}_seed0", label, 0, [0.1], [1.0], 0.5, 0)
    runs = [str(tmp_path / "drmas_seed0"), str(tmp_path / "agent_episode_seed0")]
    assert main(["report", *runs, "--out", str(tmp_path / "out"), "--baseline", "grpo"]) == 2
    assert "error: --baseline 'grpo': no run is labelled so (labels: drmas, agent_episode)" in capsys.readouterr().err
    assert main(["report", *runs, "--out", str(tmp_path / "out"), "--baseline", "agent_episode"]) == 0
    assert "| drmas − agent_episode | 1 | none |" in (tmp_path / "out" / "comparison.md").read_text()


def test_runs_from_several_folders_merge_and_duplicates_count_once(tmp_path):
    """Grids run on two machines: the same label from two folders is more seeds; a (label, seed) given twice
    is one run: the finished copy is kept, the other listed."""
    fake_run(tmp_path / "a" / "drmas_seed0", "drmas", 0, [0.1], [1.0], 0.2, 0)
    fake_run(tmp_path / "b" / "drmas_seed1", "drmas", 1, [0.1], [1.0], 0.4, 0)
    fake_run(tmp_path / "b" / "drmas_seed0", "drmas", 0, [0.1, 0.2], [1.0, 1.0], 0.9, 0)
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
        fake_run(run, "grpo", seed, [0.1, 0.2, 0.3], [1.0, 1.0, 1.0], 0.5, 0)
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


def test_report_says_how_many_seeds_a_difference_would_need(tmp_path):
    """Three paired seeds with accuracy differences +0.1, 0.0, +0.2 (sd 0.1): detecting 0.05 at 80% power needs
    the paired t test's n for d_z = 0.5, 34 seeds."""
    for seed, (a, b) in enumerate([(0.3, 0.2), (0.2, 0.2), (0.5, 0.3)]):
        fake_run(tmp_path / f"drmas_seed{seed}", "drmas", seed, [0.1], [1.0], a, 0)
        fake_run(tmp_path / f"grpo_seed{seed}", "grpo", seed, [0.1], [1.0], b, 0)
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
            fake_run(tmp_path / f"{preset}_seed{seed}", preset, seed, [0.1], [1.0], a, 0)
    fake_run(tmp_path / "drmas_seed2", "drmas", 2, [0.1], [1.0], 0.9, 0)  # no other preset at seed 2: left out
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
        fake_run(tmp_path / f"{preset}_seed0", preset, 0, [0.1], [1.0], 0.2, 0)
    write_report(sorted(tmp_path.glob("*_seed*")), tmp_path / "out")
    assert "2×2" not in (tmp_path / "out" / "comparison.md").read_text()
    assert not (tmp_path / "out" / "effects.csv").exists()


def test_a_torn_last_metrics_line_is_left_out_of_a_report_and_a_damaged_one_named(tmp_path, caplog):
    fake_run(tmp_path / "grpo_seed0", "grpo", 0, [0.1, 0.2], [1.0, 2.0], 0.5, 0)
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
        fake_run(run, "grpo", seed, [0.1, 0.2], [1.0, 1.0], 0.5, 0)
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
