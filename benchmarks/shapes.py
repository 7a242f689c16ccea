"""Random-weight models of Qwen2.5 dimensions for the benchmarks (speed and memory do not depend on the weights)."""

from __future__ import annotations

# config.json of the Qwen/Qwen2.5-*-Instruct models: layers, hidden, intermediate, heads, kv heads ("tiny": for CPU)
SHAPES = {"tiny": (2, 128, 256, 4, 2), "0.5b": (24, 896, 4864, 14, 2), "1.5b": (28, 1536, 8960, 12, 2),
          "3b": (36, 2048, 11008, 16, 2), "7b": (28, 3584, 18944, 28, 4)}
VOCAB = 151936


def random_model(shape: str, dtype: str, device: str):
    """A Qwen2ForCausalLM of ``shape`` with random weights (seed 0), built directly on ``device``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    layers, hidden, inter, heads, kv = SHAPES[shape]
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=32768,
                      tie_word_embeddings=shape != "7b")  # as the released models
    torch.manual_seed(0)
    with torch.device(device):
        return Qwen2ForCausalLM(cfg).to(getattr(torch, dtype))


def prompt_tokenizer(path: str | None = None):
    """The tokenizer that makes prompts for a random model: ``path``, or the embedded default model's."""
    from transformers import AutoTokenizer

    from teamrl.models import resolve_model_path

    return AutoTokenizer.from_pretrained(path or resolve_model_path("default"))
