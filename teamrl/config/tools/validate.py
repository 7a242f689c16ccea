"""Validation of plain nested data (as read from YAML) against a config dataclass, with pydantic in
strict mode; every problem is collected and raised once, one line per dotted key. And the inverse.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

import pydantic

from teamrl.config.tools.errors import ConfigError
from teamrl.config.tools.introspect import (
    SECTIONS_CLASSES,
    _default_of,
    _field_types,
    _fixed_items,
    _got,
    _init_fields,
    _is_dataclass_type,
    _is_dict,
    _is_list,
    _is_sections,
    _is_tuple,
    _is_union,
    _item_type,
    _join,
    _render,
    _require_dataclass_type,
    _through_optional,
    _type_name,
)
from teamrl.config.tools.plain import to_dict
from teamrl.suggest import closest

T = TypeVar("T")
_LAST = 1 << 30  # sort position of a missing key, and of a class's own rules after its fields
_WRITTEN: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar("teamrl_config_written",
                                                                                   default=None)


def written() -> Mapping[str, Any] | None:
    """The data :func:`from_dict` is validating, as written (a file merged with its overrides), for a class's own
    rules that must tell what the user wrote from what the defaults add; None outside :func:`from_dict`."""
    return _WRITTEN.get()


# ---------------------------------------------------------------------------
# from_dict
# ---------------------------------------------------------------------------


_ADAPTERS: dict[tuple[Any, tuple], pydantic.TypeAdapter] = {}


def _sections_key() -> tuple:
    """What the validators depend on beside the classes themselves: every registry's contents."""
    out: list[tuple[type, tuple]] = []
    for cls in SECTIONS_CLASSES:
        try:
            out.append((cls, tuple(cls.section_types().items())))  # type: ignore[attr-defined]
        except NotImplementedError:
            continue
    return tuple(out)




# ---------------------------------------------------------------------------
# to_dict


def _adapter(cls: Any) -> pydantic.TypeAdapter:
    """The validator of ``cls``, built once per state of the plug-in registries."""
    key = (cls, _sections_key())
    if key not in _ADAPTERS:
        _ADAPTERS[key] = pydantic.TypeAdapter(cls)
    return _ADAPTERS[key]


_DROPPED: Any = object()  # stands for a value YAML cannot hold, already reported


