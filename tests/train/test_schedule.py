"""The learning-rate schedule in training steps: hand-computed values, the originals' formulas transcribed, its
properties, and the rate the learner and the trainer log under several optimizer steps per training step."""

from __future__ import annotations

import json
import math

import pytest

from teamrl.algos.schedule import Schedule, curve, lr_factor, positions, warmup_positions
from teamrl.learner.learner import TorchLearner
from teamrl.train.trainer import Trainer
from tests.conftest import make_tiny_model
from tests.train.test_learner import make_rows, settings
from tests.train.test_trainer import _register_reply_length_task, tiny_config


def verl_cosine(step: int, warmup: int, total: int, min_lr_ratio: float) -> float:
    """verl's ``get_cosine_schedule_with_warmup`` (verl/utils/torch_functional.py), num_cycles 0.5, as written there."""
    if step < warmup:
        return min_lr_ratio + (1.0 - min_lr_ratio) * (float(step) / float(max(1, warmup)))
    progress = float(step - warmup) / float(max(1, total - warmup))
    x = math.cos(math.pi * 0.5 * 2.0 * progress)
    return max(min_lr_ratio, x * (1 - min_lr_ratio) * 0.5 + (1 + min_lr_ratio) * 0.5)


def verl_constant(step: int, warmup: int) -> float:
    """verl's ``get_constant_schedule_with_warmup``."""
    return float(step) / float(max(1.0, warmup)) if step < warmup else 1.0


def hf_cosine_min_lr(step: int, warmup: int, total: int, min_lr_rate: float) -> float:
    """transformers' ``cosine_with_min_lr`` lambda (``_get_cosine_with_min_lr_schedule_with_warmup_lr_lambda``),
    num_cycles 0.5, which OpenRLHF's and MARTI's trainers step once per optimizer step."""
    if step < warmup:
        return float(step) / float(max(1, warmup))
    progress = float(step - warmup) / float(max(1, total - warmup))
    factor = 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress))
    return max(0.0, factor * (1 - min_lr_rate) + min_lr_rate)


def test_hand_computed_values():
    # teamrl: warm-up (p + 1) / (W + 1), then a cosine over the rest to the floor
    s = Schedule("cosine", "teamrl", total=10, warmup=2, min_lr_ratio=0.0)
    assert [lr_factor(s, p) for p in (0, 1)] == [1 / 3, 2 / 3]
    assert lr_factor(s, 2) == 1.0 and lr_factor(s, 6) == pytest.approx(0.5) and lr_factor(s, 10) == pytest.approx(0.0)
    # verl: from the floor 0.3 to 1 over 10 steps, half-way down at 10 + 95 of 200
    v = Schedule("cosine", "verl", total=200, warmup=10, min_lr_ratio=0.3)
    assert lr_factor(v, 0) == 0.3 and lr_factor(v, 5) == pytest.approx(0.65)
    assert lr_factor(v, 105) == pytest.approx(0.65) and lr_factor(v, 200) == pytest.approx(0.3)
    # openrlhf: warm-up from 0
    o = Schedule("cosine", "openrlhf", total=100, warmup=3, min_lr_ratio=0.1)
    assert lr_factor(o, 0) == 0.0 and lr_factor(o, 1.5) == pytest.approx(0.5) and lr_factor(o, 100) == pytest.approx(0.1)
    assert lr_factor(Schedule("constant", "verl", total=5, warmup=4), 1) == 0.25


def test_the_originals_formulas_transcribed():
    for total, warmup, m in [(200, 10, 0.3), (50, 0, 0.0), (7, 3, 0.1), (1, 0, 0.0)]:
        for step in range(total + 1):
            assert lr_factor(Schedule("cosine", "verl", total=total, warmup=warmup, min_lr_ratio=m), step) == \
                pytest.approx(verl_cosine(step, warmup, total, m), abs=1e-12), (total, warmup, step)
            assert lr_factor(Schedule("constant", "verl", total=total, warmup=warmup), step) == \
                pytest.approx(verl_constant(step, warmup), abs=1e-12)
    # OpenRLHF: K optimizer steps over the run, n per training step; position t + j / n is optimizer step t n + j of K
    steps, n, ratio, m = 20, 4, 0.03, 0.1
    k_total = steps * n
    k_warm = math.ceil(k_total * ratio)  # OpenRLHF's num_warmup_steps
    s = Schedule("cosine", "openrlhf", total=steps, warmup=k_warm / n, min_lr_ratio=m)
    for t in range(steps):
        for j, p in enumerate(positions(s, t, n)):
            assert lr_factor(s, p) == pytest.approx(hf_cosine_min_lr(t * n + j, k_warm, k_total, m), abs=1e-12)


