"""Two training steps of configs/agent_program.yaml on the real 135M model, driven by real clients.

The program's calls (logged at the HTTP level) must be exactly the recorded Steps of each episode
(count, order, token ids), both roles must be trained (a non-zero gradient and moved weights for
each role's model), and per-agent diagnostics must appear.

The reward is the task's own: a one-digit addition task (``max_value: 5``, ``+`` only), which the
untrained 135M team answers correctly in some but not all of a group of 8 samples, so both roles'
per-agent advantages are non-zero (the team's reward is joint; Dr. MAS normalizes it per agent).
"""

from __future__ import annotations

import json

import pytest
import torch

from teamrl.config.schema import load_config
from teamrl.train.trainer import Trainer
from tests.conftest import REPO
from tests.serve import traced_programs

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("program", ["openai_solve", "langgraph_solve"])
def test_two_training_steps_of_a_two_role_program(tmp_path, monkeypatch, program):
    pytest.importorskip("openai", reason="pip install openai")
    if program == "langgraph_solve":
        pytest.importorskip("langgraph", reason="pip install 'teamrl[agents]'")
        pytest.importorskip("langchain_openai", reason="pip install 'teamrl[agents]'")
    monkeypatch.chdir(REPO)
    cfg = load_config(REPO / "configs/agent_program.yaml", [
        f"run_dir={tmp_path}", "train.steps=2", "rollout.batch_size=2", "rollout.group_size=8", "eval.before=false",
        "eval.after=false", "task.arith.max_value=5", "task.arith.ops=[+]", "task.arith.n_test=6",
        "train.threads=1",
        f"workflow.agent_program.program=tests.serve.traced_programs:{program}",
        "models.plan_model.optim.lr=1e-4", "models.solve_model.optim.lr=1e-4", "workflow.agent_program.timeout_s=900"])
    trainer = Trainer(cfg, progress=False)
    before = {m: [p.detach().clone() for p in l.model.parameters()] for m, l in trainer.learners.items()}
    seen = []
    collect = trainer.rollout.collect
    trainer.rollout.collect = lambda *a, **k: seen.extend(collect(*a, **k)) or seen[-16:]
    trainer.train()
    assert len(seen) == 32
    for ep in seen:
        assert ep.error is None, ep.error
        calls = traced_programs.LOG[ep.info["endpoint_episode"]]
        assert len(calls) == len(ep.steps) == 2
        assert [c["request"]["model"] for c in calls] == ["planner", "solver"]
        assert [s.agent for s in ep.steps] == ["planner", "calculator"]
        for call, step in zip(calls, ep.steps):
            assert call["body"]["teamrl"]["token_ids"] == step.response_ids
            assert call["body"]["teamrl"]["prompt_token_ids"] == step.prompt_ids
            assert call["body"]["usage"]["completion_tokens"] == len(step.response_ids)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    keys = set().union(*rows)
    rewards = [ep.reward for ep in seen]
    assert 0 < sum(rewards) < len(rewards), f"no reward signal to train on: {rewards}"
    for agent, m in (("planner", "plan_model"), ("calculator", "solve_model")):  # both roles trained
        grads = [r[f"agent/{agent}/grad_norm"] for r in rows if f"agent/{agent}/grad_norm" in r]
        assert grads and max(grads) > 0, (agent, grads, rewards)
        assert any(not torch.equal(a, b) for a, b in zip(before[m], trainer.learners[m].model.parameters())), m
    for agent in ("planner", "calculator"):
        assert {f"agent/{agent}/calls", f"agent/{agent}/adv_std", f"agent/{agent}/reward_mean"} <= keys
    assert any(k.startswith("loss/plan_model/") for k in keys) and any(k.startswith("loss/solve_model/") for k in keys)
