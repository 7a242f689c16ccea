"""Smoke runs of the whole loop on a tiny model: outputs, learning signal plumbing, resume."""

from __future__ import annotations

import json

import pytest
import torch

from teamrl.config.schema import load_config
from teamrl.train.trainer import Trainer


def tiny_config(tmp_path, model_dir, run: str, *extra: str):  # the format penalty gives random weights a signal
    base = [f"run_dir={tmp_path / run}", f"models.main.path={model_dir}",
            "rollout.batch_size=2", "rollout.group_size=3", "train.steps=2", "train.save_every=1",
            "eval.problems=3", "eval.samples=2", "agents.solver.max_new_tokens=6",
            "agents.verifier.max_new_tokens=4", "task.arith.n_test=10", "algo.format_penalty=0.5"]
    # settings of an agent or a task the run does not use are refused (teamrl/config/names.py): left out then
    if any(e.startswith("task.name=") and e != "task.name=arith" for e in extra):
        base.remove("task.arith.n_test=10")
    if any(e.startswith("workflow.name=") and e != "workflow.name=math_team" for e in extra):
        base.remove("agents.verifier.max_new_tokens=4")
    return load_config(None, [*base, *extra])


def eval_episodes(run, tag: str) -> list[dict]:
    """The held-out episodes a run recorded in ``eval_<tag>_episodes.jsonl``."""
    return [json.loads(l) for l in (run / f"eval_{tag}_episodes.jsonl").read_text().splitlines()]


def test_two_steps_write_a_complete_run_dir(tmp_path, tiny_model_dir):
    """Two steps on a task where random weights get mixed rewards: a complete run dir, non-zero advantages,
    every weight trained, and held-out scores that match the recorded episodes."""
    _register_reply_length_task()
    cfg = tiny_config(tmp_path, tiny_model_dir, "a", "task.name=reply_length", "algo.format_penalty=0")
    tr = Trainer(cfg, progress=False)
    before = {n: p.detach().clone() for n, p in tr.models["main"].named_parameters()}
    results = tr.train()
    run = tmp_path / "a"
    assert {"config.yaml", "metrics.jsonl", "episodes.jsonl", "summary.json", "eval_before.json",
            "eval_after.json", "tensorboard", "checkpoints"} <= {p.name for p in run.iterdir()}
    metrics = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]
    assert {"agent/solver/grad_norm", "agent/verifier/reward_mean", "rollout/reward_mean"} <= metrics[0].keys()
    episodes = [json.loads(l) for l in (run / "episodes.jsonl").read_text().splitlines()]
    assert episodes[0]["turns"][0]["agent"] == "solver"
    for step in (0, 1):  # the learning signal reaches the learner in both steps ...
        assert any(t["advantage"] != 0 for ep in episodes if ep["step"] == step for t in ep["turns"]), step
    assert [m["loss/main/rows_trained"] for m in metrics] == [12.0, 12.0]  # 2 prompts x 3 samples x 2 agents
    changed = {n for n, p in tr.models["main"].named_parameters() if not torch.equal(p, before[n])}
    assert changed == set(before)  # ... and every weight moves
    assert set(results) == {"before", "after"}
    for tag in ("before", "after"):  # scores recomputed from the recorded episodes, graded again from their text
        eps = eval_episodes(run, tag)
        assert len(eps) == 3 * 2 and all(ep["reward"] == float(len(ep["final"]) % 2 == 0) for ep in eps)
        by_problem: dict[str, list[float]] = {}
        for ep in eps:
            by_problem.setdefault(ep["problem_id"], []).append(ep["reward"])
        assert results[tag]["problems"] == len(by_problem) == 3
        assert results[tag]["accuracy"] == pytest.approx(sum(ep["reward"] for ep in eps) / len(eps), abs=1e-12)
        assert results[tag]["pass@2"] == pytest.approx(sum(max(r) for r in by_problem.values()) / 3, abs=1e-12)
        assert 0 < results[tag]["accuracy"] < 1  # mixed outcomes here (seeded): the check above is not 0 == 0
        assert json.loads((run / f"eval_{tag}.json").read_text()) == results[tag]
    summary = json.loads((run / "summary.json").read_text())  # each evaluation's own peak, within the run's
    assert set(summary["peak_rss_gb_evals"]) == {"before", "after"}
    assert all(0 < gib <= summary["peak_rss_gb"] for gib in summary["peak_rss_gb_evals"].values())
    assert not any("perf/peak_rss_gb/eval" in m for m in metrics)  # not carried into the step rows


