"""Checks on the real embedded model (SmolLM2-135M-Instruct). Marked slow: ~30 s."""

from __future__ import annotations

import pytest
import torch

from teamrl.engines.base import GenRequest, SamplingParams
from teamrl.engines.hf import HFEngine
from tests.conftest import learner_logprob_gap

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real(tokenizer):
    from teamrl.models import load_model_and_tokenizer

    return load_model_and_tokenizer("default")


def _requests(tok, n: int) -> list[GenRequest]:
    return [GenRequest(list(tok.apply_chat_template([{"role": "user", "content": f"What is {i} + {2 * i}?"}],
                                                    add_generation_prompt=True, tokenize=True, return_dict=False)),
                       SamplingParams(temperature=0.7, max_new_tokens=24)) for i in range(n)]


def test_fp32_engine_logprobs_match_learner_within_1e3(real):
    model, tok = real
    reqs = _requests(tok, 8)
    outs = HFEngine(model, tok, seed=0).generate(reqs)
    assert learner_logprob_gap(model, reqs, outs) <= 1e-3


def test_bf16_engine_logprob_gap_is_bounded(real):
    """The bf16 engine copy's log-probs differ from the fp32 learner's: bounded, and why
    configs pair rollout_dtype=bfloat16 with loss.old_logprobs=recompute."""
    model, tok = real
    reqs = _requests(tok, 8)
    outs = HFEngine(model, tok, seed=0, dtype=torch.bfloat16).generate(reqs)
    diff = learner_logprob_gap(model, reqs, outs)
    assert 1e-4 < diff < 1.0


def test_default_model_answers_arithmetic_sometimes(real):
    """Calibration guard: the untrained model gets some single-digit sums right (not 0, not all)."""
    model, tok = real
    reqs = [GenRequest(list(tok.apply_chat_template([{"role": "user", "content": f"What is {a} + {b}? Reply with the number only."}],
                                                    add_generation_prompt=True, tokenize=True, return_dict=False)),
                       SamplingParams(temperature=0, max_new_tokens=12)) for a in range(1, 9, 2) for b in range(2, 9, 2)]
    outs = HFEngine(model, tok).generate(reqs)
    from teamrl.domains.math.arith import last_integer
    right = sum(last_integer(o.text) == a + b for o, (a, b) in zip(outs, [(a, b) for a in range(1, 9, 2) for b in range(2, 9, 2)]))
    assert 0 < right < len(reqs)