class _Check:
    """One validation: the data made ready for pydantic, and every problem found, in data order."""

    def __init__(self, cls: type, data: Any, prefix: str) -> None:
        self.cls = cls
        self.data = data
        self.prefix = prefix
        self.problems: list[tuple[tuple, str]] = []  # (position in the data as written, message)
        self.aliases: dict[tuple, tuple] = {}  # location in the data made ready -> location as written

    def written(self, loc: tuple) -> tuple:
        """``loc`` as the user wrote it (an alias key instead of the section it stands for)."""
        for at, shown in self.aliases.items():
            if loc[: len(at)] == at:
                return shown + loc[len(at):]
        return loc

    def path(self, loc: tuple) -> str:
        return _render(self.prefix, self.written(loc))

    def where(self, loc: tuple) -> str:
        return self.path(loc) or "<root>"

    def add(self, loc: tuple, message: str, *, last: bool = False) -> None:
        position = _position(self.data, self.written(loc)) + ((_LAST,) if last else ())
        if all(message != m for _, m in self.problems):
            self.problems.append((position, message))

    def messages(self) -> list[str]:
        return [m for _, m in sorted(self.problems, key=lambda p: p[0])]

    # -- before pydantic: keys, aliases and values YAML cannot hold --------------------------------

    def prepare(self, tp: Any, value: Any, loc: tuple) -> Any:
        """``value`` as JSON data for ``tp``: unknown keys reported and left out, aliases resolved."""
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = to_dict(value)
        tp = _through_optional(tp) if value is not None else tp
        if isinstance(value, Mapping) and (_is_dataclass_type(tp) or _is_dict(tp)):
            fields = _is_dataclass_type(tp)
            if fields and _is_sections(tp) and tp.alias is not None and tp.alias in value:
                value = self.resolve_alias(tp, value, loc)
            known = _field_types(tp) if fields else {}
            item_tp = typing.get_args(tp)[1] if not fields and typing.get_args(tp) else Any
            out = {}
            for key, item in value.items():
                if fields and key not in known:
                    self.add(loc + (key,), _unknown_key(self.path(loc + (key,)), self.path(loc), key, known, tp))
                elif not isinstance(key, str):
                    self.add(loc + (key,), f"{self.where(loc)}: expected keys of type str, {_got(key)}")
                else:
                    out[key] = self.prepare(known[key] if fields else item_tp, item, loc + (key,))
            return {k: v for k, v in out.items() if v is not _DROPPED}
        if (_is_list(tp) or _is_tuple(tp)) and isinstance(value, (list, tuple)):
            items = [self.prepare(_item_type(tp, i), v, loc + (i,)) for i, v in enumerate(value)]
            return [None if v is _DROPPED else v for v in items]
        if _is_json(value):
            return value
        expected = "YAML data (mappings, lists, strings, numbers, bools, null)" if tp is Any else _expected(tp)
        self.add(loc, f"{self.where(loc)}: expected {expected}, {_got(value)}")
        return _DROPPED

    def resolve_alias(self, cls: Any, value: Mapping, loc: tuple) -> dict:
        """``value`` with the alias key renamed to the selected plug-in's section, in its place."""
        alias = cls.alias
        own = _init_fields(cls)
        target = value.get("name", _default_of(own["name"]) if "name" in own else None)
        out = dict(value)
        if value[alias] is None or value[alias] == {} or target not in cls.section_types():
            del out[alias]  # nothing to set, or an unknown name (reported as such)
            return out
        if value.get(target) not in (None, {}):
            self.add(loc + (alias,), f"{self.path(loc + (alias,))}: sets the options of {target!r} a second time; "
                                     f"keep {self.path(loc + (target,))} and remove {self.path(loc + (alias,))}")
            del out[alias]
            return out
        self.aliases[loc + (target,)] = loc + (alias,)
        return {target if k == alias else k: v for k, v in out.items() if k != target}

    # -- after pydantic: its errors as our messages ------------------------------------------------

    def translate(self, ready: Any, errors: list[Any]) -> None:
        for err in errors:
            loc = tuple(err["loc"])
            exc = (err.get("ctx") or {}).get("error")
            if isinstance(exc, Exception):  # a class's own check (its __post_init__)
                where = self.path(loc)
                for line in exc.errors if isinstance(exc, ConfigError) else [str(exc)]:
                    self.add(loc, f"{where}: {line}" if where else line, last=True)
                continue
            if err["type"] == "missing" and loc:
                parent, ptp = _locate(self.cls, loc[:-1])
                if parent == loc[:-1] and _is_dataclass_type(ptp):
                    self.add(loc, f"{self.where(loc)}: required", last=True)
                    continue
                at, tp = parent, ptp  # a fixed-length tuple with too few items
            else:
                at, tp = _locate(self.cls, loc)
            value = _value_at(ready, at)
            self.add(at, f"{self.where(at)}: expected {_expected(tp, value)}, {_got(value)}{_hint(tp, value)}")


