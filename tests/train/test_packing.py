"""Packed rows and shared prefixes in the learner: log-probs, entropies, losses and gradients equal the
row-by-row (padded) computation on the shipped workflows' row shapes, for llama, qwen2 and qwen3."""

from __future__ import annotations

import copy

import pytest
import torch

from teamrl.learner.learner import TorchLearner
from teamrl.learner.microbatches import plan_micro_batches
from teamrl.learner.packing import pack_rows, use_packed_attention
from teamrl.learner.scoring import response_logprobs
from teamrl.team.records import Step
from tests.train.test_learner import settings


def tiny(tokenizer, arch: str, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
           "qwen3": (Qwen3Config, Qwen3ForCausalLM)}[arch]
    extra = {"head_dim": 16} if arch == "qwen3" else {}
    return cls[1](cls[0](**common, **extra)).float()


def _step(prompt, reply, agent, episode, prompt_index=0, adv=0.5, call=0):
    return Step(prompt_index=prompt_index, episode=episode, agent=agent, agent_call=call, model="m",
                prompt_ids=list(prompt), response_ids=list(reply), logprobs=[-1.0] * len(reply), temperature=0.7,
                text="", valid=True, advantage=adv)


def shaped_rows(tokenizer, shape: str) -> list[Step]:
    """Rows with the structure a shipped workflow gives: G episodes of one prompt per group."""
    g = torch.Generator().manual_seed(1)
    reply = lambda n: torch.randint(10, 2000, (n,), generator=g).tolist()  # noqa: E731
    def enc(text: str, system: str | None = None) -> list[int]:
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        return tokenizer.encode(tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))

    rows: list[Step] = []
    if shape == "math_team":  # solver: one prompt per problem; verifier: the question and that episode's solution
        for p in range(2):
            q = enc(f"What is {p + 3} + {p + 11}? Answer with a number.")
            for e in range(4):
                sol = reply(5 + e)
                rows.append(_step(q, sol, "solver", 4 * p + e, p, adv=0.3 * e - 0.4))
                rows.append(_step(enc(f"Problem {p}. Solution: {tokenizer.decode(sol)} Is it right?"), reply(3),
                                  "verifier", 4 * p + e, p, adv=0.2 - 0.1 * e))
    elif shape == "search_team":  # the router's later calls extend its earlier prompt (history grows per turn)
        for e in range(3):
            hist = enc("Who wrote Hamlet? Is the information enough?")
            for turn in range(3):
                r = reply(2 + turn)
                rows.append(_step(hist, r, "router", e, 0, adv=0.5 - 0.3 * turn, call=turn))
                hist = hist + r + enc(f"<information>Doc {turn} (Title: T{turn}) text {e}</information> enough?")
    elif shape == "tree":  # refiners see the parent's reply appended to the root prompt
        root = enc("Compute 17 * 3.")
        first = reply(6)
        rows.append(_step(root, first, "solver", 0, 0, adv=-0.5))
        for k in range(3):
            rows.append(_step(root + first + enc("That is wrong. Try again."), reply(4 + k), "refiner", 0, 0,
                              adv=0.4 * k - 0.2, call=k))
    elif shape == "agent_program":  # chat requests of an OpenAI-style program: system + user, no grouping order
        for e in range(4):
            sys_user = enc(f"task {e % 2}", system="You plan.")
            rows.append(_step(sys_user, reply(3 + e), "planner", e, e % 2, adv=0.1 * e))
    return rows


def _grads(model, rows, **kw):
    model.zero_grad(set_to_none=True)
    out = TorchLearner("m", model, settings(**kw), {}).compute_gradients(rows)
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("shape", ["math_team", "search_team", "tree", "agent_program"])
def test_packed_and_shared_equal_row_by_row(tokenizer, arch, shape):
    rows = shaped_rows(tokenizer, shape)
    model = tiny(tokenizer, arch)
    want_lp, want_ent, mask = response_logprobs(model, rows, entropy_grad=True)
    base_out, base = _grads(model, rows, kl_coef=0.0, entropy_coef=0.01)
    packed = copy.deepcopy(model)
    use_packed_attention(packed)
    for share in (False, True):
        lp, ent, mask2 = response_logprobs(packed, rows, entropy_grad=True, pack=True, share=share)
        torch.testing.assert_close(lp, want_lp, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ent, want_ent, rtol=1e-5, atol=1e-5)
        assert torch.equal(mask, mask2)
        out, grads = _grads(packed, rows, kl_coef=0.0, entropy_coef=0.01, pack_rows=True, share_prefixes=share)
        assert out["loss"] == pytest.approx(base_out["loss"], rel=1e-5)
        for n, g in base.items():
            torch.testing.assert_close(grads[n], g, rtol=1e-5, atol=1e-7, msg=lambda m, n=n: f"{n}: {m}")
        assert out["perf/update_tokens_needed"] == base_out["perf/update_tokens_needed"]
        assert out["perf/update_tokens_computed"] <= out["perf/update_tokens_needed"]
    # shapes with repeated prompts compute fewer tokens when shared
    if shape in ("math_team", "search_team", "tree"):
        assert out["perf/update_tokens_computed"] < out["perf/update_tokens_needed"]


