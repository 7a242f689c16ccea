"""The CPU decode-attention kernel against ``F.scaled_dot_product_attention``, and the fast loop with it."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
import torch

from teamrl.engines.base import GenRequest, SamplingParams
from teamrl.engines.cpu import attention as cpu_attention
from teamrl.engines.fast_decoder import FastDecoder
from teamrl.engines.hf import HFEngine
from tests.conftest import learner_logprob_gap, make_tiny_model


@pytest.fixture(scope="module")
def lib():
    """The kernel; skipped only where it is not meant to build (a failed build where it should is a failure)."""
    reason = cpu_attention._unavailable()
    if reason is None and not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")):
        reason = "no C compiler (cc)"
    if reason is not None:
        pytest.skip(f"the CPU attention kernel is not built here: {reason}")
    lib = cpu_attention.load()
    assert lib is not None, "the kernel did not build or failed its self-check on a supported platform (see the log)"
    return lib


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 8e-3)])
@pytest.mark.parametrize("G,D", [(1, 16), (3, 64), (4, 128)])
def test_kernel_matches_sdpa(lib, dtype, atol, G, D):
    g = torch.Generator().manual_seed(G * D)
    B, H, C = 5, 2, 70
    lens = torch.tensor([1, 2, 33, 69, 70])
    q = torch.randn((B, H, G, D), generator=g).to(dtype)
    k, v = (torch.randn((B + 2, H, C, D), generator=g).to(dtype) for _ in range(2))  # spare cache rows are ignored
    got = cpu_attention.decode_attention(lib, q, k, v, lens, D ** -0.5)
    assert got.dtype == dtype and got.shape == (B, H, G, D)
    torch.testing.assert_close(got.float(), cpu_attention.reference(q, k, v, lens, D ** -0.5), atol=atol, rtol=0)


def test_kernel_ignores_columns_past_a_rows_length(lib):
    """Stale cache columns (even NaN) past ``lens[b]`` never reach the output."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn((2, 1, 3, 32), generator=g)
    k, v = torch.randn((2, 1, 10, 32), generator=g), torch.randn((2, 1, 10, 32), generator=g)
    lens = torch.tensor([4, 10])
    clean = cpu_attention.decode_attention(lib, q, k, v, lens, 0.2)
    k[0, :, 4:], v[0, :, 4:] = float("nan"), float("nan")
    assert torch.equal(cpu_attention.decode_attention(lib, q, k, v, lens, 0.2), clean)


def test_kernel_accepts_a_strided_query(lib):
    """The fast loop passes q as a slice of the fused q/k/v output (rows further apart than H*G*D)."""
    g = torch.Generator().manual_seed(2)
    wide = torch.randn((3, 1, 12, 16), generator=g)
    q = wide[:, :, :9].view(3, 3, 3, 16)
    k, v = torch.randn((3, 3, 8, 16), generator=g), torch.randn((3, 3, 8, 16), generator=g)
    lens = torch.tensor([8, 5, 1])
    got = cpu_attention.decode_attention(lib, q, k, v, lens, 0.25)
    torch.testing.assert_close(got, cpu_attention.reference(q.contiguous(), k, v, lens, 0.25), atol=1e-5, rtol=0)


def test_fast_loop_with_the_kernel_agrees_with_the_learner(lib, tokenizer):
    """fp32: the engine's log-probs with the kernel match the learner's recomputation within 1e-3."""
    model = make_tiny_model(tokenizer)
    eng = HFEngine(model, tokenizer, seed=0)
    reqs = [GenRequest(list(tokenizer.encode("numbers " * (i + 1))), SamplingParams(temperature=1.0, max_new_tokens=12))
            for i in range(4)]
    outs = eng.generate(reqs)
    assert FastDecoder(model, None, attention_kernel=True).attn_lib is lib
    assert learner_logprob_gap(model, reqs, outs) < 1e-3
    plain = HFEngine(model, tokenizer, seed=0, cpu_kernel=False).generate(reqs)
    for a, b in zip(outs, plain, strict=True):
        assert a.response_ids == b.response_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)


def test_loading_the_kernel_keeps_subnormal_floats(lib):
    """The library must not switch the process to flush-to-zero (as a -ffast-math link would)."""
    tiny = torch.tensor([1e-40])  # an fp32 subnormal
    assert float(tiny * 1.0) > 0 and float(tiny + 0.0) > 0
    import numpy as np

    assert np.float32(1e-40) * np.float32(1.0) > 0


