"""Exact resume on every shipped config's settings, after a clean stop and after ``kill -9``.

Each shipped config runs with a tiny model in place of its models (every other setting kept: dtypes,
bf16 rollout copies, engines, LoRA, async buffers, credit, workflows) and a learning rate large
enough that one update visibly moves the weights; a run of N steps and a run stopped after one
step and resumed must end with bit-identical weights and identical metrics.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from teamrl.config.schema import load_config
from teamrl.train.trainer import Trainer
from tests.conftest import REPO, config_marks, shared_data

SHIPPED = sorted((REPO / "configs").glob("*.yaml"))
# An agent program's calls reach the engine over HTTP in an order teamrl does not control, so its
# sampling order (and with it the run) differs between runs of the same seed: resume is tested for
# it, not bit-identity (docs/agent-programs.md). A verifiers environment's rollout calls the same endpoint
# (docs/hubs.md).
NOT_BIT_EXACT = {"agent_program", "verifiers_arith", "verifiers_two_seat", "verifiers_v1_sum", "verifiers_v1_two_seat"}
EXACT = [p for p in SHIPPED if p.stem not in NOT_BIT_EXACT]
# The default run resumes one shipped config per workflow (the quickstart, trees, an RAE config, environment teams)
# and the settings of their own that touch the state a resume restores (two models of different families, LoRA);
# every other shipped config resumes under `pytest -m slow` (CI runs both).
SLOW = {"plan_path_at_grpo_separate", "plan_path_single", "reasoning_gym_single", "reasoning_gym_team",
        "sokoban_at_grpo", "sudoku_at_grpo", "sudoku_single", "math_team_separate", "math_team_sharp",
        "openenv_guess", "openenv_tools", "math_team_hetero", "math_team_lora"}


def test_every_shipped_config_is_covered():
    assert {p.stem for p in SHIPPED} >= {"quickstart", "search_quickstart", "math_team_lora", "math_team_hetero",
                                         "math_team_separate", "math_team_mars2", "math_team_sharp"}
    assert SLOW < {p.stem for p in EXACT}


def test_the_default_run_resumes_every_workflow_of_the_shipped_configs():
    def workflows(paths):
        return {load_config(p).workflow.name for p in paths}

    assert workflows(p for p in EXACT if p.stem not in SLOW) == workflows(EXACT)


def shrink(path: Path, model_dir: Path, run_dir: Path, steps: int) -> list[str]:
    """Overrides that keep ``path``'s settings but make it tiny: tiny models, short replies, 2 problems."""
    cfg = load_config(path)
    out = [f"run_dir={run_dir}", f"train.steps={steps}", "train.save_every=1", "eval.before=false",
           "eval.after=false", "rollout.batch_size=2", f"rollout.group_size={min(cfg.rollout.group_size, 3)}",
           "loss.entropy_coef=0.01"]  # random weights earn no reward: the entropy term makes every update move them
    if cfg.rollout.prefix_tree:  # a tree of 2 x 2 episodes per problem
        out += ["rollout.group_size=4", "rollout.prefix_tree=[2,2]"]
    for m in cfg.models:
        out += [f"models.{m}.path={model_dir}", f"models.{m}.optim.lr=1e-3"]
    for a in cfg.agents:
        out.append(f"agents.{a}.max_new_tokens=8")
    if cfg.task.name == "search":
        data = shared_data() / "hotpotqa_distractor_rpt"
        if not (data / "train.jsonl").is_file():
            pytest.skip(f"benchmark data not found at {data} (set TEAMRL_DATA)")
        out += [f"task.search.train_path={data / 'train.jsonl'}", f"task.search.test_path={data / 'test.jsonl'}"]
    return out


def weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {f"{m}.{n}": p.detach().clone() for m, model in trainer.models.items() for n, p in model.named_parameters()}


def metric_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


def assert_two_steps_resume_exactly(cfg, tmp_path: Path) -> None:
    """Two steps straight, or one step and a resume (``cfg(run, steps)`` gives each run's config): the same weights
    and the same logged metrics."""
    straight = Trainer(cfg("straight", 2), progress=False)
    straight.train()
    Trainer(cfg("resumed", 1), progress=False).train()
    resumed = Trainer(cfg("resumed", 2), resume=True, allow_change=("train.steps",), progress=False)
    assert resumed.start_step == 1
    resumed.train()
    want = weights(straight)
    for k, w in weights(resumed).items():
        torch.testing.assert_close(w, want[k], atol=0, rtol=0, msg=k)
    assert metric_rows(tmp_path / "resumed") == metric_rows(tmp_path / "straight")


