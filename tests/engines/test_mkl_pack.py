"""MKL-packed float32 decode weights: the product, the row-bucket policy and the engine's tokens with them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from teamrl.engines import decode_weights as dw
from teamrl.engines.base import GenRequest, SamplingParams
from teamrl.engines.hf import HFEngine
from tests.conftest import make_tiny_model


def _prompt(tok, text: str) -> list[int]:
    return list(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False))


@pytest.fixture
def mkl_or_skip():
    if not dw._mkl_pack_works():
        pytest.skip("MKL's packed float32 product is not available here (needs MKL on x86-64)")


@pytest.fixture
def force(monkeypatch):
    """Make the first-use timing choose MKL (``True``) or oneDNN (``False``), whatever this CPU measures (the panel
    product, where tried, times slowest)."""
    def choose(mkl_wins: bool) -> None:
        times = {"oneDNN": 1.0, "mkl": 0.5 if mkl_wins else 1.0, "panel": 2.0}
        monkeypatch.setattr(dw, "_CHOICE", {})
        monkeypatch.setattr(dw, "time_step_linears", lambda cands, *a: {n: times[n] for n in cands})
    return choose


@pytest.mark.parametrize("rows,bucket", [(1, 16), (13, 16), (32, 32), (25, 64)])
def test_mkl_linear_pads_rows_and_agrees_with_float64(mkl_or_skip, rows, bucket):
    """Rows padded up to the packed bucket: each output row within 1e-6 of float64 (relative to the largest entry),
    and bit-identical whatever the other rows hold (a row's result depends on its own input only)."""
    g = torch.Generator().manual_seed(rows)
    w, b = torch.randn((3072, 576), generator=g) / 24, torch.randn(3072, generator=g)
    x = torch.randn((rows, 1, 576), generator=g)
    with torch.no_grad():
        p = dw.mkl_pack(w, bucket)
        got = dw.mkl_linear(x, p, b)
        ref = F.linear(x.double(), w.double(), b.double())
        assert got.shape == (rows, 1, 3072)
        assert ((got.double() - ref).abs().max() / ref.abs().max()).item() < 1e-6
        other = x.clone()
        other[1:] = torch.randn(other[1:].shape, generator=g)
        assert torch.equal(dw.mkl_linear(other, p, b)[0], got[0])


def _weights(tokenizer):
    model = make_tiny_model(tokenizer, hidden=128)
    return model, dw.decode_weights(model, {}, pack=True)


def test_buckets_top_quarter_one_kept_and_each_packed_once(mkl_or_skip, force, tokenizer):
    force(True)
    model, w = _weights(tokenizer)
    assert w.mkl
    layers, head = w.for_step(12)  # 12 <= 3/4 of 16: oneDNN's
    assert layers is w.packed and head is w.head
    layers, head = w.for_step(13)
    assert type(head) is dw.MklWeight and head.rows == 16 and type(layers[0][0]) is dw.MklWeight
    assert w.for_step(16)[1] is head
    big = w.for_step(64)[1]  # a new bucket replaces the kept one
    assert big.rows == 64 and w._buckets[16] is None
    assert w.for_step(14)[1] is w.head  # bucket 16 was packed once already: oneDNN's from now on
    assert w.for_step(300) == (None, None)  # more rows than PACK_MAX_ROWS: F.linear
    assert dw.decode_weights(model, {}, pack=True, mkl=False).for_step(16)[1] is not None
    assert not dw.decode_weights(model, {}, pack=True, mkl=False).mkl


def test_timing_that_finds_onednn_faster_keeps_onednn(mkl_or_skip, force, tokenizer):
    force(False)
    _, w = _weights(tokenizer)
    assert w.for_step(16) == (w.packed, w.head) and w._buckets == {16: None}


def test_time_step_linears_measures_both(mkl_or_skip, tokenizer):
    _, w = _weights(tokenizer)
    mkl = [tuple(None if x is None else dw.mkl_pack(x, 16) for x in dw._step_weights(layer, f))
           for layer, f in zip(w.model.model.layers, w.fused)]
    times = dw.time_step_linears({"oneDNN": (w.packed, w.head), "mkl": (mkl, dw.mkl_pack(w.model.lm_head.weight, 16))},
                                 w.model, w.fused, 16)
    assert set(times) == {"oneDNN", "mkl"} and all(0 < t < 1 for t in times.values())


def _requests(tokenizer, n: int) -> list[GenRequest]:
    return [GenRequest(_prompt(tokenizer, f"count to {i}"), SamplingParams(temperature=1.0, max_new_tokens=20,
                                                                          ignore_eos=True)) for i in range(n)]


def test_engine_with_mkl_packed_steps_samples_the_same_tokens(mkl_or_skip, force, tokenizer):
    """14 rows (bucket 16): every decode step multiplies by MKL-packed weights; the tokens equal those of the
    unpacked loop and log-probs agree to 1e-5."""
    force(True)
    model = make_tiny_model(tokenizer, hidden=128)
    reqs = _requests(tokenizer, 14)
    packed = HFEngine(model, tokenizer, seed=3, panel=False)  # MKL's products are tried where the panel's is not
    plain = HFEngine(model, tokenizer, seed=3, pack=False)
    a, b = packed.generate(reqs), plain.generate(reqs)
    assert type(packed._weights_cache["weights"]._buckets[16][1]) is dw.MklWeight
    for x, y in zip(a, b, strict=True):
        assert x.response_ids == y.response_ids
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0)


def test_mkl_packed_weights_follow_in_place_updates(mkl_or_skip, force, tokenizer):
    force(True)
    model = make_tiny_model(tokenizer, hidden=128)
    reqs = _requests(tokenizer, 14)
    packed = HFEngine(model, tokenizer, seed=3, panel=False)  # MKL's products are tried where the panel's is not
    plain = HFEngine(model, tokenizer, seed=3, pack=False)
    packed.generate(reqs), plain.generate(reqs)  # the same draws from both generators
    before = packed._weights_cache["weights"]
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    a, b = packed.generate(reqs), plain.generate(reqs)
    after = packed._weights_cache["weights"]
    assert after is not before and type(after._buckets[16][1]) is dw.MklWeight
    for x, y in zip(a, b, strict=True):
        assert x.response_ids == y.response_ids
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0)