@pytest.mark.slow  # tests/train/test_resume.py resumes the quickstart's settings (and every workflow) by default
def test_resume_reproduces_an_uninterrupted_run(tmp_path, tiny_model_dir):
    _register_reply_length_task()  # mixed rewards: both steps train, so the weights compared below have moved
    extra = ("task.name=reply_length", "algo.format_penalty=0", "eval.before=false", "eval.after=false")
    straight = Trainer(tiny_config(tmp_path, tiny_model_dir, "straight", *extra), progress=False)
    w0 = {n: p.detach().clone() for n, p in straight.models["main"].named_parameters()}
    straight.train()
    assert all(not torch.equal(p, w0[n]) for n, p in straight.models["main"].named_parameters())
    first = Trainer(tiny_config(tmp_path, tiny_model_dir, "resumed", *extra, "train.steps=1"), progress=False)
    first.train()
    second = Trainer(tiny_config(tmp_path, tiny_model_dir, "resumed", *extra), resume=True, allow_change=("train.steps",), progress=False)
    assert second.start_step == 1
    second.train()
    for (n, p), (_, q) in zip(straight.models["main"].named_parameters(),
                              second.models["main"].named_parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=0, rtol=0, msg=n)
    a = (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()
    b = (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()
    strip = lambda l: {k: v for k, v in json.loads(l).items() if not k.startswith("perf/")}  # noqa: E731
    assert [strip(l) for l in a] == [strip(l) for l in b]
    assert all(json.loads(l)["loss/main/rows_trained"] > 0 for l in a)


def test_resume_without_checkpoint_is_a_clear_error(tmp_path, tiny_model_dir):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        Trainer(tiny_config(tmp_path, tiny_model_dir, "empty"), resume=True, allow_change=("train.steps",), progress=False)


def test_math_task_on_real_gsm8k_rows(tmp_path, tiny_model_dir):
    from teamrl.domains.math.math import MathConfig, MathTask
    from tests.conftest import shared_data

    data = shared_data() / "gsm8k"
    if not (data / "train.jsonl").is_file():
        pytest.skip(f"benchmark data not found at {data} (set TEAMRL_DATA)")
    cfg = tiny_config(tmp_path, tiny_model_dir, "gsm", "task.name=math", f"task.math.train_path={data / 'train.jsonl'}",
                      f"task.math.test_path={data / 'test.jsonl'}", "task.math.limit_train=16", "train.steps=1",
                      "workflow.name=single", "agents={solver: {max_new_tokens: 4}}")
    results = Trainer(cfg, progress=False).train()
    rows = [json.loads(l) for l in (data / "test.jsonl").read_text().splitlines()[:3]]
    grader = MathTask(MathConfig(test_path=str(data / "test.jsonl")))
    problems = grader.problems("test")[:3]
    for tag in ("before", "after"):
        eps = eval_episodes(tmp_path / "gsm", tag)
        assert results[tag]["problems"] == 3 and len(eps) == 3 * 2
        assert [ep["question"] for ep in eps[::2]] == [r["question"] for r in rows]  # the file's first rows
        assert [ep["gold"] for ep in eps[::2]] == [r["answer"].split("####")[-1].strip() for r in rows]
        # each recorded reward graded again from the recorded reply, and the accuracy is their mean
        assert [ep["reward"] for ep in eps] == [grader.score(problems[i // 2], ep["final"] or "")
                                                for i, ep in enumerate(eps)]
        assert results[tag]["accuracy"] == pytest.approx(sum(ep["reward"] for ep in eps) / len(eps), abs=1e-12)
    assert results["after"]["accuracy"] == 0.0  # 4 tokens of a random model (seeded) solve nothing


class _ReplyLengthTask:
    """Arithmetic problems scored by the parity of the reply's length: random models get mixed rewards."""

    name, answer_format = "reply_length", "Give the answer as a number."

    def __init__(self, cfg=None):
        from teamrl.domains.math.arith import ArithConfig, ArithTask

        self._arith = ArithTask(ArithConfig(n_test=10))

    def problems(self, split):
        return self._arith.problems(split)

    def extract_answer(self, response):
        return response.strip() or None

    def score(self, problem, response):
        return float(len(response) % 2 == 0)


def _register_reply_length_task():
    from teamrl.tasks.base import TASKS, register_task

    if "reply_length" not in TASKS:
        register_task("reply_length")(_ReplyLengthTask)


def test_synchronous_team_drmas_equals_grpo_through_the_trainer(tmp_path, tiny_model_dir):
    """Joint reward, each agent called once per episode: one step of drmas and of grpo from the same
    seed give identical advantages and identical weights."""
    _register_reply_length_task()
    runs = {}
    for est in ("drmas", "grpo"):
        cfg = tiny_config(tmp_path, tiny_model_dir, est, f"algo.estimator={est}", "task.name=reply_length",
                          "workflow.math_team.max_loops=1", "algo.format_penalty=0", "train.steps=1",
                          "eval.before=false", "eval.after=false", "train.transcripts_per_step=6")
        tr = Trainer(cfg, progress=False)
        tr.train()
        lines = (tmp_path / est / "episodes.jsonl").read_text().splitlines()
        runs[est] = (tr, [t["advantage"] for l in lines for t in json.loads(l)["turns"]])
    (a, adv_a), (b, adv_b) = runs["drmas"], runs["grpo"]
    assert adv_a == adv_b and any(x != 0 for x in adv_a) and len(adv_a) == 12
    for (n, p), (_, q) in zip(a.models["main"].named_parameters(), b.models["main"].named_parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=0, rtol=0, msg=n)


def test_diagnostics_are_logged_and_spikes_summarised(tmp_path, tiny_model_dir):
    _register_reply_length_task()
    cfg = tiny_config(tmp_path, tiny_model_dir, "diag", "task.name=reply_length", "algo.format_penalty=0",
                      "eval.before=false", "train.spike_factor=1.5", "train.spike_window=4")
    Trainer(cfg, progress=False).train()
    run = tmp_path / "diag"
    metrics = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    for agent in ("solver", "verifier"):
        keys = {f"agent/{agent}/{k}" for k in ("grad_norm", "reward_mean", "reward_std", "adv_mean", "adv_std",
                                               "invalid_rate", "response_len", "entropy", "clip_frac",
                                               "amplification", "grad_spike", "grad_spikes", "multi_call_rate")}
        assert keys <= metrics[0].keys(), keys - metrics[0].keys()
    assert {"loss/main/grad_spike", "loss/main/grad_spikes"} <= metrics[0].keys()
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary["grad_spikes"]) == {"agents", "models"}
    assert summary["grad_spikes"]["agents"]["solver"] == metrics[-1]["agent/solver/grad_spikes"]
    assert {"accuracy", "pass@1", "pass@2"} <= summary["after"].keys()


def test_spike_config_is_validated(tmp_path, tiny_model_dir):
    from teamrl.config.tools import ConfigError

    with pytest.raises(ConfigError, match="spike_factor 0.5 must be > 1"):
        tiny_config(tmp_path, tiny_model_dir, "bad", "train.spike_factor=0.5")


@pytest.mark.slow  # two runs of the continuous scheduler (about 7 s)
def test_continuous_scheduler_same_seed_same_run(tmp_path, tiny_model_dir):
    """Calls joining a running batch (models.main.scheduler=continuous) keep a run reproducible:
    every request's sampling uniforms are drawn when it is added, and the engine's cache columns
    past a row's length are zeros, never stale values."""
    _register_reply_length_task()  # mixed rewards: step 1 samples from updated weights
    extra = ("eval.before=false", "eval.after=false", "models.main.scheduler=continuous", "rollout.batch_size=3",
             "agents.solver.max_new_tokens=10", "models.main.rollout_dtype=bfloat16", "loss.old_logprobs=recompute",
             "task.name=reply_length", "algo.format_penalty=0")
    runs = []
    for name in ("a", "b"):
        Trainer(tiny_config(tmp_path, tiny_model_dir, name, *extra), progress=False).train()
        runs.append([{k: v for k, v in json.loads(l).items() if not k.startswith("perf/")}
                     for l in (tmp_path / name / "metrics.jsonl").read_text().splitlines()])
    assert len(runs[0]) == 2 and runs[0] == runs[1]
    assert all(m["loss/main/rows_trained"] > 0 for m in runs[0])
