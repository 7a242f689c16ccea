"""Rewards that are not finite numbers within ±MAX_ABS_REWARD (from a task, a workflow, an agent program or a
credit method) fail their episode with the reason; the run goes on and counts them in its metrics."""

from __future__ import annotations

import json
import math

import pytest

from teamrl.scoring.rewards import MAX_ABS_REWARD, refuse_bad_rewards
from teamrl.team.records import Episode, Step
from tests.train.test_trainer import tiny_config


def _episode(index: int, **rewards: object) -> Episode:
    ep = Episode(prompt_index=0, index=index, problem_id=f"p{index}", **rewards)  # type: ignore[arg-type]
    ep.steps.append(Step(prompt_index=0, episode=index, agent="solver", agent_call=0, model="m", prompt_ids=[1],
                         response_ids=[2], logprobs=[-1.0], temperature=1.0, text="", valid=True))
    return ep


@pytest.mark.parametrize(("rewards", "named"), [
    ({"reward": math.nan}, "its reward is nan"),
    ({"reward": 1e308}, "its reward is 1e+308"),
    ({"reward": -math.inf}, "its reward is -inf"),
    ({"agent_rewards": {"verifier": math.inf}}, "agent 'verifier''s reward is inf"),
    ({"step_rewards": {0: MAX_ABS_REWARD * 2}}, "the reward of call 0 (agent 'solver') is 2000000.0"),
    ({"step_rewards": {0: "1.0x"}}, "the reward of call 0 (agent 'solver') is '1.0x'"),
])
def test_bad_rewards_fail_the_episode_naming_it(rewards: dict[str, object], named: str) -> None:
    ep = _episode(7, **rewards)
    assert refuse_bad_rewards([ep, _episode(8, reward=1.0)]) == 1
    assert ep.error is not None and ep.error.startswith(f"reward refused: episode 7 (problem 'p7'): {named};")
    assert (ep.reward, ep.agent_rewards, ep.step_rewards) == (0.0, {}, {})
    kept = ep.info["refused_rewards"]
    assert named.rsplit(" is ", 1)[1].strip("'") in json.dumps(kept)  # the value is kept, as text
    assert refuse_bad_rewards([ep]) == 0  # already failed: counted once


def test_rewards_at_the_bound_and_failed_episodes_are_left_alone() -> None:
    ok = _episode(0, reward=-MAX_ABS_REWARD, agent_rewards={"solver": MAX_ABS_REWARD}, step_rewards={0: 0.5})
    failed = _episode(1, reward=math.nan, error="workflow failed")
    assert refuse_bad_rewards([ok, failed]) == 0
    assert ok.error is None and ok.reward == -MAX_ABS_REWARD and failed.error == "workflow failed"


class _HostileTask:
    """Arithmetic problems scored from the reply's length: NaN, 1e308, an exception, or 0/1 by parity."""

    name, answer_format = "hostile_rewards", "Give the answer as a number."

    def __init__(self, cfg: object = None) -> None:
        from teamrl.domains.math.arith import ArithConfig, ArithTask

        self._arith = ArithTask(ArithConfig(n_test=10))

    def problems(self, split: str):  # type: ignore[no-untyped-def]
        return self._arith.problems(split)

    def extract_answer(self, response: str) -> str | None:
        return response.strip() or None

    def score(self, problem: object, response: str) -> float:
        kind = len(response) % 5
        if kind == 0:
            return math.nan
        if kind == 1:
            return 1e308
        if kind == 2:
            raise RuntimeError("grader bug")
        return float(kind == 3)


def test_a_run_with_nan_huge_and_raising_rewards_completes(tmp_path, tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    from teamrl.tasks.base import TASKS, register_task
    from teamrl.train.trainer import Trainer

    if "hostile_rewards" not in TASKS:
        register_task("hostile_rewards")(_HostileTask)
    cfg = tiny_config(tmp_path, tiny_model_dir, "r", "task.name=hostile_rewards", "train.steps=2",
                      "workflow.math_team.max_loops=1", "rollout.batch_size=3", "eval.before=false",
                      "eval.after=false", "train.transcripts_per_step=9", "agents.solver.max_new_tokens=12")
    Trainer(cfg, progress=False).train()  # the old code stopped with OverflowError or "rewards must be finite"
    run = tmp_path / "r"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]
    failed = [json.loads(line) for line in (run / "failed_episodes.jsonl").read_text().splitlines()]
    kept = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    for m in metrics:
        refused = [f for f in failed if f["step"] == m["step"] and f["error"].startswith("reward refused")]
        raising = [e for e in kept if e["step"] == m["step"] and len(e["final"] or "") % 5 == 2]
        assert m["rollout/refused_rewards"] == len(refused)
        assert m["rollout/grading_errors"] == len(raising)
        assert m["rollout/failed_episodes"] == len(refused)
        assert all(math.isfinite(v) for k, v in m.items() if k.startswith("agent/") and isinstance(v, float))
    assert sum(m["rollout/refused_rewards"] for m in metrics) >= 2  # the seeded run meets bad rewards ...
    assert sum(m["rollout/grading_errors"] for m in metrics) >= 1  # ... and a raising grader
