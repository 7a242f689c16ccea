"""Model shapes the memory plan knows: the ``config.json`` dimensions of the models the recipes name, or a local
folder's ``config.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Shape:
    """A decoder's dimensions (from its ``config.json``)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    head_dim: int = 0  # 0: hidden // heads

    @property
    def params(self) -> int:
        """Parameters of a Llama/Qwen-style decoder (norms and biases left out: < 0.1%).

        >>> SHAPES["Qwen/Qwen3-4B"].params  # 4.02 B, as the model card
        4022272000
        """
        hd = self.head_dim or self.hidden // self.heads
        attn = self.hidden * hd * (2 * self.heads + 2 * self.kv_heads)
        per_layer = attn + 3 * self.hidden * self.intermediate
        return self.layers * per_layer + self.vocab * self.hidden * (1 if self.tied else 2)


# config.json of each model (num_hidden_layers, hidden_size, intermediate_size, num_attention_heads,
# num_key_value_heads, vocab_size, tie_word_embeddings, head_dim)
SHAPES: dict[str, Shape] = {
    "default": Shape(30, 576, 1536, 9, 3, 49152, True),  # SmolLM2-135M-Instruct
    "Qwen/Qwen3-1.7B": Shape(28, 2048, 6144, 16, 8, 151936, True, 128),
    "Qwen/Qwen3-4B": Shape(36, 2560, 9728, 32, 8, 151936, True, 128),
    "Qwen/Qwen3-8B": Shape(36, 4096, 12288, 32, 8, 151936, False, 128),
    "Qwen/Qwen2.5-0.5B": Shape(24, 896, 4864, 14, 2, 151936, True),
    "Qwen/Qwen2.5-1.5B": Shape(28, 1536, 8960, 12, 2, 151936, True),
    "Qwen/Qwen2.5-3B": Shape(36, 2048, 11008, 16, 2, 151936, True),
    "Qwen/Qwen2.5-7B": Shape(28, 3584, 18944, 28, 4, 152064, False),
    "meta-llama/Llama-3.2-3B": Shape(28, 3072, 8192, 24, 8, 128256, True, 128),
}
for _base in ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-3B", "Qwen/Qwen2.5-7B"):
    SHAPES[_base + "-Instruct"] = SHAPES[_base]
    SHAPES[_base.replace("Qwen2.5-", "Qwen2.5-Coder-")] = SHAPES[_base]
    SHAPES[_base.replace("Qwen2.5-", "Qwen2.5-Coder-") + "-Instruct"] = SHAPES[_base]
SHAPES["meta-llama/Llama-3.2-3B-Instruct"] = SHAPES["meta-llama/Llama-3.2-3B"]
SHAPES["inclusionAI/AReaL-boba-2-8B"] = SHAPES["Qwen/Qwen3-8B"]  # a Qwen3-8B fine-tune


def shape_of(path: str) -> Shape | None:
    """The shape of ``models.<m>.path``: :data:`SHAPES`, else a local folder's ``config.json``, else None."""
    if path in SHAPES:
        return SHAPES[path]
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return None
    c = json.loads(cfg.read_text())
    try:
        return Shape(c["num_hidden_layers"], c["hidden_size"], c["intermediate_size"], c["num_attention_heads"],
                     c.get("num_key_value_heads", c["num_attention_heads"]), c["vocab_size"],
                     bool(c.get("tie_word_embeddings", False)), c.get("head_dim") or 0)
    except KeyError:
        return None
