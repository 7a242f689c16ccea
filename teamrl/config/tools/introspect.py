"""What the validator and the docs need to know about config types: fields, defaults, type names."""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import types
import typing
from collections.abc import Sequence
from typing import Any, ClassVar, Literal, Protocol, TypeGuard, Union

_REPR_LIMIT = 60


def _require_dataclass_type(cls: Any, what: str) -> None:
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"{what} expects a dataclass type, got {cls!r}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception as exc:  # NameError for unresolvable forward references, ...
        raise TypeError(f"cannot resolve the type annotations of {cls.__qualname__}: {exc}") from exc


def _init_fields(cls: type) -> dict[str, dataclasses.Field]:
    skip = {"sections"} if _is_sections(cls) else set()
    return {f.name: f for f in dataclasses.fields(cls) if f.init and f.name not in skip}


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


class SectionsType(Protocol):
    """What the tools read of a :class:`~teamrl.config.tools.sections.Sections` subclass (defined above this module)."""

    kind: ClassVar[str]
    alias: ClassVar[str | None]
    sections: dict[str, Any]

    @classmethod
    def section_types(cls) -> dict[str, type | None]: ...


SECTIONS_CLASSES: list[type] = []
"""Every :class:`~teamrl.config.tools.sections.Sections` subclass defined so far (each adds itself)."""


def remember_sections(cls: type) -> None:
    """Record a Sections subclass (called by ``Sections.__init_subclass__``)."""
    SECTIONS_CLASSES.append(cls)


def _is_sections(tp: Any) -> TypeGuard[type[SectionsType]]:
    """A :class:`~teamrl.config.tools.sections.Sections` subclass (found by its marker: no import cycle)."""
    return isinstance(tp, type) and getattr(tp, "_plugin_sections", False) is True


_LIST_ORIGINS = (list, collections.abc.Sequence, collections.abc.MutableSequence)
_DICT_ORIGINS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)


def _is_list(tp: Any) -> bool:
    return tp is list or typing.get_origin(tp) in _LIST_ORIGINS


def _is_tuple(tp: Any) -> bool:
    return tp is tuple or typing.get_origin(tp) is tuple


def _is_dict(tp: Any) -> bool:
    return tp is dict or typing.get_origin(tp) in _DICT_ORIGINS


def _fixed_items(tp: Any) -> list[Any] | None:
    """The item types of a fixed-length ``tuple[X, Y]``; None for ``tuple[X, ...]`` and bare tuple."""
    args = typing.get_args(tp)
    if not args or (len(args) == 2 and args[1] is Ellipsis):
        return None
    return [] if args == ((),) else list(args)


def _item_type(tp: Any, index: Any) -> Any:
    """The type of item ``index`` of a list or tuple type."""
    args = typing.get_args(tp)
    fixed = _fixed_items(tp) if _is_tuple(tp) else None
    if fixed is not None:
        return fixed[index] if isinstance(index, int) and 0 <= index < len(fixed) else Any
    return args[0] if args else Any


def _type_name(tp: Any) -> str:
    """Readable rendering of a type annotation."""
    if tp is Any:
        return "Any"
    if tp is type(None) or tp is None:
        return "None"
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if _is_union(tp):
        return " | ".join(_type_name(a) for a in args)
    if origin in _LIST_ORIGINS:
        return f"list[{_type_name(args[0]) if args else 'Any'}]"
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"tuple[{_type_name(args[0])}, ...]"
        return f"tuple[{', '.join(_type_name(a) for a in args)}]"
    if origin in _DICT_ORIGINS:
        if args:
            return f"dict[{_type_name(args[0])}, {_type_name(args[1])}]"
        return "dict"
    if isinstance(tp, type):
        return tp.__name__
    return repr(tp).replace("typing.", "")


def _strip_optional(tp: Any) -> Any:
    if _is_union(tp):
        others = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(others) == 1:
            return others[0]
    return tp


def _is_leaf(tp: Any) -> bool:
    if _is_dataclass_type(tp) or _is_list(tp) or _is_tuple(tp) or _is_dict(tp):
        return False
    if _is_union(tp):
        return all(_is_leaf(a) for a in typing.get_args(tp))
    return True


def _through_optional(tp: Any) -> Any:
    """``X`` for ``X | None`` when X is a container or a dataclass (its errors are reported inside it)."""
    inner = _strip_optional(tp)
    return inner if inner is not tp and not _is_leaf(inner) else tp


def _field_types(cls: type) -> dict[str, Any]:
    """The keys a mapping for dataclass ``cls`` may hold, with their types (sections included)."""
    hints = _hints(cls)
    out = {name: hints[name] for name in _init_fields(cls)}
    if _is_sections(cls):
        out.update({name: _section_type(c) | None for name, c in cls.section_types().items()})
    return out


def _section_type(cls: type | None) -> Any:
    return dict[str, Any] if cls is None else cls


def _short(value: Any) -> str:
    r = repr(value)
    if len(r) > _REPR_LIMIT:
        r = r[: _REPR_LIMIT - 3] + "..."
    return r


def _got(value: Any) -> str:
    return f"got {_short(value)} ({type(value).__name__})"


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _render(prefix: str, loc: Sequence[Any]) -> str:
    """A location as a dotted key: ``models.main.lora``, ``agents[0].model``."""
    out = prefix
    for part in loc:
        out = f"{out}[{part}]" if isinstance(part, int) else _join(out, part)
    return out