def test_the_source_ships_in_the_package():
    """The kernel is compiled from a .c file inside the package (package-data), not from a Python string."""
    assert cpu_attention.SOURCE_PATH.parent.parent == Path(cpu_attention.__file__).resolve().parent
    assert "KERNEL(decode_attention_bf16" in cpu_attention.SOURCE_PATH.read_text()


@pytest.mark.parametrize("system,machine,reason", [("Linux", "riscv64", "no build flags for architecture 'riscv64'"),
                                                  ("Linux", "ppc64le", "no build flags for architecture 'ppc64le'"),
                                                  ("Darwin", "arm64", "the platform is Darwin, not Linux")])
def test_load_refuses_other_platforms_and_says_why(monkeypatch, caplog, system, machine, reason):
    """Elsewhere nothing is compiled: load() returns None (the fast loop uses torch's kernel) and logs the reason."""
    monkeypatch.setattr(cpu_attention, "_lib", False)
    monkeypatch.setattr(cpu_attention.platform, "system", lambda: system)
    monkeypatch.setattr(cpu_attention.platform, "machine", lambda: machine)
    monkeypatch.setattr(cpu_attention, "_build", lambda *a: pytest.fail("nothing may be built here"))
    with caplog.at_level(logging.INFO, logger=cpu_attention.__name__):
        assert cpu_attention.load() is None
    assert reason in caplog.text and "torch's kernel is" in caplog.text
    assert cpu_attention.load() is None  # decided once per process