@pytest.mark.parametrize("config", [pytest.param(p, id=p.stem, marks=([pytest.mark.slow] if p.stem in SLOW else [])
                                                 + config_marks(p.stem)) for p in EXACT])
def test_resume_reproduces_an_uninterrupted_run(config, tmp_path, tiny_model_dir):
    straight = Trainer(load_config(config, shrink(config, tiny_model_dir, tmp_path / "straight", 2)), progress=False)
    before = weights(straight)
    straight.train()
    after = weights(straight)
    assert any(not torch.equal(before[k], after[k]) for k in before), "nothing was trained: the test would be vacuous"
    Trainer(load_config(config, shrink(config, tiny_model_dir, tmp_path / "resumed", 1)), progress=False).train()
    resumed = Trainer(load_config(config, shrink(config, tiny_model_dir, tmp_path / "resumed", 2)), resume=True, allow_change=("train.steps",),
                      progress=False)
    assert resumed.start_step == 1
    resumed.train()
    for k, w in weights(resumed).items():
        torch.testing.assert_close(w, after[k], atol=0, rtol=0, msg=k)
    assert metric_rows(tmp_path / "resumed") == metric_rows(tmp_path / "straight")


@pytest.mark.slow  # a training process of its own (about 40 s); the default run resumes every workflow above
def test_kill_9_mid_step_then_resume(tmp_path, tiny_model_dir):
    """A training process killed with SIGKILL right after its first checkpoint resumes from its latest one and ends
    exactly where an uninterrupted run ends (the quickstart's settings: bf16 rollout copy, bf16 autocast)."""
    config = REPO / "configs" / "quickstart.yaml"
    # the same torch thread count in this process and the killed one: a norm's float sum depends on it, and an
    # earlier test may have left this process at another count; and the same autocast: `auto` measures the CPU's
    # bf16 product speed in each process, which another job beside it can move across the bar (resolved once here)
    from teamrl.hardware import resolve_config

    resolved = resolve_config(load_config(config, shrink(config, tiny_model_dir, tmp_path / "probe", 3)))
    threads = ["train.threads=2", f"models.main.train_autocast={resolved.models['main'].train_autocast}"]
    straight = Trainer(load_config(config, shrink(config, tiny_model_dir, tmp_path / "straight", 3) + threads),
                       progress=False)
    straight.train()
    run = tmp_path / "killed"
    cmd = [sys.executable, "-m", "teamrl.cli", "train", str(config), *shrink(config, tiny_model_dir, run, 3), *threads]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pointer = run / "checkpoints" / "latest"
    deadline = time.monotonic() + 300
    try:
        while not (pointer.is_file() and pointer.read_text().strip() == "step_1"):
            assert proc.poll() is None, f"training ended before its first checkpoint: {proc.stderr.read().decode()[-2000:]}"
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.02)
        assert proc.poll() is None, "the run finished before it could be killed mid-step"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    saved = int(pointer.read_text().strip().removeprefix("step_"))  # step_1, or step_2 on a fast machine
    assert 1 <= saved < 3, "killed after its last step: nothing left to resume"
    resumed = Trainer(load_config(config, shrink(config, tiny_model_dir, run, 3) + threads), resume=True, allow_change=("train.steps",),
                      progress=False)
    assert resumed.start_step == saved
    resumed.train()
    for k, w in weights(resumed).items():
        torch.testing.assert_close(w, weights(straight)[k], atol=0, rtol=0, msg=k)
    got, want = metric_rows(run), metric_rows(tmp_path / "straight")
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want)):
        differ = {k: (g.get(k), w.get(k)) for k in g.keys() | w.keys() if g.get(k) != w.get(k)}
        assert not differ, f"row {step}: {differ}"


@pytest.mark.parametrize("name", [pytest.param(n, marks=config_marks(n)) for n in sorted(NOT_BIT_EXACT)])
def test_resume_continues_an_agent_program_run(name, tmp_path, tiny_model_dir):
    config = REPO / "configs" / f"{name}.yaml"
    Trainer(load_config(config, shrink(config, tiny_model_dir, tmp_path / "run", 1)), progress=False).train()
    saved = Trainer(load_config(config, shrink(config, tiny_model_dir, tmp_path / "probe", 1)), progress=False)
    saved.load_weights(tmp_path / "run")
    resumed = Trainer(load_config(config, shrink(config, tiny_model_dir, tmp_path / "run", 2)), resume=True, allow_change=("train.steps",),
                      progress=False)
    assert resumed.start_step == 1
    for k, w in weights(resumed).items():  # the checkpoint's weights, engines synced from them
        torch.testing.assert_close(w, weights(saved)[k], atol=0, rtol=0, msg=k)
    resumed.train()
    assert [r["step"] for r in metric_rows(tmp_path / "run")] == [0, 1]
