"""FSDP2 data-parallel learners (``placement.sharding: fsdp``) on CPU with gloo: two workers, each holding half
of every weight, gradient and AdamW moment, give the update of one learner on all rows.

Covered: micro-batch counts that differ between the workers and an agent with rows on one worker
only (the other runs idle passes, or the collectives would hang), gradient clipping and per-agent
gradient norms over shards, a sharded KL reference, entropy, recomputed old log-probs with two
optimizer steps, gradient checkpointing, and checkpoints: whole weights and optimizer state in the
unsharded format, loaded into sharded workers and back.
"""

from __future__ import annotations

import socket

import pytest
import torch
import torch.multiprocessing as mp

from teamrl.learner.safestate import load_state, save_state
from tests.distributed import fsdp_cases as fc

TOL = 2e-5  # the workers sum their gradients in another order than one learner does

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """Every case run by 2 FSDP workers, and the resume case from a one-learner checkpoint."""
    out = tmp_path_factory.mktemp("fsdp")
    single = fc.learner("uneven")
    fc.run("uneven", single, out / "start.safetensors")  # 2 updates, then its checkpoint
    mp.spawn(fc.worker, args=(2, free_port(), str(out), str(out / "start.safetensors")), nprocs=2)
    return out


def assert_same(got: dict, want: dict, tol: float = TOL) -> None:
    for step, (mg, mw) in enumerate(zip(got["metrics"], want["metrics"], strict=True)):
        assert mg.keys() == mw.keys(), step
        for k in mw:
            if k in ("perf/update_tokens_computed", "perf/micro_batches", "perf/logprob_tokens", "perf/logprobs_s"):
                continue  # padding and micro-batches depend on which rows share a worker; seconds are seconds
            assert mg[k] == pytest.approx(mw[k], rel=1e-4, abs=tol), (step, k)
    wg, ww = got["weights"]["model-m"], want["weights"]["model-m"]
    assert wg.keys() == ww.keys()
    for n in ww:
        torch.testing.assert_close(wg[n], ww[n], atol=tol, rtol=0, msg=n)
    og, ow = got["state"]["optimizer"], want["state"]["optimizer"]
    assert og["state"].keys() == ow["state"].keys() and len(og["state"]) == len(list(fc.tiny_model().parameters()))
    for i in ow["state"]:
        for k in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(og["state"][i][k], ow["state"][i][k], atol=tol, rtol=1e-4, msg=f"{i} {k}")
    assert [g["params"] for g in og["param_groups"]] == [g["params"] for g in ow["param_groups"]]


@pytest.mark.slow  # two sharded worker processes train every case (about 15 s)
@pytest.mark.parametrize("case", list(fc.CASES))
def test_two_sharded_workers_equal_one_learner(sharded, tmp_path, case):
    fc.run(case, fc.learner(case), tmp_path / "one.safetensors")
    want, got = load_state(tmp_path / "one.safetensors"), load_state(sharded / f"{case}.safetensors")
    assert_same(got, want)
    m = want["metrics"][0]
    assert m["rows_trained"] > 0 and m["agent/b/grad_norm"] > 0 and m["agent/a/grad_norm"] > 0  # not vacuous
    if fc.CASES[case].get("rollout_correction", "none").endswith("mis"):  # some tokens masked, not all
        assert 0 < m["mismatch/model/m/masked_frac"] < 1
    start = fc.tiny_model().state_dict()
    assert all(not torch.equal(got["weights"]["model-m"][n], start[n]) for n in start)  # every tensor was trained


def test_uneven_case_really_is_uneven():
    """Rank 0 of 2 packs agent a's rows into more micro-batches than rank 1, and has b's only row."""
    from teamrl.learner.learner import pack_micro_batches

    rows_a = [r for r in fc.rows(1) if r.agent == "a"]
    budget = fc.CASES["uneven"]["micro_batch_tokens"]
    counts = [len(pack_micro_batches([len(r.prompt_ids) + len(r.response_ids) for r in rows_a[k::2]], budget))
              for k in (0, 1)]
    assert counts[0] != counts[1]


@pytest.mark.slow  # the sharded workers' fixture above
def test_sharded_workers_resume_a_one_learner_checkpoint_and_write_one_it_reads(sharded, tmp_path):
    """Weights and AdamW state written by one learner load into the shards; the two updates that follow equal
    the one learner's; and what the sharded workers write loads back into a single learner."""
    start = sharded / "start.safetensors"
    fc.run("uneven", fc.learner("uneven"), tmp_path / "one.safetensors", start)
    got = load_state(sharded / "resumed.safetensors")
    assert_same(got, load_state(tmp_path / "one.safetensors"))
    assert got["state"]["optimizer"]["state"][0]["step"] == 4  # two updates before the checkpoint, two after
    back = fc.learner("uneven")
    back.load_weight_files(got["weights"])
    back.load_state_dict(got["state"])
    weights = {k: {n: t.clone() for n, t in v.items()} for k, v in back.weight_files().items()}
    save_state(tmp_path / "back.safetensors", {"weights": weights, "state": back.state_dict()})
    again = load_state(tmp_path / "back.safetensors")
    for n, t in got["weights"]["model-m"].items():
        assert torch.equal(again["weights"]["model-m"][n], t), n
