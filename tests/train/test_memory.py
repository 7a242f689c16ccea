"""Memory savers: chunked log-probs and entropy, gradient checkpointing, micro-batch size from free memory."""

from __future__ import annotations

import logging

import pytest
import torch

from teamrl.algos.losses import chunked_logprobs
from teamrl.config.schema import load_config
from teamrl.learner.learner import TorchLearner, checkpointing_on, response_logprobs
from teamrl.plan import checkpointed_layers
from teamrl.runtime import local
from teamrl.team.records import Step


def _head_case(seed: int = 0, n: int = 37, h: int = 16, v: int = 301):
    g = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(h, v, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(v, h, generator=g) * 0.25)  # logits of a few units, as a trained head gives
    hidden = torch.randn(n, h, generator=g, requires_grad=True)
    tokens = torch.randint(0, v, (n,), generator=g)
    temps = torch.rand(n, generator=g) + 0.5
    return head, hidden, tokens, temps


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_chunks_give_the_unchunked_values_and_gradients(entropy_grad):
    head, hidden, tokens, temps = _head_case()
    results = {}
    for chunk in (0, 5, 16, 37, 100):
        head.zero_grad()
        hidden.grad = None
        logp, ent = chunked_logprobs(head, hidden, tokens, temps, chunk=chunk, entropy_grad=entropy_grad)
        assert ent.requires_grad == entropy_grad
        (logp.sum() + (0.3 * ent.sum() if entropy_grad else 0)).backward()
        results[chunk] = (logp.detach(), ent.detach(), hidden.grad.clone(), head.weight.grad.clone())
    for chunk, got in results.items():
        for a, b in zip(got, results[0], strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6, msg=f"chunk {chunk}")
    # the one-chunk path is the unchunked computation itself
    assert all(torch.equal(a, b) for a, b in zip(results[100], results[0], strict=True))


def test_chunks_without_autograd_match_too():
    head, hidden, tokens, temps = _head_case(seed=1)
    with torch.no_grad():
        whole = chunked_logprobs(head, hidden, tokens, temps)
        parts = chunked_logprobs(head, hidden, tokens, temps, chunk=7)
    for a, b in zip(parts, whole, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="must be >= 0"):
        chunked_logprobs(head, hidden, tokens, temps, chunk=-1)


