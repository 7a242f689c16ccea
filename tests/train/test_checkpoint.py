"""Checkpoints never execute code: safetensors and JSON only, old pickles refused."""

from __future__ import annotations

import pickle
import random
import shutil
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from teamrl.config.schema import load_config
from teamrl.learner import checkpoint
from teamrl.learner.safestate import CheckpointError, load_state, load_weights, pack, save_state, save_weights, unpack
from teamrl.train.trainer import Trainer
from tests.conftest import REPO

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**62, 2**62), st.text(max_size=5),
                    st.floats(allow_nan=False), st.sampled_from((float("inf"), float("-inf"))))
tensors = st.builds(lambda n, dt: torch.arange(n).to(dt), st.integers(0, 4),
                    st.sampled_from((torch.float32, torch.bfloat16, torch.int64, torch.uint8)))
keys = st.one_of(st.text(max_size=4), st.integers(-3, 3), st.just("__tensor__"))
trees = st.recursive(st.one_of(scalars, tensors), lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.lists(inner, max_size=3).map(tuple),
    st.dictionaries(keys, inner, max_size=3)), max_leaves=12)


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(b) is dict and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@settings(max_examples=60, deadline=None)
@given(trees)
def test_state_round_trips_exactly(tmp_path_factory, tree):
    path = tmp_path_factory.mktemp("s") / "state.safetensors"
    save_state(path, {"tree": tree})
    assert same(load_state(path), {"tree": tree})


def test_python_and_torch_rng_round_trip(tmp_path):
    random.seed(3)
    torch.manual_seed(3)
    save_state(tmp_path / "rng.safetensors", checkpoint.rng_state())
    expected = (random.random(), torch.rand(3))
    random.seed(99)
    torch.manual_seed(99)
    checkpoint.set_rng_state(load_state(tmp_path / "rng.safetensors"))
    got = (random.random(), torch.rand(3))
    assert got[0] == expected[0] and torch.equal(got[1], expected[1])


def test_unknown_types_are_refused_when_saving():
    with pytest.raises(TypeError, match=r"state\.optimizer\.fn of type function"):
        pack({"optimizer": {"fn": lambda: 0}})


def test_unknown_markers_are_refused_when_loading():
    with pytest.raises(CheckpointError, match="__reduce__"):
        unpack({"__reduce__": ["os.system", "true"]}, {})
    with pytest.raises(CheckpointError, match="t9"):
        unpack({"__tensor__": "t9"}, {})


def test_tied_weights_are_stored_once_and_come_back_tied(tmp_path):
    emb = torch.randn(5, 3)
    save_weights(tmp_path / "w.safetensors", {"embed.weight": emb, "lm_head.weight": emb, "norm": torch.ones(3)})
    back = load_weights(tmp_path / "w.safetensors")
    assert set(back) == {"embed.weight", "lm_head.weight", "norm"}
    assert torch.equal(back["lm_head.weight"], emb) and back["lm_head.weight"] is back["embed.weight"]


