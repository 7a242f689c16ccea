from __future__ import annotations

import pytest
import torch

from teamrl.engines.base import GenRequest, SamplingParams
from teamrl.engines.hf import HFEngine
from teamrl.engines.sampling import sample
from tests.conftest import learner_logprob_gap, make_tiny_model


def _prompt(tok, text: str) -> list[int]:
    return list(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False))


def test_generate_respects_lengths_and_returns_logprobs(tokenizer):
    eng = HFEngine(make_tiny_model(tokenizer), tokenizer, seed=0)
    reqs = [GenRequest(_prompt(tokenizer, "hi" * (i + 1)), SamplingParams(temperature=1.0, max_new_tokens=3 + i))
            for i in range(5)]
    outs = eng.generate(reqs)
    for i, o in enumerate(outs):
        assert 1 <= len(o.response_ids) <= 3 + i
        assert len(o.logprobs) == len(o.response_ids)
        assert all(lp <= 0 and lp > -100 for lp in o.logprobs)
        assert o.finish_reason in ("stop", "length")


def test_greedy_is_independent_of_batch_company(tokenizer):
    """Left padding and position ids are right: a row decodes the same alone or in a batch."""
    eng = HFEngine(make_tiny_model(tokenizer), tokenizer, seed=0)
    sp = SamplingParams(temperature=0, max_new_tokens=6)
    short = GenRequest(_prompt(tokenizer, "2+2?"), sp)
    long = GenRequest(_prompt(tokenizer, "a much longer question about numbers " * 3), sp)
    alone = eng.generate([short])[0]
    together = eng.generate([long, short])[1]
    assert alone.response_ids == together.response_ids
    torch.testing.assert_close(torch.tensor(alone.logprobs), torch.tensor(together.logprobs), atol=1e-4, rtol=0)


def test_engine_logprobs_match_learner_recomputation(tokenizer):
    """The learner recomputes the sampling log-probs (fp32: max abs diff <= 1e-3), so PPO ratios start at 1."""
    model = make_tiny_model(tokenizer)
    eng = HFEngine(model, tokenizer, seed=1)
    reqs = [GenRequest(_prompt(tokenizer, f"question {i}" * (i + 1)), SamplingParams(temperature=0.7, max_new_tokens=8))
            for i in range(4)]
    assert learner_logprob_gap(model, reqs, eng.generate(reqs)) <= 1e-3


def test_sampling_filters():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]] * 2)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):  # top_k=1 and a tiny top_p both reduce to the argmax
        tok, lp = sample(logits, torch.tensor([1.0, 1.0]), torch.tensor([1.0, 0.01]), torch.tensor([1, 0]), g)
        assert tok.tolist() == [3, 3]
    tok, lp = sample(logits, torch.tensor([0.0, 0.0]), torch.tensor([1.0, 1.0]), torch.tensor([0, 0]), g)
    assert tok.tolist() == [3, 3]  # greedy
    expected = torch.log_softmax(logits[0], -1)[3]
    assert torch.allclose(lp, expected.expand(2))


def test_bf16_engine_copy_follows_the_learner_after_sync(tokenizer):
    model = make_tiny_model(tokenizer)
    eng = HFEngine(model, tokenizer, dtype=torch.bfloat16)
    assert eng.model is not model and next(eng.model.parameters()).dtype == torch.bfloat16
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    name, p = next(iter(model.named_parameters()))
    assert not torch.allclose(dict(eng.model.named_parameters())[name].float(), p, atol=1e-2)
    eng.sync_weights()
    torch.testing.assert_close(dict(eng.model.named_parameters())[name].float(), p, atol=2e-2, rtol=1e-2)
    shared = HFEngine(model, tokenizer)
    assert shared.model is model  # no copy by default