def _rows(n: int = 4) -> list[Step]:
    return [Step(prompt_index=0, episode=i, agent="solver", agent_call=0, model="main", prompt_ids=[5, 6, 7 + i],
                 response_ids=list(range(20 + i, 28 + 2 * i)), logprobs=[-1.0] * (8 + i), temperature=0.7,
                 text="", valid=True, advantage=0.6 - i / 4) for i in range(n)]


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_response_logprobs_in_chunks_and_with_checkpointing_match(tokenizer):
    from tests.conftest import make_tiny_model

    model = make_tiny_model(tokenizer).train()
    out = {}
    for label, chunk, ckpt in [("plain", 0, False), ("chunked", 5, False), ("half checkpointed", 0, 0.5),
                               ("checkpointed", 0, 1.0)]:
        if ckpt:
            local.enable_checkpointing(model, ckpt)
            flags = [layer.gradient_checkpointing for layer in model.model.layers]
            assert flags == [i in checkpointed_layers(len(flags), ckpt) for i in range(len(flags))], flags
            assert 0 < sum(flags) < len(flags) if ckpt < 1 else all(flags), flags
        model.zero_grad()
        logp, ent, mask = response_logprobs(model, _rows(), chunk=chunk, entropy_grad=True)
        (logp.sum() - 0.1 * ent.sum()).backward()
        out[label] = (logp.detach(), ent.detach(), _grads(model))
    for label in ("chunked", "half checkpointed", "checkpointed"):
        torch.testing.assert_close(out[label][0], out["plain"][0], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(out[label][1], out["plain"][1], atol=1e-6, rtol=1e-6)
        assert out[label][2].keys() == out["plain"][2].keys()
        for n, g in out[label][2].items():  # float summation order: within 5e-6 of the largest entry
            ref = out["plain"][2][n]
            assert float((g - ref).abs().max()) <= 5e-6 * float(ref.abs().max()), f"{label} {n}"


def test_gradient_checkpointing_key_reaches_the_model_with_lora(tiny_model_dir):
    pytest.importorskip("peft")
    cfg = load_config(None, [f"models.main.path={tiny_model_dir}", "models.main.gradient_checkpointing=true",
                             "models.main.lora.rank=4", "agents.solver.adapter=solver", "agents.verifier.adapter=verifier"])
    rt = local.build(cfg)
    models, learners = rt.modules, rt.learners
    assert checkpointing_on(models["main"])
    stats = learners["main"].update(_rows())
    assert stats["grad_norm"] > 0 and stats["rows_trained"] == 4


def test_checkpoint_layers_is_checked_and_reaches_the_model(tiny_model_dir):
    from teamrl.learner.settings import checkpointed_fraction

    for bad, match in [("models.main.checkpoint_layers=0", r"must be in \(0, 1\]"),
                       ("models.main.checkpoint_layers=1.5", r"must be in \(0, 1\]")]:
        with pytest.raises(ValueError, match=match):
            load_config(None, [bad, "models.main.gradient_checkpointing=true"])
    with pytest.raises(ValueError, match="needs gradient_checkpointing: true"):
        load_config(None, ["models.main.checkpoint_layers=0.5", "models.main.gradient_checkpointing=false"])
    cfg = load_config(None, [f"models.main.path={tiny_model_dir}", "models.main.gradient_checkpointing=true",
                             "models.main.checkpoint_layers=0.5"])
    rt = local.build(cfg)
    assert checkpointed_fraction(rt.modules["main"]) == 0.5
    assert rt.learners["main"].update(_rows())["rows_trained"] == 4


def test_auto_micro_batch_is_chosen_and_logged(tiny_model_dir, caplog):
    cfg = load_config(None, [f"models.main.path={tiny_model_dir}", "loss.micro_batch_tokens=auto"])
    with caplog.at_level(logging.INFO, logger="teamrl.learner.learner"):
        learners = local.build(cfg).learners
    mbt = learners["main"].s.micro_batch_tokens
    assert isinstance(mbt, int) and 256 <= mbt <= 1 << 20 and mbt % 256 == 0
    assert any("micro_batch_tokens auto ->" in r.getMessage() for r in caplog.records)
    assert learners["main"].update(_rows())["rows_trained"] == 4


def test_cpu_uses_the_fused_adamw_except_for_fsdp_shards(tiny_model_dir):
    cfg = load_config(None, [f"models.main.path={tiny_model_dir}", "models.main.device=cpu"])
    learners = local.build(cfg).learners
    assert learners["main"].s.fused_adamw
    assert learners["main"].optimizer.defaults["fused"] is True
    assert isinstance(learners["main"], TorchLearner)
    # the fused kernel writes the weights without counting it; the step counts it, for the engine's decode copies
    params = list(learners["main"].model.parameters())
    before = [p._version for p in params]
    assert learners["main"].update(_rows())["rows_trained"] == 4
    assert all(p._version > v for p, v in zip(params, before))
    mc = cfg.models["main"]
    mc.placement.sharding = "fsdp"
    assert not local.fused_adamw(mc)
    mc.device = "cuda:0"
    assert local.fused_adamw(mc)


def test_the_fused_adamw_steps_as_the_per_tensor_one():
    """Ten steps with weight decay over tensors of three shapes: the weights and both moments of torch's fused step
    agree with its per-tensor loop's to float32 rounding, and the weights moved."""
    shapes = [(300, 64), (64,), (7, 3)]
    start = [torch.randn(s, generator=torch.Generator().manual_seed(i)) for i, s in enumerate(shapes)]
    runs = []
    for fused in (False, True):
        ps = [torch.nn.Parameter(t.clone()) for t in start]
        opt = torch.optim.AdamW(ps, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1, **({"fused": True} if fused else {}))
        g = torch.Generator().manual_seed(1)
        for _ in range(10):
            for p in ps:
                p.grad = torch.randn(p.shape, generator=g)
            opt.step()
        runs.append((ps, opt))
    (plain, po), (fused, fo) = runs
    for t, a, b in zip(start, plain, fused):
        assert (a.detach() - t).abs().max() > 0.05  # ten steps of lr 1e-2
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(fo.state[b][key], po.state[a][key], rtol=1e-5, atol=1e-7)
