"""Every agent→model mapping on a CUDA GPU: 2 steps, resume equality, engine vs learner log-probs,
checkpoints moving between GPU and CPU; FSDP2 learners over NCCL, with and without CPU offload. Marked ``cuda``; skipped where torch sees no GPU.

    pytest -m cuda tests/test_cuda.py
"""

from __future__ import annotations

import json

import pytest
import torch

from teamrl.config.schema import load_config
from teamrl.train.trainer import Trainer

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")]

MAPPINGS = {
    "shared": [],
    "separate": ["models={a: {path: MODEL}, b: {path: MODEL}}", "agents.solver.model=a", "agents.verifier.model=b"],
    "hetero": ["models={a: {path: MODEL}, b: {path: OTHER}}", "agents.solver.model=a", "agents.verifier.model=b"],
    "lora": ["models.main.lora.rank=4", "agents.solver.adapter=solver", "agents.verifier.adapter=verifier"],
}


@pytest.fixture(scope="module")
def other_model_dir(tokenizer, tmp_path_factory):
    from tests.conftest import make_tiny_model

    out = tmp_path_factory.mktemp("tiny-other")
    make_tiny_model(tokenizer, seed=1, hidden=32, layers=3).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def config(tmp_path, model_dir, other_dir, mapping: str, run: str, *extra: str):
    over = [o.replace("MODEL", str(model_dir)).replace("OTHER", str(other_dir)) for o in MAPPINGS[mapping]]
    return load_config(None, [
        f"run_dir={tmp_path / run}", f"models.main.path={model_dir}", "rollout.batch_size=2", "rollout.group_size=3",
        "train.steps=2", "train.save_every=1", "eval.before=false", "eval.after=false",
        "agents.solver.max_new_tokens=6", "agents.verifier.max_new_tokens=4", "algo.format_penalty=0.5",
        *over, *extra])