def test_release_memory_frees_the_rollout_copy_and_sync_remakes_it(tokenizer):
    """release_memory frees the bf16 copy's parameters and the decode copies; sync_weights (or the next request)
    makes them again from the learner's weights: the same samples as an engine that never released."""
    model = make_tiny_model(tokenizer)
    reqs = [GenRequest(_prompt(tokenizer, f"count to {i}"), SamplingParams(temperature=1.0, max_new_tokens=8,
                                                                          ignore_eos=True)) for i in range(3)]
    kept = HFEngine(model, tokenizer, dtype=torch.bfloat16, seed=5, release_copies=False)
    freed = HFEngine(model, tokenizer, dtype=torch.bfloat16, seed=5)
    for eng in (kept, freed):
        eng.generate(reqs)
        eng.release_memory()
    assert all(p.numel() == 0 for p in freed.model.parameters()) and not freed._weights_cache
    assert all(p.numel() > 0 for p in kept.model.parameters()) and kept._weights_cache
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.1)
    for eng in (kept, freed):
        eng.sync_weights()
    assert [p.dtype for p in freed.model.parameters()] == [torch.bfloat16] * len(list(model.parameters()))
    for x, y in zip(kept.generate(reqs), freed.generate(reqs), strict=True):
        assert x.response_ids == y.response_ids and x.logprobs == y.logprobs
    freed.release_memory()  # the weights unchanged and no sync: the next request remakes the copy
    for x, y in zip(kept.generate(reqs), freed.generate(reqs), strict=True):
        assert x.response_ids == y.response_ids and x.logprobs == y.logprobs
    tied = make_tiny_model(tokenizer)
    if tied.config.tie_word_embeddings:
        eng = HFEngine(tied, tokenizer, dtype=torch.bfloat16)
        eng.release_memory()
        eng.sync_weights()
        assert eng.model.lm_head.weight is eng.model.model.embed_tokens.weight


def test_fast_loop_matches_generic_loop(tokenizer):
    """The static-cache loop decodes exactly as the generic loop over model.forward (greedy, mixed lengths)."""
    model = make_tiny_model(tokenizer)
    fast, generic = HFEngine(model, tokenizer, max_batch_size=3), HFEngine(model, tokenizer, fast=False)
    assert fast._fast and not generic._fast
    reqs = [GenRequest(_prompt(tokenizer, "x " * (3 * i + 1)),
                       SamplingParams(temperature=0, max_new_tokens=4 + 3 * i, stop=("a",) if i == 2 else ()))
            for i in range(6)]
    dup = HFEngine(model, tokenizer)
    ref = generic.generate(reqs)
    for outs in (fast.generate(reqs), dup.generate(reqs + reqs)[len(reqs):]):
        for a, b in zip(outs, ref, strict=True):
            assert a.response_ids == b.response_ids and a.finish_reason == b.finish_reason and a.text == b.text
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