def test_aarch64_builds_with_its_own_flags(monkeypatch, caplog):
    """On aarch64 the build gets -mcpu=native and no x86-only flag; a failed build falls back with a warning."""
    built = []

    def fake_build(cc: str, flags: list[str]) -> Path:
        built.append(flags)
        raise RuntimeError("cc -O3 ... failed: (no aarch64 compiler in this test)")

    monkeypatch.setattr(cpu_attention, "_lib", False)
    monkeypatch.setattr(cpu_attention.platform, "system", lambda: "Linux")
    monkeypatch.setattr(cpu_attention.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(cpu_attention, "_torch_uses_gnu_openmp", lambda: True)
    monkeypatch.setenv("CC", "cc")
    monkeypatch.setattr(cpu_attention, "_build", fake_build)
    with caplog.at_level(logging.WARNING, logger=cpu_attention.__name__):
        assert cpu_attention.load() is None
    assert built == [["-O3", "-mcpu=native", "-ffast-math", "-fopenmp", "-fPIC"]]
    assert "no aarch64 compiler in this test" in caplog.text


def test_x86_flags_are_unchanged():
    """The x86_64 build keeps its flags (the kernel's results are bit-identical to earlier builds)."""
    assert cpu_attention.compile_flags("x86_64") == ["-O3", "-march=native", "-mprefer-vector-width=512", "-ffast-math",
                                                     "-fopenmp", "-fPIC"]


def test_the_switch_decides_whether_the_kernel_is_loaded(monkeypatch, tokenizer):
    """HFEngine(cpu_kernel=...) -> FastDecoder(attention_kernel=...): switched off, the library is never loaded."""
    loads = []
    monkeypatch.setattr(cpu_attention, "load", lambda: loads.append(1))  # returns None: torch's attention
    model = make_tiny_model(tokenizer)
    req = GenRequest(list(tokenizer.encode("numbers")), SamplingParams(temperature=1.0, max_new_tokens=3))
    for on in (False, True):  # on: the attention and the panel product's weights each ask for the library
        assert len(HFEngine(model, tokenizer, seed=0, cpu_kernel=on).generate([req])[0].response_ids) == 3
        assert bool(loads) == on
    n = len(loads)
    assert FastDecoder(model, None, attention_kernel=False).attn_lib is None and len(loads) == n


def _args(**change: torch.Tensor) -> dict[str, torch.Tensor]:
    """Arguments that fit the kernel (B=2, H=2, G=3, D=8, C=5), with some replaced."""
    args = dict(q=torch.zeros(2, 2, 3, 8), k=torch.zeros(3, 2, 5, 8), v=torch.zeros(3, 2, 5, 8),
                lens=torch.tensor([1, 5]))
    return {**args, **change}


@pytest.mark.parametrize("change,error,match", [
    (dict(k=torch.zeros(3, 2, 5, 8, dtype=torch.bfloat16)), TypeError, "must all be bfloat16 or all float32"),
    (dict(q=torch.zeros(2, 2, 3, 8, dtype=torch.float64)), TypeError, "must all be bfloat16 or all float32"),
    (dict(lens=torch.tensor([1, 5], dtype=torch.int32)), TypeError, "lens must be int64"),
    (dict(q=torch.zeros(2, 6, 8)), ValueError, r"q must be \[B, H, G, D\]"),
    (dict(v=torch.zeros(3, 2, 4, 8)), ValueError, r"k, v both \[rows, H, C, D\]"),
    (dict(q=torch.zeros(2, 2, 8, 3).transpose(2, 3)), ValueError, "last three dims must be dense"),
    (dict(q=torch.zeros(2, 1, 17, 8), k=torch.zeros(3, 1, 5, 8), v=torch.zeros(3, 1, 5, 8)), ValueError,
     "at most 16 query heads"),
    (dict(k=torch.zeros(1, 2, 5, 8), v=torch.zeros(1, 2, 5, 8)), ValueError, r"rows >= 2"),
    (dict(k=torch.zeros(3, 5, 2, 8).transpose(1, 2), v=torch.zeros(3, 5, 2, 8).transpose(1, 2)), ValueError,
     "must be contiguous"),
    (dict(lens=torch.tensor([1, 5, 5])), ValueError, r"lens must be \[2\]"),
])
def test_bad_arguments_raise_before_the_kernel_is_called(change, error, match):
    """The checks guarding the raw-pointer call are errors (they hold under python -O), raised before the call."""
    class NoLib:
        def __getattr__(self, name: str) -> None:
            pytest.fail("the kernel was called with bad arguments")

    args = _args(**change)
    with pytest.raises(error, match=match):
        cpu_attention.decode_attention(NoLib(), args["q"], args["k"], args["v"], args["lens"], 0.5)


# --- the fused decode step: rope_attention, add_rms_norm, silu_mul, FastDecoder._fused_step ---

@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 8e-3)])
@pytest.mark.parametrize("G,D", [(1, 16), (3, 64), (4, 128)])
def test_rope_attention_matches_the_unfused_operations(lib, dtype, atol, G, D):
    """Rotation, cache write and attention in one call agree with torch's operations (the unfused step): the
    output to the rounding of the attention, the written keys to float32 rounding (bf16: bit for bit, the same
    roundings), the values exactly; other columns untouched."""
    g = torch.Generator().manual_seed(G + D)
    B, H, C = 4, 2, 40
    pos = torch.tensor([0, 5, 38, 39])

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g).to(dtype)

    qkv, k, v = rand(B, (H * G + 2 * H) * D), rand(B + 1, H, C, D), rand(B + 1, H, C, D)
    angle = torch.rand((B, D // 2), generator=g) * 6
    cos = torch.cat([angle.cos()] * 2, -1).to(dtype)
    ssin = torch.cat([-angle.sin(), angle.sin()], -1).to(dtype)
    k2, v2 = k.clone(), v.clone()
    out = torch.empty((B, H, G, D), dtype=dtype)
    got = cpu_attention.rope_attention(lib, qkv, cos, ssin, k2, v2, pos, D ** -0.5, out)
    want = cpu_attention.rope_reference(qkv, cos, ssin, k, v, pos, D ** -0.5, G)
    assert got is out
    torch.testing.assert_close(got.float(), want, atol=atol, rtol=0)
    if dtype == torch.bfloat16:
        assert torch.equal(k2, k)
    else:
        torch.testing.assert_close(k2, k, atol=1e-6, rtol=1e-6)
    assert torch.equal(v2, v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_add", [True, False])
def test_add_rms_norm_matches_the_module(lib, dtype, with_add):
    """Residual add (bit for bit) and a Llama RMSNorm (to one rounding of the dtype) in one call."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    g = torch.Generator().manual_seed(3)
    norm = LlamaRMSNorm(576, eps=1e-5)
    norm.weight.data = (torch.rand(576, generator=g) + 0.5).to(dtype)
    h, d = (torch.randn((7, 576), generator=g).to(dtype) * 4 for _ in range(2))
    want_h = h + d if with_add else h.clone()
    with torch.no_grad():
        want = norm(want_h)
    out = torch.empty_like(h)
    got = cpu_attention.add_rms_norm(lib, h, d if with_add else None, norm.weight.data, 1e-5, out)
    assert got is out and torch.equal(h, want_h)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(got, want, atol=4 * eps, rtol=2 * eps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_matches_torch(lib, dtype):
    g = torch.Generator().manual_seed(4)
    gu = torch.randn((5, 2 * 1536), generator=g).to(dtype) * 3
    got = cpu_attention.silu_mul(lib, gu, torch.empty((5, 1536), dtype=dtype))
    want = torch.nn.functional.silu(gu[:, :1536]) * gu[:, 1536:]
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(got, want, atol=4 * eps, rtol=2 * eps)


@pytest.mark.parametrize("call,error,match", [
    (lambda: cpu_attention.rope_attention(None, torch.zeros(2, 64), torch.zeros(2, 8), torch.zeros(2, 8),
                                          torch.zeros(2, 2, 5, 8), torch.zeros(2, 2, 5, 8), torch.zeros(2).long(), 0.5,
                                          torch.empty(2, 2, 3, 8)), ValueError, r"qkv must be \[2, 80\]"),
    (lambda: cpu_attention.rope_attention(None, torch.zeros(2, 64), torch.zeros(2, 8), torch.zeros(2, 8),
                                          torch.zeros(2, 2, 5, 8), torch.zeros(2, 2, 5, 8), torch.zeros(2), 0.5,
                                          torch.empty(2, 2, 3, 8)), TypeError, "pos be int64"),
    (lambda: cpu_attention.rope_attention(None, torch.zeros(2, 80), torch.zeros(2, 8), torch.zeros(2, 8),
                                          torch.zeros(1, 2, 5, 8), torch.zeros(1, 2, 5, 8), torch.zeros(2).long(), 0.5,
                                          torch.empty(2, 2, 3, 8)), ValueError, r"rows >= 2"),
    (lambda: cpu_attention.add_rms_norm(None, torch.zeros(2, 8), torch.zeros(2, 7), torch.zeros(8), 1e-5,
                                        torch.zeros(2, 8)), ValueError, r"contiguous \[2, 8\]"),
    (lambda: cpu_attention.add_rms_norm(None, torch.zeros(2, 8), None, torch.zeros(8, dtype=torch.bfloat16), 1e-5,
                                        torch.zeros(2, 8)), TypeError, "share one dtype"),
    (lambda: cpu_attention.silu_mul(None, torch.zeros(2, 10), torch.zeros(2, 4)), ValueError, r"gu must be \[2, 8\]"),
])
def test_fused_calls_check_their_arguments(call, error, match):
    """Checked before the raw-pointer call (the library argument is never reached)."""
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_step_agrees_with_the_unfused_step(lib, tokenizer, dtype):
    """The engine's default (fused) decode step samples the tokens of the unfused one with log-probs equal to
    rounding, and matches the learner's recomputation; switched off, FastDecoder says so."""
    model = make_tiny_model(tokenizer, hidden=128).to(getattr(torch, dtype))
    reqs = [GenRequest(list(tokenizer.encode("count " * (i + 2))), SamplingParams(temperature=1.0, max_new_tokens=16))
            for i in range(6)]
    fused = HFEngine(model, tokenizer, seed=0)
    outs = fused.generate(reqs)
    plain = HFEngine(model, tokenizer, seed=0, fused_step=False).generate(reqs)
    tol = 1e-4 if dtype == "float32" else 5e-2
    same = 0
    for a, b in zip(outs, plain, strict=True):
        if a.response_ids == b.response_ids:
            same += 1
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=tol, rtol=0)
    assert same >= (6 if dtype == "float32" else 4)
    if dtype == "float32":
        assert learner_logprob_gap(model, reqs, outs) < 1e-3
    from teamrl.engines.decode_weights import decode_weights

    w = decode_weights(model, {}, True)
    assert FastDecoder(model, w, attention_kernel=True).fused_step
    assert not FastDecoder(model, w, attention_kernel=True, fused_step=False).fused_step
    assert not FastDecoder(model, w, attention_kernel=False).fused_step  # needs the library
    assert not FastDecoder(model, None, attention_kernel=True).fused_step  # needs the fused weights


@pytest.mark.parametrize("arch,fused", [("llama", True), ("qwen2", True), ("qwen3", False)])
def test_fused_step_per_architecture(lib, tokenizer, arch, fused):
    """Qwen2's q/k/v biases go through the fused step; Qwen3's per-head q/k norms keep torch's operations.
    Greedy tokens equal the unfused step's, log-probs to rounding."""
    from teamrl.engines.decode_weights import decode_weights
    from tests.engines.test_fast_decoder import _tiny

    model = _tiny(arch, tokenizer)
    assert FastDecoder(model, decode_weights(model, {}, True), attention_kernel=True).fused_step is fused
    reqs = [GenRequest(tokenizer.encode(t), SamplingParams(temperature=0, max_new_tokens=10, ignore_eos=True))
            for t in ("the cat sat on", "one two three four five six", "x")]
    on, off = HFEngine(model, tokenizer).generate(reqs), HFEngine(model, tokenizer, fused_step=False).generate(reqs)
    for a, b in zip(on, off, strict=True):
        assert a.response_ids == b.response_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
