"""Checkpoint state in safe formats: safetensors for tensors, JSON for everything else.

Nothing here executes code while reading: a file is a safetensors header (JSON) and raw tensor
bytes. Two kinds of file:

- **weights** (:func:`save_weights` / :func:`load_weights`): a flat ``{name: tensor}`` dict under
  its parameter names, as Hugging Face stores models. Names whose tensors share memory (tied
  embeddings) are stored once; the others are recorded as aliases in the header.
- **state** (:func:`save_state` / :func:`load_state`): any tree of dicts, lists, tuples, strings,
  numbers, ``None`` and tensors (optimizer and scheduler state, RNG states, data cursors). The
  tree is JSON in the header with each tensor replaced by a reference into the file.

>>> import tempfile, pathlib
>>> with tempfile.TemporaryDirectory() as d:
...     save_state(pathlib.Path(d) / "s.safetensors", {"step": 3, "betas": (0.9, 0.99), 0: torch.ones(2)})
...     load_state(pathlib.Path(d) / "s.safetensors")
{'step': 3, 'betas': (0.9, 0.99), 0: tensor([1., 1.])}
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file

__all__ = ["CheckpointError", "load_state", "load_weights", "pack", "save_state", "save_weights", "unpack"]

_TREE = "teamrl.tree"
_ALIASES = "teamrl.aliases"
_FORMAT = "teamrl.format"


class CheckpointError(ValueError):
    """A checkpoint file that teamrl cannot read safely (wrong format, damaged, or not teamrl's)."""


def pack(tree: Any, path: str = "state") -> tuple[Any, dict[str, torch.Tensor]]:
    """Split ``tree`` into a JSON-able structure and the tensors it references.

    Tuples become ``{"__tuple__": [...]}``, dicts with a key that is not a plain string (or that
    starts with ``__``) become ``{"__items__": [[key, value], ...]}``, tensors ``{"__tensor__":
    "tN"}``; a tensor that appears twice is stored once.

    Args:
        tree: dicts, lists, tuples, str, int, float, bool, None and torch tensors.
        path: the name of ``tree`` in error messages.

    Returns:
        (the JSON-able structure, ``{reference: tensor}``).

    Raises:
        TypeError: a value of another type, named by its path in the tree.

    >>> pack({"a": (1, torch.zeros(1))})
    ({'a': {'__tuple__': [1, {'__tensor__': 't0'}]}}, {'t0': tensor([0.])})
    """
    tensors: dict[str, torch.Tensor] = {}
    seen: dict[int, str] = {}

    def enc(x: Any, where: str) -> Any:
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, torch.Tensor):
            ref = seen.get(id(x))
            if ref is None:
                ref = seen[id(x)] = f"t{len(tensors)}"
                tensors[ref] = x.detach().to("cpu").contiguous()
            return {"__tensor__": ref}
        if isinstance(x, tuple):
            return {"__tuple__": [enc(v, f"{where}[{i}]") for i, v in enumerate(x)]}
        if isinstance(x, list):
            return [enc(v, f"{where}[{i}]") for i, v in enumerate(x)]
        if isinstance(x, dict):
            if all(isinstance(k, str) and not k.startswith("__") for k in x):
                return {k: enc(v, f"{where}.{k}") for k, v in x.items()}
            return {"__items__": [[enc(k, f"{where} key"), enc(v, f"{where}[{k!r}]")] for k, v in x.items()]}
        raise TypeError(f"cannot store {where} of type {type(x).__name__} in a checkpoint: "
                        "only dicts, lists, tuples, str, numbers, None and tensors")

    return enc(tree, path), tensors


def unpack(data: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of :func:`pack`.

    Raises:
        CheckpointError: a reference to a missing tensor or an unknown marker.

    >>> unpack({"__items__": [[0, {"__tuple__": [1, 2]}]]}, {})
    {0: (1, 2)}
    """

    def dec(x: Any) -> Any:
        if isinstance(x, list):
            return [dec(v) for v in x]
        if not isinstance(x, dict):
            return x
        if len(x) == 1:
            (key, value), = x.items()
            if key == "__tensor__":
                if value not in tensors:
                    raise CheckpointError(f"the checkpoint refers to tensor {value!r}, which it does not hold")
                return tensors[value]
            if key == "__tuple__":
                return tuple(dec(v) for v in value)
            if key == "__items__":
                return {_hashable(dec(k)): dec(v) for k, v in value}
        if any(k.startswith("__") for k in x):
            raise CheckpointError(f"unknown entry {sorted(x)[0]!r} in checkpoint state")
        return {k: dec(v) for k, v in x.items()}

    return dec(data)


def _hashable(key: Any) -> Any:
    if isinstance(key, list):
        return tuple(key)
    return key


def save_state(path: Path, tree: Any) -> None:
    """Write ``tree`` (see :func:`pack`) to one safetensors file at ``path``."""
    data, tensors = pack(tree)
    _save(tensors, path, {_FORMAT: "state", _TREE: json.dumps(data)})


def load_state(path: Path) -> Any:
    """Read a file written by :func:`save_state`; tensors come back on the CPU.

    Raises:
        CheckpointError: the file is not a teamrl state file (or is damaged).
    """
    meta, tensors = _read(path, "state")
    try:
        data = json.loads(meta[_TREE])
    except (KeyError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: damaged teamrl state file ({e})") from None
    return unpack(data, tensors)


def save_weights(path: Path, weights: dict[str, torch.Tensor]) -> None:
    """Write ``{name: tensor}`` to ``path``; names sharing memory are stored once (aliases in the header)."""
    first: dict[tuple, str] = {}
    stored: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    for name, t in weights.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if t.numel() and key in first:
            aliases[name] = first[key]
            continue
        first[key] = name
        stored[name] = t.detach().to("cpu").contiguous()
    _save(stored, path, {_FORMAT: "weights", _ALIASES: json.dumps(aliases)})


def _save(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    """safetensors' ``save_file``, whose I/O failures (a full disk) come back as the OSError they are."""
    try:
        save_file(tensors, str(path), metadata=metadata)
    except SafetensorError as exc:
        code = re.search(r"\(os error (\d+)\)", str(exc))
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(path)) from None


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    """Read a file written by :func:`save_weights` (aliases restored); tensors come back on the CPU.

    Raises:
        CheckpointError: the file is not a teamrl weights file (or is damaged).
    """
    meta, tensors = _read(path, "weights")
    try:
        aliases = json.loads(meta.get(_ALIASES, "{}"))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: damaged teamrl weights file ({e})") from None
    for alias, target in aliases.items():
        tensors[alias] = tensors[target]
    return tensors


def _read(path: Path, kind: str) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """The header metadata and tensors of a safetensors file of teamrl's ``kind``."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        tensors = load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path} is not a readable safetensors file ({e})") from None
    if meta.get(_FORMAT) != kind:
        raise CheckpointError(f"{path} is not a teamrl {kind} file (format {meta.get(_FORMAT)!r})")
    return meta, tensors