def test_generic_loop_prefill_computes_the_lm_head_on_the_last_prompt_token_only(tokenizer, monkeypatch):
    """A prefill of B prompts of L tokens keeps [B, 1, vocab] logits, not [B, L, vocab] (64 x 200 x 49,152 float32
    values are 2.5 GB for SmolLM2-135M), with or without LoRA adapters, and decodes what the full prefill decodes."""
    from peft import LoraConfig, get_peft_model

    import teamrl.engines.generic_loop as loop

    model = make_tiny_model(tokenizer)
    lora = get_peft_model(make_tiny_model(tokenizer), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert loop.keeps_logits(model) and loop.keeps_logits(lora)
    reqs = [GenRequest(_prompt(tokenizer, "x " * (5 * i + 8)), SamplingParams(temperature=0, max_new_tokens=3))
            for i in range(3)]

    def run(m):  # the outputs, and the most positions the LM head computed per row in one forward
        seen: list[int] = []
        hook = m.get_output_embeddings().register_forward_hook(lambda mod, args, out: seen.append(out.shape[1]))
        try:
            return HFEngine(m, tokenizer, fast=False, adapters=m is lora).generate(reqs), max(seen)
        finally:
            hook.remove()

    for m in (model, lora):
        got, positions = run(m)
        assert positions == 1
        with monkeypatch.context() as mp:
            mp.setattr(loop, "keeps_logits", lambda _m: False)  # the full prefill, as before
            ref, positions = run(m)
        assert positions > 8
        assert [a.response_ids for a in got] == [b.response_ids for b in ref]


def test_same_seed_same_samples(tokenizer):
    model = make_tiny_model(tokenizer)
    sp = SamplingParams(temperature=1.0, max_new_tokens=6)
    reqs = [GenRequest(_prompt(tokenizer, f"q{i}"), sp) for i in range(4)]
    a = HFEngine(model, tokenizer, seed=3).generate(reqs)
    b = HFEngine(model, tokenizer, seed=3).generate(reqs)
    assert [o.response_ids for o in a] == [o.response_ids for o in b]


def test_ignore_eos_generates_max_new_tokens(tokenizer):
    model = make_tiny_model(tokenizer)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():  # make the end-of-turn token overwhelmingly likely
        model.lm_head.weight[eos] += 50.0
    for fast in (True, False):
        eng = HFEngine(model, tokenizer, fast=fast)
        req = _prompt(tokenizer, "hello")
        stop = eng.generate([GenRequest(req, SamplingParams(temperature=0, max_new_tokens=7))])[0]
        forced = eng.generate([GenRequest(req, SamplingParams(temperature=0, max_new_tokens=7, ignore_eos=True))])[0]
        assert stop.finish_reason == "stop" and len(stop.response_ids) < 7
        assert forced.finish_reason == "length" and len(forced.response_ids) == 7


def _after_update(model, tokenizer, engine, reference):
    """Outputs of ``engine`` (used once before) and ``reference`` after the shared model is scaled in place."""
    req = [GenRequest(_prompt(tokenizer, "update me"), SamplingParams(temperature=0, max_new_tokens=6))]
    engine.generate(req)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    return engine.generate(req)[0], reference.generate(req)[0]


def test_fused_weights_follow_in_place_updates(tokenizer):
    """The fast loop's concatenated weights are remade when the shared model is updated in place."""
    model = make_tiny_model(tokenizer)
    a, b = _after_update(model, tokenizer, HFEngine(model, tokenizer), HFEngine(model, tokenizer, fast=False))
    assert a.response_ids == b.response_ids
    torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


def _bf16_pack_or_skip(model):
    from teamrl.engines.decode_weights import DecodeWeights
    if not DecodeWeights.can_pack(model):
        pytest.skip("this CPU has no oneDNN bf16 matmul (prepacked weights are not used here)")


def test_prepacked_weights_give_identical_tokens_and_logprobs(tokenizer):
    """bf16 on CPU: decode steps with oneDNN-prepacked weights sample the same tokens with the same log-probs."""
    model = make_tiny_model(tokenizer, hidden=128).to(torch.bfloat16)
    _bf16_pack_or_skip(model)
    reqs = [GenRequest(_prompt(tokenizer, f"count to {i}"), SamplingParams(temperature=1.0, max_new_tokens=24,
                                                                          ignore_eos=True)) for i in range(6)]
    # the packing alone (the fused step, on by default with it, agrees to rounding: test_cpu_attention.py)
    packed, plain = (HFEngine(model, tokenizer, seed=3, fused_step=False),
                     HFEngine(model, tokenizer, seed=3, pack=False, fused_step=False))
    a, b = packed.generate(reqs), plain.generate(reqs)
    assert packed._dec is None and packed._weights_cache["weights"].packed is not None
    assert plain._weights_cache["weights"].packed is None
    for x, y in zip(a, b, strict=True):
        assert x.response_ids == y.response_ids
        assert x.logprobs == y.logprobs


def test_prepacked_weights_follow_in_place_updates(tokenizer):
    model = make_tiny_model(tokenizer).to(torch.bfloat16)
    _bf16_pack_or_skip(model)
    a, b = _after_update(model, tokenizer, HFEngine(model, tokenizer, fused_step=False),
                         HFEngine(model, tokenizer, pack=False, fused_step=False))
    assert a.response_ids == b.response_ids and a.logprobs == b.logprobs


def _float32_pack_or_skip(model):
    """Skip where float32 prepacking is not meant to run; where it is, the engine must use it."""
    import platform

    from teamrl.engines.decode_weights import DecodeWeights
    if platform.machine() not in ("x86_64", "AMD64") or not torch.backends.mkldnn.is_available():
        pytest.skip("float32 prepacking runs on x86-64 with oneDNN (mkldnn) only")
    assert DecodeWeights.can_pack(model), "oneDNN float32 prepacking failed its check on x86-64"


def test_float32_prepacked_linear_agrees_with_float64_to_1e_6():
    """The float32 product with a prepacked weight is exact up to summation order: within 1e-6 of float64,
    relative to its largest entry (SmolLM2's gate/up shape at a decode batch of 32 rows)."""
    from teamrl.engines.decode_weights import packed_linear

    g = torch.Generator().manual_seed(0)
    w, x = torch.randn((3072, 576), generator=g) / 24, torch.randn((32, 576), generator=g)
    with torch.no_grad():
        ref = torch.nn.functional.linear(x.double(), w.double())
        try:
            got = packed_linear(x, torch.ops.mkldnn._reorder_linear_weight(w), None)
        except RuntimeError as exc:
            pytest.skip(f"oneDNN cannot prepack float32 weights here: {exc}")
    assert ((got.double() - ref).abs().max() / ref.abs().max()).item() < 1e-6


def test_float32_prepacked_weights_sample_the_same_tokens(tokenizer):
    """float32 on CPU: decode steps with prepacked weights sample the same tokens; log-probs agree to 1e-5."""
    model = make_tiny_model(tokenizer, hidden=128)
    _float32_pack_or_skip(model)
    reqs = [GenRequest(_prompt(tokenizer, f"count to {i}"), SamplingParams(temperature=1.0, max_new_tokens=24,
                                                                          ignore_eos=True)) for i in range(6)]
    # oneDNN's packing alone (the panel product, used instead where the C library has it: test_panel.py; the fused
    # step, on by default with it, agrees to rounding: test_cpu_attention.py)
    packed, plain = (HFEngine(model, tokenizer, seed=3, fused_step=False, panel=False),
                     HFEngine(model, tokenizer, seed=3, pack=False, fused_step=False))
    a, b = packed.generate(reqs), plain.generate(reqs)
    assert packed._weights_cache["weights"].packed is not None and plain._weights_cache["weights"].packed is None
    for x, y in zip(a, b, strict=True):
        assert x.response_ids == y.response_ids
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0)


