"""models.<m>.optim.states: 8bit — torchao's AdamW8bit: a quarter of the moment memory, steps close to
float32 AdamW's, checkpoints that resume bit for bit, and clear errors."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from teamrl.config.schema import load_config
from teamrl.learner import lowbit
from teamrl.learner.safestate import load_state
from teamrl.train.trainer import Trainer
from tests.conftest import REPO
from tests.train.test_resume import metric_rows, shrink, weights

needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                   reason="torchao is not installed (pip install 'teamrl[lowbit]')")
QUICKSTART = REPO / "configs" / "quickstart.yaml"


def moment_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes the optimizer's moments occupy (8-bit moments: codes + scales + the 256-entry map)."""
    from torchao.optim.subclass_8bit import OptimState8bit

    total = 0
    for st in optimizer.state.values():
        for key in ("exp_avg", "exp_avg_sq"):
            t = st[key]
            parts = (t.codes, t.scale, t.qmap) if isinstance(t, OptimState8bit) else (t,)
            total += sum(x.numel() * x.element_size() for x in parts)
    return total


@needs_torchao
def test_8bit_moments_take_about_a_quarter_and_step_like_float32(tmp_path, tiny_model_dir):
    """One update from the same weights on the same rollout: the 8-bit moments take < 30% of float32's bytes,
    and every weight moves by nearly the same amount (Adam's first step is ~lr × sign(grad) in both)."""
    runs = {}
    for states in ("float32", "8bit"):
        tr = Trainer(load_config(QUICKSTART, [*shrink(QUICKSTART, tiny_model_dir, tmp_path / states, 1),
                                              f"models.main.optim.states={states}"]), progress=False)
        start = weights(tr)
        tr.train()
        runs[states] = (tr, {k: w - start[k] for k, w in weights(tr).items()})
    (fp32, d32), (q8, d8) = runs["float32"], runs["8bit"]
    assert metric_rows(tmp_path / "8bit")[0]["loss/main/loss"] == metric_rows(tmp_path / "float32")[0]["loss/main/loss"]
    ratio = moment_bytes(q8.learners["main"].optimizer) / moment_bytes(fp32.learners["main"].optimizer)
    assert ratio < 0.3, ratio
    moved = [k for k in d32 if d32[k].norm() > 0]
    assert len(moved) > len(d32) // 2
    for k in moved:
        assert (d8[k] - d32[k]).norm() <= 0.05 * d32[k].norm(), k


@needs_torchao
def test_resume_with_8bit_moments_is_exact(tmp_path, tiny_model_dir):
    """The quickstart's settings with 8-bit moments: 2 steps straight equal 1 step, a checkpoint, and 1 more."""
    extra = ["models.main.optim.states=8bit"]
    straight = Trainer(load_config(QUICKSTART, [*shrink(QUICKSTART, tiny_model_dir, tmp_path / "straight", 2), *extra]),
                       progress=False)
    straight.train()
    Trainer(load_config(QUICKSTART, [*shrink(QUICKSTART, tiny_model_dir, tmp_path / "resumed", 1), *extra]),
            progress=False).train()
    saved = load_state(tmp_path / "resumed" / "checkpoints" / "step_1" / "optim-main.safetensors")
    codes = [m["codes"] for moments in saved["quantized_states"].values() for m in moments.values()]
    assert codes and all(c.dtype == torch.uint8 for c in codes)  # stored as codes, not dequantized floats
    resumed = Trainer(load_config(QUICKSTART, [*shrink(QUICKSTART, tiny_model_dir, tmp_path / "resumed", 2), *extra]),
                      resume=True, allow_change=("train.steps",), progress=False)
    assert resumed.start_step == 1
    resumed.train()
    for k, w in weights(resumed).items():
        torch.testing.assert_close(w, weights(straight)[k], atol=0, rtol=0, msg=k)
    assert metric_rows(tmp_path / "resumed") == metric_rows(tmp_path / "straight")


@needs_torchao
def test_an_8bit_checkpoint_does_not_resume_as_float32(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    Trainer(load_config(QUICKSTART, [*shrink(QUICKSTART, tiny_model_dir, run, 1), "models.main.optim.states=8bit"]),
            progress=False).train()
    resumed = load_config(QUICKSTART, shrink(QUICKSTART, tiny_model_dir, run, 2))
    with pytest.raises(ValueError, match=r"config differs .* in models.main.optim.states \('8bit' -> 'float32'\)"):
        Trainer(resumed, resume=True, allow_change=("train.steps",), progress=False)
    # the change allowed by name, the checkpoint's own check still refuses to read 8-bit moments as float32
    with pytest.raises(ValueError, match=r"8-bit AdamW moments but models.main.optim.states is 'float32'"):
        Trainer(resumed, resume=True, allow_change=("train.steps", "models.main.optim.states"), progress=False)


def test_8bit_without_torchao_says_what_to_install(monkeypatch):
    monkeypatch.setattr(lowbit, "available", lambda: False)
    with pytest.raises(ImportError, match=r"optim.states: 8bit needs torchao \(pip install 'teamrl\[lowbit\]'\)"):
        lowbit.adamw_8bit([{"params": [torch.nn.Parameter(torch.zeros(2))]}], betas=(0.9, 0.999))


def test_unknown_states_value_is_rejected():
    with pytest.raises(ValueError, match=r"optim.states"):
        load_config(QUICKSTART, ["models.main.optim.states=4bit"])