def test_shared_prefix_with_kl_reference_and_gradient_checkpointing(tokenizer):
    from teamrl.runtime.local import enable_checkpointing

    rows = shaped_rows(tokenizer, "math_team")
    model = tiny(tokenizer, "llama")
    _, base = _grads(model, rows, kl_coef=0.05)
    packed = copy.deepcopy(model)
    enable_checkpointing(packed)  # as models.<m>.gradient_checkpointing does
    packed.train()
    _, grads = _grads(packed, rows, kl_coef=0.05, pack_rows=True, share_prefixes=True)
    for n, g in base.items():
        torch.testing.assert_close(grads[n], g, rtol=1e-5, atol=1e-7)


def test_calls_without_a_layout_stay_sdpa(tokenizer):
    model = tiny(tokenizer, "llama")
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 0]])
    attn = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    want = model(input_ids=ids, attention_mask=attn).logits
    use_packed_attention(model)
    torch.testing.assert_close(model(input_ids=ids, attention_mask=attn).logits, want, rtol=0, atol=0)


def test_layout_by_hand():
    # rows a = [1 2 3 4], b = [1 2 3 5], c = [1 2], d = [7]: the trie 1-2-3 {4, 5}, with c ending inside 1-2-3
    lay = pack_rows([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2], [7]], share=True)
    assert lay.ids == [1, 2, 3, 4, 5, 7] and lay.positions == [0, 1, 2, 3, 3, 0]
    assert lay.index == [[0, 1, 2, 3], [0, 1, 2, 4], [0, 1], [5]]
    assert [(s.start, s.end, s.context) for s in lay.segments] == [(0, 3, ()), (3, 4, (0, 1, 2)), (4, 5, (0, 1, 2)),
                                                                   (5, 6, ())]
    assert lay.computed == 6  # of 11 tokens the rows hold
    assert plan_micro_batches([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2], [7]], budget=5, share=True) == [([0, 1, 2], 5),
                                                                                                 ([3], 1)]


def test_models_that_cannot_take_the_layout_are_refused(tokenizer):
    model = tiny(tokenizer, "qwen2")
    model.config.use_sliding_window, model.config.sliding_window = True, 16
    with pytest.raises(ValueError, match="sliding-window.*loss.pack_rows=false"):
        use_packed_attention(model)
    eager = tiny(tokenizer, "llama")
    eager.config._attn_implementation = "eager"
    with pytest.raises(ValueError, match="'eager'.*loss.pack_rows=false"):
        use_packed_attention(eager)


def test_share_prefixes_needs_pack_rows():
    from teamrl.config.schema import load_config
    from teamrl.config.tools import ConfigError

    with pytest.raises(ConfigError, match="loss.share_prefixes"):
        load_config(None, ["loss.pack_rows=false"])
    load_config(None, ["loss.pack_rows=false", "loss.share_prefixes=false"])


