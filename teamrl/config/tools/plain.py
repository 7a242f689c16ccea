"""Config objects as plain data (:func:`to_dict`): nested dicts, lists and scalars, sections beside their selector."""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Mapping
from typing import Any, cast

from teamrl.config.tools.introspect import _init_fields, _is_sections


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {name: _plain(getattr(obj, name)) for name in _init_fields(type(obj))}
        if _is_sections(type(obj)):
            out.update({name: _plain(value) for name, value in cast(Any, obj).sections.items()})
        return out
    if isinstance(obj, Mapping):
        return {_plain(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, enum.Enum):
        return _plain(obj.value)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    return obj


def to_dict(obj: Any) -> dict:
    """A dataclass instance (or mapping) as plain nested dicts/lists/scalars.

    Tuples become lists; fields declared with ``init=False`` are left out and
    sections sit beside their selector, so that ``from_dict(type(obj), to_dict(obj)) == obj``.
    """
    if not ((dataclasses.is_dataclass(obj) and not isinstance(obj, type)) or isinstance(obj, Mapping)):
        raise TypeError(f"to_dict expects a dataclass instance or a mapping, got {obj!r}")
    return _plain(obj)