class Payload:
    """Unpickling this creates a file: proof that code ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def plant(path, marker) -> None:
    path.write_bytes(pickle.dumps({"state": Payload(marker)}))


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, tiny_model_dir):
    run = tmp_path_factory.mktemp("ckpt") / "run"
    cfg = load_config(None, [f"run_dir={run}", f"models.main.path={tiny_model_dir}", "rollout.batch_size=2",
                             "rollout.group_size=2", "train.steps=1", "eval.before=false", "eval.after=false",
                             "agents.solver.max_new_tokens=4", "agents.verifier.max_new_tokens=4"])
    Trainer(cfg, progress=False).train()
    return run


def test_checkpoint_files_are_safetensors_only(trained_run):
    files = {p.name for p in (trained_run / "checkpoints" / "step_1").iterdir()}
    assert files == {"model-main.safetensors", "optim-main.safetensors", "trainer.safetensors"}


def test_a_planted_pickle_is_refused_and_never_runs(trained_run, tmp_path, tiny_model_dir):
    ckpt = tmp_path / "run"
    shutil.copytree(trained_run, ckpt)
    step = ckpt / "checkpoints" / "step_1"
    marker = tmp_path / "pwned"
    plant(step / "optim-main.safetensors", marker)  # a pickle where the optimizer state belongs
    cfg = load_config(None, [f"run_dir={ckpt}", f"models.main.path={tiny_model_dir}", "rollout.batch_size=2",
                             "rollout.group_size=2", "train.steps=2", "eval.before=false", "eval.after=false"])
    with pytest.raises(CheckpointError, match="optim-main.safetensors is not a readable safetensors file"):
        Trainer(cfg, resume=True, allow_change=("train.steps", "agents"), progress=False)
    assert not marker.exists()


def test_an_old_pickle_checkpoint_is_refused_by_eval_with_one_line(trained_run, tmp_path, tiny_model_dir):
    ckpt = tmp_path / "old" / "checkpoints" / "step_1"
    ckpt.mkdir(parents=True)
    marker = tmp_path / "pwned"
    for name in ("model-main.pt", "optim-main.pt", "trainer.pt"):
        plant(ckpt / name, marker)
    (ckpt.parent / "latest").write_text("step_1")
    proc = subprocess.run([sys.executable, "-m", "teamrl.cli", "eval", f"models.main.path={tiny_model_dir}",
                           "--checkpoint", str(ckpt.parent.parent), "--out", str(tmp_path / "ev"), "--k", "1",
                           "eval.problems=2", "agents.solver.max_new_tokens=2", "agents.verifier.max_new_tokens=2"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "old pickle format" in errors[0] and "Traceback" not in proc.stderr
    assert not marker.exists()


def test_eval_reads_weights_only(trained_run, tmp_path, tiny_model_dir):
    # optimizer and trainer state damaged: evaluation still loads the weights
    ckpt = tmp_path / "run"
    shutil.copytree(trained_run, ckpt)
    step = ckpt / "checkpoints" / "step_1"
    (step / "optim-main.safetensors").write_bytes(b"garbage")
    cfg = load_config(None, [f"run_dir={tmp_path / 'ev'}", f"models.main.path={tiny_model_dir}"])
    tr = Trainer(cfg, progress=False)
    tr.load_weights(ckpt)
    saved = load_weights(step / "model-main.safetensors")
    for n, p in tr.models["main"].state_dict().items():
        assert torch.equal(p, saved[n]), n


def fake_checkpoints(root, steps_, latest_step):
    for s in steps_:
        d = root / f"step_{s}"
        d.mkdir(parents=True)
        for name in ("model-main.safetensors", "optim-main.safetensors", "trainer.safetensors"):
            (d / name).write_bytes(b"x")
    (root / "latest").write_text(f"step_{latest_step}")


def test_prune_keeps_the_newest_whole_and_older_ones_as_weights():
    # steps 2, 4, 6, 8 with keep 2: step_8 (the newest) whole, step_6 weights + trainer state, steps 2 and 4 gone
    import tempfile
    from pathlib import Path

    root = Path(tempfile.mkdtemp())
    fake_checkpoints(root, [2, 4, 6, 8], 8)
    (root / "step_10").mkdir()  # not a checkpoint (no trainer state): left alone
    checkpoint.prune(root, 2)
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["step_10", "step_6", "step_8"]
    assert {p.name for p in (root / "step_8").iterdir()} == {"model-main.safetensors", "optim-main.safetensors",
                                                             "trainer.safetensors"}
    assert {p.name for p in (root / "step_6").iterdir()} == {"model-main.safetensors", "trainer.safetensors"}
    checkpoint.prune(root, 1)
    assert checkpoint.steps(root) == [8]
    with pytest.raises(ValueError, match="train.keep_checkpoints 0 would keep no checkpoint to resume from"):
        checkpoint.prune(root, 0)
    shutil.rmtree(root)


def test_keep_checkpoints_zero_is_refused_in_one_line():
    with pytest.raises(ValueError) as err:
        load_config(None, ["train.keep_checkpoints=0"])
    lines = [line for line in str(err.value).splitlines() if "keep_checkpoints" in line]
    assert len(lines) == 1 and "would keep no checkpoint to resume from; set it to 1 or more" in lines[0]


def test_a_run_keeps_its_newest_checkpoints_and_resumes_from_the_newest(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    common = [f"run_dir={run}", f"models.main.path={tiny_model_dir}", "rollout.batch_size=2", "rollout.group_size=2",
              "train.save_every=1", "train.keep_checkpoints=2", "eval.before=false", "eval.after=false",
              "agents.solver.max_new_tokens=4", "agents.verifier.max_new_tokens=4"]
    Trainer(load_config(None, [*common, "train.steps=3"]), progress=False).train()
    root = run / "checkpoints"
    assert checkpoint.steps(root) == [2, 3] and (root / "latest").read_text() == "step_3"
    assert not list((root / "step_2").glob("optim-*")) and (root / "step_3" / "optim-main.safetensors").is_file()
    resumed = Trainer(load_config(None, [*common, "train.steps=4"]), resume=True, allow_change=("train.steps",), progress=False)
    assert resumed.start_step == 3
    resumed.train()
    assert checkpoint.steps(root) == [3, 4] and not list((root / "step_3").glob("optim-*"))
    (root / "latest").write_text("step_3")  # a resume pointed at a weights-only checkpoint: one clear refusal
    with pytest.raises(CheckpointError, match="holds weights only, no optimizer state of model 'main'"):
        Trainer(load_config(None, [*common, "train.steps=5"]), resume=True, allow_change=("train.steps",), progress=False)


def test_the_final_evaluation_runs_without_adamw_state_and_the_checkpoint_keeps_it(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    common = [f"run_dir={run}", f"models.main.path={tiny_model_dir}", "rollout.batch_size=2", "rollout.group_size=2",
              "eval.before=false", "eval.problems=2", "eval.samples=1", "agents.solver.max_new_tokens=4",
              "agents.verifier.max_new_tokens=4", "loss.entropy_coef=0.001"]  # every row trains: AdamW has state
    trainer = Trainer(load_config(None, [*common, "train.steps=1"]), progress=False)
    seen = {}
    evaluate = trainer.evaluate

    def spy(tag, task=None):  # the optimizer's state while the final evaluation runs
        seen[tag] = len(trainer.learners["main"].optimizer.state)
        return evaluate(tag, task)

    trainer.evaluate = spy
    optim = run / "checkpoints" / "step_1" / "optim-main.safetensors"
    trainer.train()
    assert seen == {"after": 0}  # freed: 8 B per trained parameter less at the run's last phase
    written = optim.read_bytes()
    assert load_state(optim)["optimizer"]["state"]  # the moments of the last update are on disk ...
    state = load_state(run / "checkpoints" / "step_1" / "trainer.safetensors")
    assert state["step"] == 1 and set(state["results"]) == {"after"}  # ... and the final results beside them
    with pytest.raises(RuntimeError, match="optimizer state was freed at the end of training"):
        trainer.learners["main"].state_dict()
    resumed = Trainer(load_config(None, [*common, "train.steps=2"]), resume=True, allow_change=("train.steps",), progress=False)
    assert resumed.start_step == 1 and len(resumed.learners["main"].optimizer.state) > 0
    assert optim.read_bytes() == written
