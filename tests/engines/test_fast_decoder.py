"""The fast decode loop's rewritten kernels reproduce the modules they replace bit for bit, and the
loop matches the generic ``model.forward`` loop on each supported architecture family."""

from __future__ import annotations

import pytest
import torch

from teamrl.engines.base import GenRequest, SamplingParams
from teamrl.engines.fast_decoder import FastDecoder
from teamrl.engines.hf import HFEngine
from teamrl.engines.layer_ops import exact_rms_norm, rms_norm, rope


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_matches_rotate_half_form_exactly(dtype):
    from transformers.models.llama.modeling_llama import rotate_half

    g = torch.Generator().manual_seed(0)
    x = torch.randn((5, 3, 7, 64), generator=g).to(dtype)
    cos, sin = torch.randn((5, 3, 1, 64), generator=g).to(dtype), torch.randn((5, 3, 1, 64), generator=g).to(dtype)
    ssin = torch.cat([-sin[..., :32], sin[..., 32:]], -1)
    assert torch.equal(rope(x, cos, ssin), x * cos + rotate_half(x) * sin)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_rms_norm_matches_the_module_exactly(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    m = LlamaRMSNorm(96, eps=1e-5).to(dtype)
    with torch.no_grad():
        m.weight.copy_(torch.linspace(0.5, 2.0, 96))
    if not exact_rms_norm(m):
        pytest.skip("this torch has no bit-identical fused RMSNorm kernel (the fast loop calls the module)")
    x = (torch.randn((4, 9, 96), generator=torch.Generator().manual_seed(1)) * 5).to(dtype)
    with torch.no_grad():
        assert torch.equal(rms_norm(m, x), m(x))


def test_exact_rms_norm_rejects_a_different_norm():
    class Shifted(torch.nn.Module):  # Gemma-style (1 + w) scaling: not what _rms_norm computes
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.full((32,), 0.5))
            self.variance_epsilon = 1e-6

        def forward(self, x):
            return (1 + self.weight) * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)

    assert not exact_rms_norm(Shifted())


def _tiny(arch: str, tokenizer):
    import transformers

    kw = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
              bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
              pad_token_id=tokenizer.pad_token_id)
    if arch == "qwen3":
        kw["head_dim"] = 16
    cfg_cls = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config"}[arch]
    lm_cls = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]
    torch.manual_seed(0)
    model = getattr(transformers, lm_cls)(getattr(transformers, cfg_cls)(**kw)).float().eval()
    with torch.no_grad():  # non-trivial norm weights and (Qwen2) q/k/v biases
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_fast_loop_matches_generic_loop_per_architecture(arch, tokenizer):
    """Qwen2 has q/k/v biases, Qwen3 per-head q/k norms: both change the fused path."""
    model = _tiny(arch, tokenizer)
    assert FastDecoder.supports(model)
    prompts = [tokenizer.encode(t) for t in ("the cat sat on", "one two three four five six", "x")]
    reqs = [GenRequest(p, SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True)) for p in prompts]
    fast, generic = HFEngine(model, tokenizer).generate(reqs), HFEngine(model, tokenizer, fast=False).generate(reqs)
    for a, b in zip(fast, generic, strict=True):
        assert a.response_ids == b.response_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


def test_a_large_cache_buffer_is_allocated_after_the_allocators_free_pages_are_given_back(tokenizer, monkeypatch):
    """Under tcmalloc the buffers of earlier calls stay as free pages that a larger buffer does not fit in: reserve
    gives them back before allocating one of RELEASE_BEFORE_BYTES or more, and not for smaller ones."""
    from teamrl import allocator
    from tests.conftest import make_tiny_model

    calls = []
    monkeypatch.setattr(allocator, "tcmalloc_release", lambda: lambda: calls.append(1))
    dec = FastDecoder(make_tiny_model(tokenizer), None)
    per_cell = 2 * dec.k.element_size() * dec.k.shape[0] * dec.n_kv * dec.head_dim  # keys and values, one row x column
    dec.reserve(2, 64)
    assert calls == [] and dec.k.shape[1] == 2  # a small buffer: nothing given back
    monkeypatch.setattr(allocator, "RELEASE_BEFORE_BYTES", per_cell * 4 * 128)
    dec.reserve(4, 128)
    assert calls == [1] and dec.k.shape[1] >= 4 and dec.k.shape[3] >= 128
