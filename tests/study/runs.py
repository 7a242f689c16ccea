"""Run folders written by hand for the study tests, and the overrides that make a real training run tiny."""

from __future__ import annotations

import json

import yaml


def fake_run(path, estimator, seed, rewards, norms, accuracy, spikes, duplicate_last=False):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump({"algo": {"estimator": estimator}, "train": {"seed": seed}}))
    rows = [{"step": i, "rollout/reward_mean": r, "agent/solver/grad_norm": n, "agent/solver/amplification": 1.0,
             "agent/solver/grad_spikes": float(spikes), "perf/step_s": 2.0} for i, (r, n) in enumerate(zip(rewards, norms))]
    if duplicate_last:  # a resumed run logs the steps after its checkpoint again; the last entry wins
        rows.insert(-1, {**rows[-1], "agent/solver/grad_norm": 1000.0})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"after": {"accuracy": accuracy}, "grad_spikes": {"agents": {"solver": spikes}, "models": {"main": 0}}}
    (path / "summary.json").write_text(json.dumps(summary))


TINY = ["rollout.batch_size=2", "rollout.group_size=2", "train.steps=1", "eval.problems=2", "eval.samples=2",
        "agents.solver.max_new_tokens=4", "agents.verifier.max_new_tokens=3", "task.arith.n_test=10"]