def _is_json(value: Any) -> bool:
    """Whether YAML (and JSON) can hold ``value``: mappings with string keys, lists, strings, numbers, bools, null."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return True
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return isinstance(value, (list, tuple)) and all(_is_json(v) for v in value)


def _unknown_key(full: str, parent: str, key: Any, known: Mapping[str, Any], cls: type) -> str:
    suggestion = closest(key, known) if isinstance(key, str) else None
    if suggestion is not None:
        return f"unknown key {full!r}; did you mean {_join(parent, suggestion)!r}?"
    if known:
        return f"unknown key {full!r}; valid keys are: {', '.join(known)}"
    return f"unknown key {full!r}; {cls.__name__} takes no keys"


def _locate(cls: type, loc: tuple) -> tuple[tuple, Any]:
    """The location an error at ``loc`` is reported at, and the type declared there.

    Errors inside a union (other than ``X | None``) and inside a fixed-length tuple's
    length are reported for the whole union or tuple.
    """
    tp: Any = cls
    for i, part in enumerate(loc):
        tp = _through_optional(tp)
        if _is_union(tp):
            return loc[:i], tp
        if _is_dataclass_type(tp):
            tp = _field_types(tp).get(part, Any)
        elif _is_dict(tp):
            args = typing.get_args(tp)
            tp = args[1] if args else Any
        elif _is_list(tp) or _is_tuple(tp):
            fixed = _fixed_items(tp) if _is_tuple(tp) else None
            if fixed is not None and not (isinstance(part, int) and part < len(fixed)):
                return loc[:i], tp
            tp = _item_type(tp, part)
        else:
            return loc[:i], tp
    return loc, _through_optional(tp)


def _expected(tp: Any, value: Any = None) -> str:
    if _is_dataclass_type(tp):
        return f"a mapping ({tp.__name__})"
    if _is_dict(tp):
        return f"a mapping ({_type_name(tp)})"
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if _is_tuple(tp) and _fixed_items(tp) is not None and isinstance(value, list):
        return f"{_type_name(tp)} ({len(_fixed_items(tp) or [])} items)"
    return _type_name(tp)


def _hint(tp: Any, value: Any) -> str:
    if not isinstance(value, str):
        return ""
    options = [tp, *typing.get_args(tp)] if _is_union(tp) else [tp]
    words = [a for o in options if typing.get_origin(o) is Literal for a in typing.get_args(o) if isinstance(a, str)]
    suggestion = closest(value, words)
    return f"; did you mean {suggestion!r}?" if suggestion is not None else ""


def _value_at(data: Any, loc: tuple) -> Any:
    for part in loc:
        if isinstance(data, Mapping) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
        else:
            return None
    return data


def _position(data: Any, loc: tuple) -> tuple:
    """Where ``loc`` is in ``data``: the index of each key or item on the way (missing keys last)."""
    out: list[int] = []
    for part in loc:
        if isinstance(data, Mapping):
            keys = list(data)
            if part not in data:
                return (*out, _LAST)
            out.append(keys.index(part))
            data = data[part]
        elif isinstance(data, (list, tuple)) and isinstance(part, int) and 0 <= part < len(data):
            out.append(part)
            data = data[part]
        else:
            return (*out, _LAST)
    return tuple(out)


def from_dict(cls: type[T], data: Mapping[str, Any], *, path: str = "") -> T:
    """Validate ``data`` against dataclass ``cls`` and build the instance.

    Keys missing from ``data`` take the dataclass defaults.  All problems in
    the whole tree (unknown keys, wrong types, ``__post_init__`` failures) are
    collected and raised together as one :class:`ConfigError`.  ``path``
    prefixes every key in messages.
    """
    _require_dataclass_type(cls, "from_dict")
    check = _Check(cls, data, path)
    ready = check.prepare(cls, data, ())
    result = None
    token = _WRITTEN.set(data)
    try:
        if ready is not _DROPPED:
            try:
                result = _adapter(cls).validate_json(json.dumps(ready), strict=True)
            except pydantic.ValidationError as exc:
                check.translate(ready, exc.errors())
                _rules_without(check, cls, ready, exc.errors())
    finally:
        _WRITTEN.reset(token)
    if check.problems:
        raise ConfigError(check.messages())
    return typing.cast(T, result)


def _rules_without(check: _Check, cls: type, ready: Any, errors: list[Any]) -> None:
    """The classes' own rules (``__post_init__``) that a value of the wrong type kept from running: validated again
    with those values left at their defaults, so every problem comes in one report (a type error no longer hides an
    unknown estimator). A rule's message that names a left-out key is not added (it would be about the default)."""
    for _ in range(3):  # each pass can only remove values
        bad = {_locate(cls, tuple(e["loc"]))[0] for e in errors if not isinstance((e.get("ctx") or {}).get("error"),
                                                                                  Exception)}
        bad = {loc for loc in bad if loc}
        if not bad:
            return
        for loc in sorted(bad, key=len, reverse=True):
            parent = _value_at(ready, loc[:-1]) if len(loc) > 1 else ready
            if isinstance(parent, dict):
                parent.pop(loc[-1], None)
            elif isinstance(parent, list) and len(loc) > 1:  # a list with a bad item: the whole list goes
                grand = _value_at(ready, loc[:-2]) if len(loc) > 2 else ready
                if isinstance(grand, dict):
                    grand.pop(loc[-2], None)
        names = [check.path(loc) for loc in bad]
        try:
            _adapter(cls).validate_json(json.dumps(ready), strict=True)
            return
        except pydantic.ValidationError as exc:
            errors = exc.errors()
        for err in errors:
            found = (err.get("ctx") or {}).get("error")
            if not isinstance(found, Exception):
                continue
            where = check.path(tuple(err["loc"]))
            for line in found.errors if isinstance(found, ConfigError) else [str(found)]:
                if not any(n and n in line for n in names):
                    check.add(tuple(err["loc"]), f"{where}: {line}" if where else line, last=True)