@pytest.mark.parametrize("mapping", sorted(MAPPINGS))
def test_mapping_trains_on_the_gpu_and_resumes_exactly(mapping, tmp_path, tiny_model_dir, other_model_dir):
    straight = Trainer(config(tmp_path, tiny_model_dir, other_model_dir, mapping, "straight"), progress=False)
    assert all(p.device.type == "cuda" for m in straight.models.values() for p in m.parameters())
    straight.train()
    first = Trainer(config(tmp_path, tiny_model_dir, other_model_dir, mapping, "resumed", "train.steps=1"),
                    progress=False)
    first.train()
    second = Trainer(config(tmp_path, tiny_model_dir, other_model_dir, mapping, "resumed"), resume=True, allow_change=("train.steps",), progress=False)
    second.train()
    for name in straight.models:
        for (n, p), (_, q) in zip(straight.models[name].named_parameters(),
                                  second.models[name].named_parameters(), strict=True):
            torch.testing.assert_close(p, q, atol=0, rtol=0, msg=n)
    metrics = [json.loads(l) for l in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert any(k.startswith("perf/cuda_max_allocated_gb/") for k in metrics[0])
    assert "perf/mfu/update" in metrics[0] and "perf/tokens_per_s/update" in metrics[0]


@pytest.mark.parametrize("mapping", ["shared", "lora"])
def test_engine_and_learner_logprobs_agree_on_the_gpu(mapping, tmp_path, tiny_model_dir, other_model_dir):
    from teamrl.engines.base import GenRequest, SamplingParams
    from teamrl.learner.learner import response_logprobs
    from teamrl.team.records import Step

    tr = Trainer(config(tmp_path, tiny_model_dir, other_model_dir, mapping, "gap", "models.main.dtype=float32",
                        "models.main.rollout_dtype=same", "models.main.train_autocast=none"), progress=False)
    engine, model = tr.engines["main"], tr.models["main"]
    reqs = [GenRequest(prompt_ids=[1, 2, 3, 4 + i], sampling=SamplingParams(temperature=1.0, max_new_tokens=8),
                       adapter="solver" if mapping == "lora" else None) for i in range(4)]
    outs = engine.generate(reqs)
    rows = [Step(prompt_index=0, episode=i, agent="solver", agent_call=0, model="main", prompt_ids=r.prompt_ids,
                 response_ids=o.response_ids, logprobs=o.logprobs, temperature=1.0, text=o.text, valid=True)
            for i, (r, o) in enumerate(zip(reqs, outs))]
    if mapping == "lora":
        model.set_adapter("solver")
    with torch.no_grad():
        logp, _, _ = response_logprobs(model, rows)
    gap = max(float((logp[b, : len(o.logprobs)].cpu() - torch.tensor(o.logprobs)).abs().max())
              for b, o in enumerate(outs))
    assert gap < 1e-4


def test_checkpoints_move_between_gpu_and_cpu(tmp_path, tiny_model_dir, other_model_dir):
    gpu = Trainer(config(tmp_path, tiny_model_dir, other_model_dir, "shared", "gpu", "train.steps=1"), progress=False)
    gpu.train()
    cpu = Trainer(config(tmp_path, tiny_model_dir, other_model_dir, "shared", "gpu", "models.main.device=cpu"),
                  resume=True, allow_change=("train.steps",), progress=False)
    for (n, p), (_, q) in zip(gpu.models["main"].named_parameters(),
                              cpu.models["main"].named_parameters(), strict=True):
        assert q.device.type == "cpu"
        torch.testing.assert_close(p.cpu(), q, atol=0, rtol=0, msg=n)
    cpu.train()  # the optimizer state loaded from GPU tensors steps on the CPU
    back = Trainer(config(tmp_path, tiny_model_dir, other_model_dir, "shared", "gpu", "train.steps=3"),
                   resume=True, allow_change=("train.steps",), progress=False)
    assert next(back.models["main"].parameters()).device.type == "cuda"
    back.train()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_separate_models_take_separate_gpus(tmp_path, tiny_model_dir, other_model_dir):
    tr = Trainer(config(tmp_path, tiny_model_dir, other_model_dir, "separate", "two"), progress=False)
    assert {n: next(m.parameters()).device.index for n, m in tr.models.items()} == {"a": 0, "b": 1}
    tr.train()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graphs_replay_what_the_eager_steps_compute(dtype, tokenizer):
    """The device loop with CUDA graphs vs the same loop launched kernel by kernel vs the host loop: greedy
    tokens equal; after an in-place weight update the captured graphs compute what fresh eager steps compute."""
    from teamrl.engines.base import GenRequest, SamplingParams
    from teamrl.engines.hf import HFEngine
    from tests.engines.test_device_loop import _agree, _peaky, _requests
    from tests.engines.test_fast_decoder import _tiny

    model = _peaky(_tiny("qwen2", tokenizer)).to("cuda", dtype)
    reqs = _requests(21)
    engines = {name: HFEngine(model, tokenizer, max_batch_size=8, seed=3, **kw) for name, kw in
               (("graphs", {}), ("eager", {"cuda_graphs": False}), ("host", {"device_loop": False}))}
    outs = {name: e.generate(reqs) for name, e in engines.items()}
    assert engines["graphs"]._device.graphs is not None and engines["graphs"]._device.graphs.graphs  # captured
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    for other in ("eager", "host"):
        for r, a, b in zip(reqs, outs["graphs"], outs[other], strict=True):
            if dtype == torch.float32:
                _agree(a, b, r.sampling.temperature == 0)
            else:  # bf16: compare the log-probs of the common prefix only
                n = next((i for i, (x, y) in enumerate(zip(a.response_ids, b.response_ids)) if x != y),
                         len(a.response_ids))
                torch.testing.assert_close(torch.tensor(a.logprobs[:n]), torch.tensor(b.logprobs[:n]), atol=tol,
                                           rtol=0)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.01)  # in place, as the optimizer writes
    greedy = [GenRequest(r.prompt_ids, SamplingParams(temperature=0, max_new_tokens=12)) for r in reqs[:6]]
    after = engines["graphs"].generate(greedy)
    fresh = HFEngine(model, tokenizer, max_batch_size=8, cuda_graphs=False).generate(greedy)  # same kernels, eager
    assert [o.response_ids for o in after] == [o.response_ids for o in fresh]


@pytest.mark.parametrize("world, offload", [(1, True), (2, False), (2, True)])
def test_fsdp_learners_on_gpus_equal_one_learner(world, offload, tmp_path):
    """placement.sharding: fsdp over NCCL (with offload: the shards and the optimizer step on the CPU): every
    learner case of tests/distributed/fsdp_cases.py equals one learner on the GPU."""
    import torch.multiprocessing as mp

    from teamrl.learner.safestate import load_state
    from tests.distributed import fsdp_cases as fc
    from tests.distributed.test_fsdp import assert_same, free_port

    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA GPUs (NCCL runs one rank per GPU)")
    mp.spawn(fc.worker, args=(world, free_port(), str(tmp_path), None, "cuda", offload), nprocs=world)
    for case in fc.CASES:
        fc.run(case, fc.learner(case, device="cuda"), tmp_path / f"one-{case}.safetensors")
        assert_same(load_state(tmp_path / f"{case}.safetensors"), load_state(tmp_path / f"one-{case}.safetensors"),
                    tol=1e-4)