@pytest.mark.parametrize("style", ["teamrl", "verl", "openrlhf"])
@pytest.mark.parametrize("m", [0.0, 0.1, 0.3])
def test_cosine_properties(style, m):
    s = Schedule("cosine", style, total=40, warmup=4, min_lr_ratio=m)
    after = [lr_factor(s, p / 4) for p in range(16, 161)]
    assert all(a >= b - 1e-15 for a, b in zip(after, after[1:]))  # never rises after warm-up
    assert all(m - 1e-12 <= x <= 1 + 1e-12 for x in after) and after[0] == 1.0 and after[-1] == pytest.approx(m)
    warm = [lr_factor(s, p / 4) for p in range(0, 17)]
    assert all(a <= b for a, b in zip(warm, warm[1:]))  # rises during warm-up


def test_past_its_length_the_originals_cosine_goes_on():
    """verl and transformers do not cap the cosine's progress. PettingLLMs' actors never get the run's total steps
    (verl's total_training_steps stays -1): max(1, -1 - 10) = 1, so past warm-up the rate alternates between lr and
    min_lr_ratio x lr, which schedule_steps = warm-up + 1 reproduces; teamrl's own style holds its floor."""
    alternating = Schedule("cosine", "verl", total=11, warmup=10, min_lr_ratio=0.3)
    assert [lr_factor(alternating, p) for p in range(10, 15)] == pytest.approx([1.0, 0.3, 1.0, 0.3, 1.0])
    assert [lr_factor(alternating, p) for p in range(0, 30)] == pytest.approx(
        [verl_cosine(p, 10, -1, 0.3) for p in range(0, 30)])
    periodic = Schedule("cosine", "openrlhf", total=10, min_lr_ratio=0.1)
    assert lr_factor(periodic, 10) == pytest.approx(0.1) and lr_factor(periodic, 20) == pytest.approx(1.0)
    assert lr_factor(Schedule("cosine", "teamrl", total=10), 20) == pytest.approx(0.0)


def test_warmup_ratio_rounds_as_each_original():
    assert warmup_positions("verl", 10, ratio=0.15) == 1 and warmup_positions("openrlhf", 10, ratio=0.15) == 1.5
    assert warmup_positions("verl", 10, steps=4, ratio=0.0) == 4 and warmup_positions("teamrl", 10) == 0


def test_curve_reads_the_training_steps():
    c = curve(Schedule("cosine", "verl", total=5, min_lr_ratio=0.3))
    assert [f for f, _ in c] == [0.0, 0.1, 0.5, 0.9, 1.0]
    assert c[2][1] == pytest.approx(verl_cosine(2, 0, 5, 0.3)) and c[-1][1] == pytest.approx(verl_cosine(4, 0, 5, 0.3))


@pytest.mark.parametrize("style", ["teamrl", "verl", "openrlhf"])
def test_learner_logs_the_rate_of_its_training_step(tokenizer, style):
    """Four training steps of 8 rows in mini-batches of 2 (four optimizer steps each): the logged rate is the
    schedule's at the training step (its mean over the optimizer steps under openrlhf), never the rate of step
    4 x t. Before, the scheduler counted optimizer steps and a cosine over 4 training steps ended after the first."""
    lr = TorchLearner("m", make_tiny_model(tokenizer), settings(schedule="cosine", total_steps=4, lr=1e-3,
                                                                  mini_batch_rows=2, schedule_style=style), {})
    s = lr.schedule
    logged = [lr.update(make_rows(tokenizer), step=t)["lr"] for t in range(4)]
    want = [1e-3 * sum(lr_factor(s, p) for p in positions(s, t, 4)) / 4 for t in range(4)]
    assert logged == pytest.approx(want, rel=1e-12)
    assert logged[2] > 0.3e-3  # a good part of the peak half-way (the bug gave 0 from the second step on)


def test_trainer_logs_the_schedule_in_training_steps(tmp_path, tiny_model_dir):
    """The trainer's logged ``loss/main/lr`` over 4 training steps with several mini-batches each follows the cosine
    over training steps: 1e-5 x (1 + cos(pi t / 4)) / 2."""
    _register_reply_length_task()
    cfg = tiny_config(tmp_path, tiny_model_dir, "sched", "task.name=reply_length", "algo.format_penalty=0",
                      "train.steps=4", "train.save_every=0", "eval.before=false", "eval.after=false",
                      "loss.mini_batch_rows=2", "models.main.optim.schedule=cosine", "models.main.optim.lr=1e-5")
    Trainer(cfg, progress=False).train()
    metrics = [json.loads(line) for line in (tmp_path / "sched" / "metrics.jsonl").read_text().splitlines()]
    assert [m["loss/main/lr"] for m in metrics] == pytest.approx(
        [1e-5 * 0.5 * (1 + math.cos(math.pi * t / 4)) for t in range(4)], rel=1e-9)
