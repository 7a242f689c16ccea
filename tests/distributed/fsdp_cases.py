"""Learner cases run by tests/distributed/test_fsdp.py: once by FSDP2 workers (one process per rank, gloo)
and once by a single in-process learner on all rows. Module-level so spawned processes can import them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from teamrl.learner.learner import LearnerSettings, TorchLearner
from teamrl.learner.safestate import load_state, save_state
from teamrl.team.records import Step

VOCAB = 97
AGENT_WEIGHTS = {"a": 1.0, "b": 0.5}
CASES: dict[str, dict[str, Any]] = {
    # small micro-batches: the ranks pack their rows into different numbers of micro-batches
    "uneven": {"micro_batch_tokens": 40, "grad_clip": 0.5},
    # a frozen KL reference (sharded too), an entropy bonus, two optimizer steps on recomputed old log-probs
    "kl_entropy_recompute": {"kl_coef": 0.1, "entropy_coef": 0.01, "updates_per_batch": 2,
                             "old_logprobs": "recompute", "micro_batch_tokens": 64},
    "checkpointing": {"micro_batch_tokens": 64, "checkpointing": True},
    # packed rows with shared prefixes (rows 0-4 and 5-9 share their group's first tokens), checkpointed layers
    "packed_shared": {"micro_batch_tokens": 48, "pack_rows": True, "share_prefixes": True, "checkpointing": True},
    # masked IS: sampler ratios e^(+-0.3) against a range of [1/1.2, 1.2] drop some tokens on each rank, and the
    # denominators must count the tokens kept on every rank
    "token_mis": {"rollout_correction": "token-mis", "correction_threshold": 1.2, "old_logprobs": "recompute",
                  "micro_batch_tokens": 40},
}


def settings(**kw: Any) -> LearnerSettings:
    base: dict[str, Any] = dict(lr=1e-2, betas=(0.9, 0.999), weight_decay=0.01, grad_clip=0.0, warmup_steps=0,
                                schedule="constant", total_steps=10, clip_low=0.2, clip_high=0.2, dual_clip=None,
                                agg="token-mean", level="token", kl_coef=0.0, kl_kind="k3", entropy_coef=0.0,
                                micro_batch_tokens=100_000, updates_per_batch=1)
    base.update(kw)
    return LearnerSettings(**base)


def tiny_model(checkpointing: bool = False) -> torch.nn.Module:
    """A 2-layer Llama with tied embeddings (the root FSDP unit holds the shared matrix)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from teamrl.runtime.local import enable_checkpointing

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)).float()
    if checkpointing:
        enable_checkpointing(model)
    return model


def rows(seed: int) -> list[Step]:
    """9 rows of agent a (lengths 10 to 26) and 1 row of agent b: with 2 workers, rank 1 has no row of b. Rows 0-4
    and 5-9 start with their group's 4 tokens (shared prefixes for the packed case)."""
    g = torch.Generator().manual_seed(seed)
    heads = [torch.randint(1, VOCAB, (4,), generator=g).tolist() for _ in range(2)]
    out = []
    for i in range(10):
        agent = "b" if i == 9 else "a"
        prompt = heads[i // 5] + torch.randint(1, VOCAB, (3 + 2 * (i % 5),), generator=g).tolist()
        resp = torch.randint(1, VOCAB, (3 + (i * 7) % 9,), generator=g).tolist()
        logp = (-4.6 + 0.6 * torch.rand(len(resp), generator=g) - 0.3).tolist()  # near the initial policy
        out.append(Step(prompt_index=i // 5, episode=i, agent=agent, agent_call=0, model="m", prompt_ids=prompt,
                        response_ids=resp, logprobs=logp, temperature=1.0, text="", valid=True,
                        advantage=float(i % 3) - 0.8))
    return out


def learner(case: str, dp: Any = None, device: str = "cpu") -> TorchLearner:
    kw = dict(CASES[case])
    model = tiny_model(kw.pop("checkpointing", False)).to(device)
    return TorchLearner("m", model, settings(**kw), AGENT_WEIGHTS, dp=dp)


def run(case: str, lrn: TorchLearner, out: Path | None, start: Path | None = None) -> None:
    """Two updates (after loading ``start``'s weights and optimizer state, if given); rank 0 (or a single
    learner) writes the metrics, whole weights and optimizer state to ``out``."""
    if start is not None:
        saved = load_state(start)
        lrn.load_weight_files(saved["weights"])
        lrn.load_state_dict(saved["state"])
    metrics = [lrn.update(rows(seed)) for seed in (1, 2)]
    weights, state = lrn.weight_files(), lrn.state_dict()  # collectives under FSDP: every rank calls them
    weights = {k: {n: t.clone() for n, t in v.items()} for k, v in weights.items()}  # tied matrices: two copies
    if out is not None:
        save_state(out, {"metrics": metrics, "weights": weights, "state": state})


def worker(rank: int, world: int, port: int, out_dir: str, start: str | None, device: str = "cpu",
           offload: bool = False) -> None:
    """One FSDP2 rank (gloo on the CPU; NCCL on GPU ``rank`` with ``device`` cuda): every case, then the resume
    case (from ``start``) if given."""
    import torch.distributed as dist

    from teamrl.runtime.distributed.dp import ShardedDataParallel

    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    dist.init_process_group("nccl" if device != "cpu" else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        for case in CASES:
            lrn = learner(case, ShardedDataParallel(rank, world, offload=offload), device)
            run(case, lrn, Path(out_dir) / f"{case}.safetensors" if rank == 0 else None)
        if start is not None:
            lrn = learner("uneven", ShardedDataParallel(rank, world, offload=offload), device)
            run("uneven", lrn, Path(out_dir) / "resumed.safetensors" if rank == 0 else None, Path(start))
        dist.barrier()  # both ranks done with every collective before either tears the group down
    finally:
        dist.destroy_process_group()