def test_lora_adapters_per_agent_packed_equal_padded(tokenizer):
    peft = pytest.importorskip("peft", reason="LoRA needs peft (pip install 'teamrl[lora]')")
    rows = shaped_rows(tokenizer, "math_team")

    def lora_grads(**kw):
        model = tiny(tokenizer, "llama")
        cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                              bias="none", task_type="CAUSAL_LM")
        wrapped = peft.get_peft_model(model, cfg, adapter_name="solver")
        wrapped.add_adapter("verifier", cfg)
        learner = TorchLearner("m", wrapped, settings(**kw), {},
                               agent_adapters={"solver": "solver", "verifier": "verifier"})
        learner.compute_gradients(rows)
        return {n: p.grad.clone() for n, p in wrapped.named_parameters() if p.grad is not None}

    want, got = lora_grads(), lora_grads(pack_rows=True, share_prefixes=True)
    assert want.keys() == got.keys() and any("verifier" in n for n in want) and any("solver" in n for n in want)
    for n, g in want.items():
        torch.testing.assert_close(got[n], g, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("shape", ["math_team", "search_team"])
def test_packed_and_shared_under_bf16_autocast_within_bf16_tolerance(tokenizer, shape):
    """The shipped CPU/GPU path trains under bf16 autocast: packed and shared layouts round differently from the
    padded one (other matmul shapes, other attention blocks), by bf16's precision and no more."""
    rows = shaped_rows(tokenizer, shape)
    model = tiny(tokenizer, "qwen2")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want_lp, _, _ = response_logprobs(model, rows)
    base_out, base = _grads(model, rows, autocast=True)
    packed = copy.deepcopy(model)
    use_packed_attention(packed)
    for share in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lp, _, _ = response_logprobs(packed, rows, pack=True, share=share)
        torch.testing.assert_close(lp, want_lp, rtol=0, atol=0.05)  # log-probs of ~-7.6: bf16 keeps 3 digits
        out, grads = _grads(packed, rows, autocast=True, pack_rows=True, share_prefixes=share)
        assert out["loss"] == pytest.approx(base_out["loss"], rel=2e-2)
        num = torch.sqrt(sum(((grads[n] - g).float() ** 2).sum() for n, g in base.items()))
        den = torch.sqrt(sum((g.float() ** 2).sum() for g in base.values()))
        assert float(num / den) < 3e-2, f"share={share}: relative gradient difference {float(num / den):.3g}"


def test_weight_casts_kept_over_micro_batches_change_nothing(tokenizer, monkeypatch):
    """Under autocast each weight is cast to bf16 once per gradient pass (one cache over the micro-batches):
    gradients and metrics are bit for bit those of casting again in every micro-batch."""
    import contextlib

    rows = shaped_rows(tokenizer, "math_team")
    model = tiny(tokenizer, "llama")
    use_packed_attention(model)
    kw = dict(autocast=True, pack_rows=True, share_prefixes=True, micro_batch_tokens=40)  # several micro-batches
    out, kept = _grads(model, rows, **kw)
    monkeypatch.setattr(TorchLearner, "_weight_casts", lambda self: contextlib.nullcontext())
    out2, again = _grads(model, rows, **kw)
    assert out == out2
    for n, g in kept.items():
        assert torch.equal(g, again[n]), n


@pytest.mark.parametrize("shape, budget", [("math_team", "none plain"), ("search_team", "none plain"),
                                           ("math_team", "mixed")])  # the search rows here make one bucket
def test_buckets_past_the_plain_budget_attend_with_sdpa_and_equal_row_by_row(tokenizer, monkeypatch, shape, budget):
    """On a CPU the buckets past PLAIN_SCORES take scaled_dot_product_attention with the tree mask (as every bucket
    does on a GPU); alone or mixed with plain buckets in one layout, the result equals the padded computation."""
    from teamrl.learner import packing

    seen: list[list[bool]] = []
    real = packing.plain_buckets

    def spy(shapes, heads, device_type):
        # mixed: a budget that holds the layout's smallest bucket only
        smallest = min(S * heads * lq * lk for S, lq, lk in shapes)
        monkeypatch.setattr(packing, "PLAIN_SCORES", 0 if budget == "none plain" else smallest)
        seen.append(real(shapes, heads, device_type))
        return seen[-1]

    monkeypatch.setattr(packing, "plain_buckets", spy)
    rows = shaped_rows(tokenizer, shape)
    model = tiny(tokenizer, "qwen2")
    base_out, base = _grads(model, rows, kl_coef=0.0, entropy_coef=0.01)
    packed = copy.deepcopy(model)
    use_packed_attention(packed)
    out, grads = _grads(packed, rows, kl_coef=0.0, entropy_coef=0.01, pack_rows=True, share_prefixes=True)
    if budget == "none plain":
        assert seen and not any(f for layout in seen for f in layout)
    else:  # every layout of more than one bucket attends some of them each way
        assert any(len(layout) > 1 for layout in seen)
        assert all(layout[0] if len(layout) == 1 else any(layout) and not all(layout) for layout in seen)
    assert out["loss"] == pytest.approx(base_out["loss"], rel=1e-5)
    for n, g in base.items():
        torch.testing.assert_close(grads[n], g, rtol=1e-5, atol=1e-7, msg=lambda m, n=n: f"{n}: {m}")


def test_micro_batches_keep_groups_whole_and_never_compute_more():
    # groups of replies under one prompt, every prompt opening with the same template: each micro-batch holds
    # the rows in order, fits the budget (or is one long row), computes what its layout computes, and the plan
    # computes no more tokens than filling row by row (and fewer over the whole sample)
    import random

    from teamrl.learner.microbatches import _fill

    rng = random.Random(0)
    planned = filled = 0
    for _ in range(300):
        seqs = []
        for _g in range(rng.randint(1, 12)):
            prompt = [1, 2, 3] + [rng.randint(10, 10**6) for _ in range(rng.randint(1, 150))]
            seqs += [prompt + [rng.randint(10, 10**6) for _ in range(rng.randint(1, 40))] for _r in range(rng.randint(1, 8))]
        budget = rng.choice([128, 256, 512, 1024])
        plan = plan_micro_batches(seqs, budget, share=True)
        assert [i for rows, _ in plan for i in rows] == list(range(len(seqs)))
        for rows, computed in plan:
            assert computed == pack_rows([seqs[i] for i in rows], share=True).computed
            assert computed <= budget or len(rows) == 1
        fill = sum(c for _, c in _fill(seqs, budget, share=True, keep_groups=False))
        assert sum(c for _, c in plan) <= fill
        planned, filled = planned + sum(c for _, c in plan), filled + fill
    assert planned < 0.99 * filled
