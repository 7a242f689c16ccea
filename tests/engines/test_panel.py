"""The C library's float32 panel product for decode steps: the product, the engine's use of it for every step, and
the engine's tokens with it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from teamrl.engines import decode_weights as dw
from teamrl.engines.base import GenRequest, SamplingParams
from teamrl.engines.cpu import attention as cpu_attention
from teamrl.engines.cpu import panel as pn
from teamrl.engines.hf import HFEngine
from tests.conftest import make_tiny_model


@pytest.fixture(scope="module")
def lib():
    lib = cpu_attention.load()
    if lib is None:
        pytest.skip("the C library does not build here (see teamrl.engines.cpu.attention.load)")
    if pn.panel_width(lib) == 0:
        pytest.skip("this build of the C library has no panel product (it needs x86-64 with AVX2 and FMA)")
    assert pn.available(lib)  # it has one: it must agree with F.linear
    return lib


@pytest.mark.parametrize("rows", [1, 5, 6, 7, 13, 32, 65])
@pytest.mark.parametrize("n,k", [(960, 576), (576, 1536), (45, 37), (100, 1)])
def test_panel_linear_agrees_with_float64(lib, rows, n, k):
    """Every row count (whole and partial blocks of 6 rows), output widths that are and are not whole panels, with
    and without a bias: within 5e-6 of float64, relative to the largest entry (each output a float32 sum of K
    products in sequence)."""
    g = torch.Generator().manual_seed(rows * 1000 + n)
    w, b, x = torch.randn((n, k), generator=g) / k ** 0.5, torch.randn(n, generator=g), torch.randn((rows, k), generator=g)
    p = pn.panel_pack(lib, w)
    assert p.packed.shape == (-(-n // pn.panel_width(lib)), k, pn.panel_width(lib))
    for bias in (None, b):
        got = pn.panel_linear(x, p, bias)
        ref = F.linear(x.double(), w.double(), None if bias is None else bias.double())
        assert got.shape == (rows, n) and got.dtype == torch.float32
        assert ((got.double() - ref).abs().max() / ref.abs().max()).item() < 5e-6


def test_panel_linear_rows_are_independent_and_inputs_may_be_strided(lib):
    """A row's result is bit-identical whatever the other rows hold; a [B, 1, K] input and one whose rows are a
    strided view give the same results as a contiguous copy."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn((160, 64), generator=g)
    p = pn.panel_pack(lib, w)
    x = torch.randn((9, 1, 64), generator=g)
    got = pn.panel_linear(x, p, None)
    assert got.shape == (9, 1, 160)
    other = x.clone()
    other[1:] = torch.randn(other[1:].shape, generator=g)
    assert torch.equal(pn.panel_linear(other, p, None)[0], got[0])
    wide = torch.randn((9, 128), generator=g)
    assert torch.equal(pn.panel_linear(wide[:, 32:96], p, None), pn.panel_linear(wide[:, 32:96].contiguous(), p, None))


def test_panel_rejects_what_it_cannot_multiply(lib):
    w = torch.randn((32, 16))
    with pytest.raises(TypeError, match="float32"):
        pn.panel_pack(lib, w.bfloat16())
    p = pn.panel_pack(lib, w)
    with pytest.raises(ValueError, match=r"x \[\.\.\., 16\]"):
        pn.panel_linear(torch.randn((3, 15)), p, None)
    with pytest.raises(ValueError, match="bias"):
        pn.panel_linear(torch.randn((3, 16)), p, torch.randn(31))
    with pytest.raises(ValueError, match="float32"):
        pn.panel_linear(torch.randn((3, 16)).double(), p, None)


def _weights(tokenizer):
    model = make_tiny_model(tokenizer, hidden=128)
    return model, dw.decode_weights(model, {}, pack=True, panel=True)


