"""The ``hf`` engine's device loop (sampling on the model's device, fixed-shape decode steps that a CUDA
graph can capture) computes what the host loop computes. Run here on the CPU, where the same code
runs without capture; tests/test_cuda.py runs it with CUDA graphs."""

from __future__ import annotations

import pytest
import torch

from teamrl.engines.base import GenRequest, SamplingParams
from teamrl.engines.cuda_graphs import DecodeGraphs
from teamrl.engines.hf import HFEngine
from teamrl.engines.sampling import sample, sample_rows
from tests.engines.test_fast_decoder import _tiny


def _peaky(model):
    """Scale the final norm so that next-token distributions are peaked, as a trained model's are. (A random
    tiny model's are nearly uniform over 49k tokens: there, rounding-level logit differences between two
    attention kernels move the inverse-CDF draw to a neighbouring token.)"""
    with torch.no_grad():
        model.model.norm.weight.mul_(20)
    return model


def _requests(n: int) -> list[GenRequest]:
    """Prompts of 3-6 tokens with mixed temperatures (greedy too), top-p, top-k and lengths."""
    return [GenRequest(list(range(5 + i, 8 + i + i % 4)),
                       SamplingParams(temperature=[1.0, 0.7, 0.0][i % 3], top_p=1.0 if i % 2 else 0.9,
                                      top_k=0 if i % 5 else 4, max_new_tokens=4 + 3 * (i % 5)))
            for i in range(n)]


@pytest.mark.parametrize("trial", range(12))
def test_device_sampler_equals_the_host_sampler_exactly(trial):
    g = torch.Generator().manual_seed(trial)
    b, V = 7, 50
    logits = torch.randn(b, V, generator=g) * 3
    if trial % 3 == 0:
        logits = logits.bfloat16()
    temps = torch.tensor([0.0, 0.7, 1.0, 1.3, 1.0, 0.5, 2.0])
    top_p = torch.tensor([1.0, 0.9, 1.0, 0.5, 1.0, 1.0, 0.95]) if trial % 2 else torch.ones(b)
    top_k = torch.tensor([0, 5, 0, 0, 3, 0, 0]) if trial % 4 == 1 else torch.zeros(b, dtype=torch.long)
    u = torch.rand(b, generator=g)
    t1, l1 = sample(logits, temps, top_p, top_k, None, u=u)
    t2, l2 = sample_rows(logits, temps, top_p, top_k, u, use_top_k=bool((top_k > 0).any()),
                              use_top_p=bool((top_p < 1).any()))
    assert torch.equal(t1, t2)
    assert torch.equal(l1, l2)


@pytest.mark.parametrize("trial", range(6))
def test_host_sampler_without_greedy_rows_skips_only_the_argmax(trial):
    """No row at T = 0: the host sampler leaves out the argmax (any_greedy=False); the same tokens and log-probs."""
    g = torch.Generator().manual_seed(100 + trial)
    logits = torch.randn(9, 300, generator=g) * 4
    temps = torch.tensor([1.0, 0.7, 1.0, 1.3, 1.0, 0.5, 2.0, 1.0, 0.9])
    u = torch.rand(9, generator=g)
    ones, zeros = torch.ones(9), torch.zeros(9, dtype=torch.long)
    t1, l1 = sample(logits, temps, ones, zeros, None, u=u)
    t2, l2 = sample_rows(logits, temps, ones, zeros, u, use_top_k=False, use_top_p=False, any_greedy=True)
    assert torch.equal(t1, t2) and torch.equal(l1, l2)