def test_float32_prepacked_weights_follow_in_place_updates(tokenizer):
    model = make_tiny_model(tokenizer)
    _float32_pack_or_skip(model)
    a, b = _after_update(model, tokenizer, HFEngine(model, tokenizer), HFEngine(model, tokenizer, pack=False))
    assert a.response_ids == b.response_ids
    torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)


def test_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]])).expand(4000, 4).contiguous()
    g = torch.Generator().manual_seed(0)
    ones = torch.ones(4000)
    tok, lp = sample(logits, ones, ones, torch.zeros(4000, dtype=torch.long), g)
    freq = torch.bincount(tok, minlength=4).float() / 4000
    torch.testing.assert_close(freq, torch.tensor([0.1, 0.2, 0.3, 0.4]), atol=0.03, rtol=0)
    torch.testing.assert_close(lp, torch.log(torch.tensor([0.1, 0.2, 0.3, 0.4]))[tok], atol=1e-5, rtol=0)


@pytest.mark.parametrize("temp", [0.0, 1.0, 0.7])
@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_sampling_bf16_logits_equals_their_fp32_upcast(temp, top_p):
    """The fast loop hands bf16 logits to the sampler; it computes exactly as on their fp32 copy."""
    logits = (torch.randn((6, 500), generator=torch.Generator().manual_seed(0)) * 4).to(torch.bfloat16)
    temps, tp, tk = torch.full((6,), temp), torch.full((6,), top_p), torch.zeros(6, dtype=torch.long)
    u = torch.rand(6, generator=torch.Generator().manual_seed(1))
    a_tok, a_lp = sample(logits, temps, tp, tk, None, u=u)
    b_tok, b_lp = sample(logits.float(), temps, tp, tk, None, u=u)
    assert torch.equal(a_tok, b_tok) and torch.equal(a_lp, b_lp) and a_lp.dtype == torch.float32