def test_panel_copies_serve_every_bucket_and_nothing_else_is_packed(lib, monkeypatch, tokenizer):
    """Where the C library has its panel product, every step up to PACK_MAX_ROWS rows multiplies by its copies,
    made once, without a timing, and nothing is prepacked for oneDNN or MKL: one copy of the step's weights."""
    monkeypatch.setattr(dw, "_CHOICE", {})
    _, w = _weights(tokenizer)
    assert w.lib is lib and w.packed is None and w.head is None and not w.mkl
    layers, head = w.for_step(3)
    assert type(head) is pn.PanelWeight and type(layers[0][0]) is pn.PanelWeight
    assert all(w.for_step(n)[1] is head for n in (13, 16, 40, 64, 256))  # every bucket: the same copies
    assert w.for_step(300) == (None, None)
    assert dw._CHOICE == {} and w._buckets == {}  # nothing timed, no MKL copies


def test_without_the_panel_product_onednn_and_mkl_as_before(lib, tokenizer):
    model, _ = _weights(tokenizer)
    w = dw.decode_weights(model, {}, pack=True, panel=False)
    assert w.lib is None and w.packed is not None and w.head is not None and w._panel is None
    assert w.mkl == dw.DecodeWeights.can_mkl_pack(model)


def test_time_step_linears_times_the_panel_product(lib, tokenizer):
    model, w = _weights(tokenizer)
    base = dw.decode_weights(model, {}, pack=True, panel=False)
    times = dw.time_step_linears({"oneDNN": (base.packed, base.head), "panel": w._panel_copies()}, model, w.fused, 16)
    assert set(times) == {"oneDNN", "panel"} and all(0 < t < 1 for t in times.values())


def _requests(tokenizer, n: int) -> list[GenRequest]:
    prompts = [list(tokenizer.apply_chat_template([{"role": "user", "content": f"count to {i}"}],
                                                  add_generation_prompt=True, tokenize=True, return_dict=False))
               for i in range(n)]
    return [GenRequest(p, SamplingParams(temperature=1.0, max_new_tokens=20, ignore_eos=True)) for p in prompts]


@pytest.mark.parametrize("fused_step", [True, False])
def test_engine_with_panel_steps_samples_the_same_tokens(lib, tokenizer, fused_step):
    """11 rows (bucket 16): every decode step multiplies by panel-packed weights, through the fused step and the
    unfused one; the tokens equal those of the unpacked loop and log-probs agree to 1e-5."""
    model = make_tiny_model(tokenizer, hidden=128)
    reqs = _requests(tokenizer, 11)
    panel = HFEngine(model, tokenizer, seed=3, fused_step=fused_step)
    plain = HFEngine(model, tokenizer, seed=3, pack=False, fused_step=fused_step)
    a, b = panel.generate(reqs), plain.generate(reqs)
    assert type(panel._weights_cache["weights"]._panel[1]) is pn.PanelWeight
    assert panel._weights_cache["weights"].packed is None  # no oneDNN copies beside the panel product's
    for x, y in zip(a, b, strict=True):
        assert x.response_ids == y.response_ids
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0)
    off = HFEngine(model, tokenizer, seed=3, panel=False)
    off.generate(reqs[:2])
    assert off._weights_cache["weights"].lib is None


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_panel_steps_per_architecture(lib, tokenizer, arch):
    """Qwen2's q/k/v biases and o-projection, Qwen3's unfused step: greedy tokens with the panel product equal those
    of the unpacked loop, log-probs within 1e-5."""
    from tests.engines.test_fast_decoder import _tiny

    model = _tiny(arch, tokenizer)
    reqs = [GenRequest(tokenizer.encode(t), SamplingParams(temperature=0, max_new_tokens=10, ignore_eos=True))
            for t in ("the cat sat on", "one two three four five six", "x")]
    panel = HFEngine(model, tokenizer)
    on, off = panel.generate(reqs), HFEngine(model, tokenizer, pack=False).generate(reqs)
    assert type(panel._weights_cache["weights"].for_step(3)[1]) is pn.PanelWeight
    for a, b in zip(on, off, strict=True):
        assert a.response_ids == b.response_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