def _agree(a, b, greedy: bool) -> None:
    """Same tokens for greedy requests; sampled ones agree up to their first difference, which rounding-level
    logit differences (1e-6 here, measured) can cause only where the draw falls in a flat tail of the
    distribution; log-probs agree along the common part."""
    n = next((i for i, (x, y) in enumerate(zip(a.response_ids, b.response_ids)) if x != y), len(a.response_ids))
    if greedy:
        assert a.response_ids == b.response_ids and a.finish_reason == b.finish_reason
    assert n >= min(3, len(a.response_ids))
    torch.testing.assert_close(torch.tensor(a.logprobs[:n]), torch.tensor(b.logprobs[:n]), atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("share_prefix", [0, 2])
def test_device_loop_matches_the_host_loop(arch, share_prefix, tokenizer):
    """13 requests through 5 rows: rows finish at different steps, the last rows move into their
    places, queued requests join the running batch."""
    model = _peaky(_tiny(arch, tokenizer))
    reqs = _requests(13)
    outs = [HFEngine(model, tokenizer, max_batch_size=5, seed=3, share_prefix=share_prefix, device_loop=dev
                     ).generate(reqs) for dev in (False, True)]
    for r, a, b in zip(reqs, *outs, strict=True):
        _agree(a, b, r.sampling.temperature == 0)


def test_device_loop_stops_at_end_of_turn_and_resumes_across_batches(tokenizer):
    """Natural stops (rows ending at different steps) and a second generate on the kept buffers agree with the
    host loop."""
    model = _peaky(_tiny("llama", tokenizer))
    host = HFEngine(model, tokenizer, max_batch_size=4, seed=1, device_loop=False)
    dev = HFEngine(model, tokenizer, max_batch_size=4, seed=1, device_loop=True)
    reqs = [GenRequest([7, 8, 9 + i, 3 * i], SamplingParams(temperature=0.0, max_new_tokens=30)) for i in range(9)]
    probe = host.generate(reqs)
    stops = {probe[0].response_ids[4], probe[3].response_ids[11], probe[6].response_ids[20]}  # tokens it does emit
    host.stop_ids |= stops
    dev.stop_ids |= stops
    for _ in range(2):
        a, b = host.generate(reqs), dev.generate(reqs)
        assert [o.response_ids for o in a] == [o.response_ids for o in b]
        assert {o.finish_reason for o in b} == {"stop", "length"}
    assert dev._device.graphs is not None  # the buffers stay for the next rollout


def test_replaced_parameters_invalidate_the_buffers(tokenizer):
    """Graphs read weights at captured addresses: a parameter replaced (not updated in place) must be noticed."""
    model = _peaky(_tiny("llama", tokenizer))
    eng = HFEngine(model, tokenizer, max_batch_size=4, device_loop=True)
    reqs = [GenRequest([7, 8, 9], SamplingParams(temperature=0, max_new_tokens=3))]
    eng.generate(reqs)
    first = eng._device.graphs
    assert isinstance(first, DecodeGraphs) and first.valid()
    with torch.no_grad():
        model.lm_head.weight.add_(0.01)  # in place: same address, the buffers stay
    eng.generate(reqs)
    assert eng._device.graphs is first
    model.model.norm.weight.data = model.model.norm.weight.data.clone()  # a new tensor: new address
    assert not first.valid()
    greedy_after = eng.generate(reqs)
    assert eng._device.graphs is not first
    assert greedy_after[0].response_ids == HFEngine(model, tokenizer, device_loop=False).generate(reqs)[0].response_ids


def test_device_loop_on_a_synced_bf16_copy_keeps_its_buffers_and_sees_the_update(tokenizer):
    """The shipped configs roll out from a bf16 copy of fp32 weights (rollout_dtype: auto), refreshed by
    sync_weights after each update: the copy is written in place, so the buffers (and on CUDA the captured
    graphs) stay valid and decode with the new weights."""
    model = _peaky(_tiny("llama", tokenizer))
    eng = HFEngine(model, tokenizer, max_batch_size=4, dtype=torch.bfloat16, device_loop=True)
    reqs = [GenRequest([7, 8, 9 + i], SamplingParams(temperature=0, max_new_tokens=6)) for i in range(3)]
    before = eng.generate(reqs)
    first = eng._device.graphs
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(-1.5)  # an "update" of the learner's fp32 weights
    eng.sync_weights()
    after = eng.generate(reqs)
    assert eng._device.graphs is first and first is not None and first.valid()
    fresh = HFEngine(model, tokenizer, max_batch_size=4, dtype=torch.bfloat16, device_loop=True).generate(reqs)
    assert [o.response_ids for o in after] == [o.response_ids for o in fresh]
    assert [o.response_ids for o in after] != [o.response_ids for o in before]


@pytest.mark.parametrize("graphs", [True, False])
def test_release_memory_frees_the_cache_unless_graphs_hold_it(graphs, tokenizer):
    eng = HFEngine(_tiny("llama", tokenizer), tokenizer, device_loop=True, cuda_graphs=graphs)
    eng.generate([GenRequest([7, 8, 9], SamplingParams(temperature=0, max_new_tokens=3))])
    eng.release_memory()
    assert (eng._device.graphs is not None) is graphs
    assert eng.generate([GenRequest([7, 8, 9], SamplingParams(temperature=0, max_new_tokens=3))])[0].response_ids


def test_device_weights_are_the_storage_of_the_engines_own_copy(tokenizer):
    """With a rollout copy (dtype differs from the learner's), the fused q/k/v and gate/up tensors are that copy's
    storage: its parameters are views into them (no extra memory), and sync_weights writes through."""
    model = _peaky(_tiny("qwen2", tokenizer))
    eng = HFEngine(model, tokenizer, max_batch_size=4, dtype=torch.bfloat16, device_loop=True)
    reqs = [GenRequest([7, 8, 9 + i], SamplingParams(temperature=0, max_new_tokens=5)) for i in range(3)]
    eng.generate(reqs)
    dw = eng._device.weights
    assert dw is not None and dw.own and dw.aliased()
    a = eng.model.model.layers[1].self_attn
    w_qkv, b_qkv, w_gu = dw.fused[1]
    assert a.k_proj.weight.data_ptr() == w_qkv[a.q_proj.weight.shape[0]:].data_ptr()
    assert b_qkv is not None and a.q_proj.bias.data_ptr() == b_qkv.data_ptr()
    storages = {p.untyped_storage().data_ptr() for p in eng.model.parameters()}
    assert len(storages) < len(list(eng.model.parameters()))  # several parameters share one fused storage
    with torch.no_grad():
        model.model.layers[1].self_attn.k_proj.weight.mul_(-2)
    eng.sync_weights()
    want = model.model.layers[1].self_attn.k_proj.weight.to(torch.bfloat16)
    assert torch.equal(w_qkv[a.q_proj.weight.shape[0] : a.q_proj.weight.shape[0] + want.shape[0]], want)


def test_device_weights_of_a_shared_model_follow_in_place_updates(tokenizer):
    """Decoding the learner's module itself, the fused tensors are copies: an in-place update (as the optimizer's)
    is copied into them at the next batch, at the same addresses, so the buffers (and graphs) stay."""
    model = _peaky(_tiny("llama", tokenizer))
    eng = HFEngine(model, tokenizer, max_batch_size=4, device_loop=True)
    reqs = [GenRequest([7, 8, 9 + i], SamplingParams(temperature=0, max_new_tokens=6)) for i in range(3)]
    before = eng.generate(reqs)
    dw, graphs = eng._device.weights, eng._device.graphs
    assert dw is not None and not dw.own and graphs is not None
    addresses = [t.data_ptr() for t in dw.tensors()]
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.up_proj.weight.mul_(-3)
            layer.self_attn.v_proj.weight.mul_(2)
    after = eng.generate(reqs)
    assert eng._device.graphs is graphs and graphs.valid()
    assert [t.data_ptr() for t in dw.tensors()] == addresses
    assert torch.equal(dw.fused[0][2][model.config.intermediate_size:], model.model.layers[0].mlp.up_proj.weight)
    fresh = HFEngine(model, tokenizer, max_batch_size=4, device_loop=True).generate(reqs)
    assert [o.response_ids for o in after] == [o.response_ids for o in fresh]
    assert [o.response_ids for o in after] != [o.response_ids for o in before]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_fused_device_loop_matches_the_unfused_one(arch, tokenizer):
    model = _peaky(_tiny(arch, tokenizer))
    reqs = _requests(9)
    outs = [HFEngine(model, tokenizer, max_batch_size=4, seed=5, device_loop=True, fuse=fuse).generate(reqs)
            for fuse in (False, True)]
    for r, a, b in zip(reqs, *outs, strict=True):
        _agree(a, b, r.sampling.temperature == 0)


@pytest.mark.slow
def test_compiled_device_loop_matches_the_eager_one(tokenizer):
    """compile=True: the step through torch.compile (inductor; here its CPU code) samples what the eager step does."""
    from torch._dynamo.utils import counters

    model = _peaky(_tiny("qwen2", tokenizer))
    reqs = _requests(7)
    counters.clear()
    outs = [HFEngine(model, tokenizer, max_batch_size=4, seed=2, device_loop=True, compile=c).generate(reqs)
            for c in (False, True)]
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"]  # compiled, in one piece
    for r, a, b in zip(reqs, *outs, strict=True):
        _agree(a, b, r.sampling.temperature == 0)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_overlapped_steps_give_what_waiting_steps_give(arch, tokenizer):
    """overlap: each step is launched before the previous one's tokens are handled, so rows that finish are
    moved out while a step is in flight (their places taken, with that step's results, by the last rows), and
    queued requests join after it: the same tokens and stops as launch-wait-handle; log-probs agree to rounding
    (a step's padded batch can include the rows that end with it, and a matmul of other shape rounds otherwise)."""
    model = _peaky(_tiny(arch, tokenizer))
    reqs = _requests(13) + [GenRequest([7, 8, 9 + i, 3 * i], SamplingParams(temperature=0.0, max_new_tokens=30))
                            for i in range(6)]
    engines = [HFEngine(model, tokenizer, max_batch_size=5, seed=4, device_loop=True, overlap=o) for o in (False, True)]
    probe = HFEngine(model, tokenizer, max_batch_size=5, device_loop=True).generate(reqs[13:])
    stops = {probe[0].response_ids[4], probe[2].response_ids[9]}  # tokens these rows do emit: natural stops
    for e in engines:
        e.stop_ids |= stops
    a, b = (e.generate(reqs) for e in engines)
    assert {o.finish_reason for o in b} == {"stop", "length"}
    for x, y in zip(a, b, strict=True):
        assert (x.response_ids, x.finish_reason) == (y.response_ids, y.finish_reason)
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4, rtol=0)
    assert not engines[1]._device.inflight and not engines[1].busy
