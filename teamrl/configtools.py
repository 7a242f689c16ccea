"""Generic loading, validation and documentation of dataclass-based configs.

A config is a tree of ``@dataclass(kw_only=True)`` classes whose fields all
have defaults and are documented by a string literal placed directly under
the field (an *attribute docstring*)::

    @dataclass(kw_only=True)
    class OptimConfig:
        lr: float = 1e-5
        \"\"\"AdamW learning rate.\"\"\"

Values are validated by pydantic in strict mode with YAML's (JSON's) data
model: an int is a float, a list is a tuple, a mapping is a dataclass, and
nothing else is coerced (no ``"3"`` for an int, no ``1`` for a bool).  This
module knows nothing about any particular schema.  It provides:

* :func:`from_dict` -- validate a plain nested mapping (as read from YAML)
  against a dataclass type and build the instance.  Every problem found
  anywhere in the tree is collected and raised once as :class:`ConfigError`,
  one line per problem naming its dotted key.
* :class:`Sections` -- base of a config whose keys, beside its own fields,
  are sections named after registered plug-ins (``task.<name>``), each
  validated against the config class its plug-in registered.
* :func:`to_dict` -- the inverse: a dataclass instance as plain YAML-safe data.
* :func:`parse_overrides` / :func:`merge` -- ``a.b=value`` command-line
  overrides and deep merging of nested mappings.
* :func:`load` -- YAML file + overrides -> validated config.
* :func:`field_docs` / :func:`describe` -- field documentation, and a
  human-readable listing of every key of a config type.
"""

from __future__ import annotations

import ast
import collections.abc
import dataclasses
import enum
import functools
import inspect
import json
import os
import re
import textwrap
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Literal, TypeGuard, TypeVar, Union

import pydantic
import yaml
from pydantic_core import core_schema

from teamrl.suggest import closest

__all__ = [
    "ConfigError",
    "Sections",
    "describe",
    "field_docs",
    "from_dict",
    "load",
    "merge",
    "parse_overrides",
    "to_dict",
]

T = TypeVar("T")

_REPR_LIMIT = 60
_LAST = 1 << 30  # sort position of a missing key, and of a class's own rules after its fields


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


class ConfigError(ValueError):
    """One or more problems with a configuration.

    ``errors`` holds one message per problem; ``str()`` lists them all, one
    per line, under a ``"N config error(s):"`` header.  A single message may
    be passed as a plain string, e.g. from a ``__post_init__``.
    """

    def __init__(self, errors: str | Iterable[str]) -> None:
        if isinstance(errors, str):
            errors = [errors]
        self.errors: list[str] = [str(e) for e in errors]
        # The list itself is the only argument so that pickling round-trips.
        super().__init__(self.errors)

    def __str__(self) -> str:
        lines = [f"{len(self.errors)} config error(s):"]
        lines.extend(f"  {e}" for e in self.errors)
        return "\n".join(lines)


# ---------------------------------------------------------------------------
# Introspection helpers
# ---------------------------------------------------------------------------


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


def _is_sections(tp: Any) -> TypeGuard[type[Sections]]:
    return isinstance(tp, type) and issubclass(tp, Sections)


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


# ---------------------------------------------------------------------------
# Attribute docstrings
# ---------------------------------------------------------------------------


def _parse_class_source(source: str) -> ast.ClassDef | None:
    candidates = [textwrap.dedent(source), "if True:\n" + source]
    for text in candidates:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                return node
    return None


def _own_field_docs(cls: type) -> dict[str, str]:
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    node = _parse_class_source(source)
    if node is None:
        return {}
    docs: dict[str, str] = {}
    body = node.body
    for stmt, nxt in zip(body, body[1:]):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


@functools.cache
def _field_docs_cached(cls: type) -> dict[str, str]:
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object:
            continue
        docs.update(_own_field_docs(klass))
    return docs


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of ``cls`` (including inherited ones), by field name.

    Parsed from the class source; a class whose source is unavailable has no
    docs.  Results are cached per class; the returned dict is a fresh copy.
    """
    return dict(_field_docs_cached(cls))


# ---------------------------------------------------------------------------
# Sections: keys named after registered plug-ins
# ---------------------------------------------------------------------------


@dataclasses.dataclass(kw_only=True)
class Sections:
    """Base of a config that selects a plug-in by ``name`` and holds one section per registered plug-in.

    In YAML the sections sit beside ``name``: ``task: {name: math, math: {train_path: ...}}``.
    :meth:`section_types` (defined by the subclass, usually from a registry) gives each
    plug-in's config class, or None for a plug-in that takes a plain mapping. A section that
    is not given takes its class's defaults (None when the class cannot be built without
    settings). ``alias`` names a key that is another spelling of the selected plug-in's
    section. Sections are read as attributes (``cfg.task.math``); :attr:`selected` is the
    section of ``name``.
    """

    name: str
    """The selected plug-in."""
    sections: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Every registered plug-in's options, by name (in YAML: keys beside ``name``)."""

    kind: ClassVar[str] = "plug-in"
    alias: ClassVar[str | None] = None

    @classmethod
    def section_types(cls) -> dict[str, type | None]:
        """The config class of each registered plug-in (None: a plain mapping)."""
        raise NotImplementedError

    def __post_init__(self) -> None:
        registered = self.section_types()
        unknown = sorted(set(self.sections) - set(registered))
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: no such {self.kind} is registered "
                             f"(registered: {', '.join(sorted(registered))})")
        self.sections = {name: self.sections[name] if self.sections.get(name) is not None else _section_default(c)
                         for name, c in registered.items()}

    @property
    def selected(self) -> Any:
        """The section of the selected plug-in (None when ``name`` is not registered)."""
        return self.sections.get(self.name)

    def __getattr__(self, key: str) -> Any:
        sections = self.__dict__.get("sections")
        if key.startswith("__") or sections is None or key not in sections:
            raise AttributeError(f"{type(self).__name__} has no attribute or section {key!r}")
        return sections[key]

    def __reduce__(self) -> tuple:
        # Sections travel as plain data: a process that has not imported a plug-in's module
        # (a Ray worker) still unpickles the config; there those sections stay mappings.
        fixed = {name: getattr(self, name) for name in _init_fields(type(self))}
        return _restore_sections, (type(self), fixed, {n: _plain(v) for n, v in self.sections.items()})

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: pydantic.GetCoreSchemaHandler) -> Any:
        shape = _shape(cls)
        names = list(cls.section_types())

        def build(value: Any) -> Any:
            fixed = {name: getattr(value, name) for name in _init_fields(cls)}
            given = {n: getattr(value, n) for n in names if getattr(value, n) is not None}
            return cls(**fixed, sections=given)

        return core_schema.no_info_after_validator_function(build, handler.generate_schema(shape))


def _section_default(cls: type | None) -> Any:
    """A section's value when it is not given: the class's defaults, ``{}`` without a class,
    None when the class needs settings (its own checks refuse the defaults)."""
    if cls is None:
        return {}
    try:
        return cls()
    except (ValueError, TypeError):
        return None


def _restore_sections(cls: type[Sections], fixed: dict[str, Any], sections: dict[str, Any]) -> Sections:
    registered = cls.section_types()
    obj: Sections = object.__new__(cls)
    obj.__dict__.update(fixed)
    obj.sections = {}
    for name, data in sections.items():
        section = registered.get(name)
        obj.sections[name] = data if section is None or data is None else from_dict(section, data)
    return obj


def _shape(cls: type[Sections]) -> type:
    """A plain dataclass with ``cls``'s own fields and one optional field per section (what pydantic validates)."""
    hints = _hints(typing.cast(type, cls))
    own: list[tuple[str, Any, Any]] = [
        (n, hints[n], dataclasses.field(default=f.default, default_factory=f.default_factory))
        for n, f in _init_fields(cls).items()]
    clash = {n for n, _, _ in own} & set(cls.section_types())
    if clash:
        raise TypeError(f"{cls.__name__}: a plug-in is registered under the reserved name {', '.join(sorted(clash))}")
    extra = [(n, _section_type(c) | None, dataclasses.field(default=None)) for n, c in cls.section_types().items()]
    return dataclasses.make_dataclass(f"{cls.__name__}Keys", own + extra, kw_only=True)


def _sections_key() -> tuple:
    """What the validators depend on beside the classes themselves: every registry's contents."""
    out: list[tuple[type, tuple]] = []
    stack = list(Sections.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        try:
            out.append((cls, tuple(cls.section_types().items())))
        except NotImplementedError:
            continue
    return tuple(out)


# ---------------------------------------------------------------------------
# from_dict
# ---------------------------------------------------------------------------


_ADAPTERS: dict[tuple[Any, tuple], pydantic.TypeAdapter] = {}


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
    if ready is not _DROPPED:
        try:
            result = _adapter(cls).validate_json(json.dumps(ready), strict=True)
        except pydantic.ValidationError as exc:
            check.translate(ready, exc.errors())
    if check.problems:
        raise ConfigError(check.messages())
    return typing.cast(T, result)


# ---------------------------------------------------------------------------
# to_dict
# ---------------------------------------------------------------------------


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {name: _plain(getattr(obj, name)) for name in _init_fields(type(obj))}
        if isinstance(obj, Sections):
            out.update({name: _plain(value) for name, value in obj.sections.items()})
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


# ---------------------------------------------------------------------------
# YAML, overrides, merging, loading
# ---------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-5`` as a float and rejects duplicate keys."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen: set[tuple[str, str]] = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    continue
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                ident = (key_node.tag, key_node.value)
                if ident in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {key_node.value!r}",
                        key_node.start_mark,
                    )
                seen.add(ident)
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 (and hence PyYAML) needs a dot in a float ("1.0e-5"); also accept
# the exponent-only spelling everyone writes for learning rates.
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _yaml_error_text(exc: yaml.YAMLError) -> tuple[str, Any]:
    if isinstance(exc, yaml.MarkedYAMLError):
        parts = [p for p in (exc.context, exc.problem) if p]
        mark = exc.problem_mark or exc.context_mark
        return "; ".join(parts) or str(exc), mark
    return str(exc), None


def parse_overrides(items: Sequence[str]) -> dict:
    """Turn ``["a.b=3", "x=[1,2]", "name=foo"]`` into a nested dict.

    Values are parsed as YAML (``3`` -> int, ``[1,2]`` -> list, ``null`` ->
    None, ``'3'`` -> str; an empty value is None).  Later items win; all
    malformed items are reported together as one :class:`ConfigError`.
    """
    if isinstance(items, str):
        items = [items]
    errors: list[str] = []
    result: dict = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep:
            errors.append(f"override {item!r}: expected key=value")
            continue
        parts = key.split(".")
        if not key or any(not p.strip() for p in parts):
            errors.append(f"override {item!r}: expected key=value with a dotted key like a.b.c")
            continue
        try:
            value = yaml.load(raw, Loader=_Loader)
        except yaml.YAMLError as exc:
            text, _ = _yaml_error_text(exc)
            errors.append(f"override {item!r}: invalid YAML value: {text}")
            continue
        nested: Any = value
        for part in reversed(parts):
            nested = {part.strip(): nested}
        result = merge(result, nested)
    if errors:
        raise ConfigError(errors)
    return result


def merge(base: Mapping, override: Mapping) -> dict:
    """Deep merge: mappings merge recursively, any other value in ``override`` replaces.

    Neither argument is modified.
    """
    out = dict(base)
    for key, value in override.items():
        current = out.get(key)
        if isinstance(current, Mapping) and isinstance(value, Mapping):
            out[key] = merge(current, value)
        elif isinstance(value, Mapping):
            out[key] = merge({}, value)
        else:
            out[key] = value
    return out


def _read_yaml(path: str | os.PathLike) -> dict:
    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise ConfigError(f"{name}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{name}: is a directory, not a config file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{name}: cannot read config file: {exc}") from None
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        text_, mark = _yaml_error_text(exc)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{name}: YAML syntax error{where}: {text_}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{name}: expected a mapping at the top level, {_got(data)}"
        )
    return dict(data)


def load(
    cls: type[T],
    path: str | os.PathLike | None,
    overrides: Sequence[str] = (),
) -> T:
    """Load a config: defaults of ``cls``, then the YAML file at ``path``
    (``None`` for none), then ``key=value`` ``overrides``; validate the result.

    Raises :class:`ConfigError` for an unreadable file, a YAML syntax error
    (with file path and line), malformed overrides or invalid values.
    """
    _require_dataclass_type(cls, "load")
    data: dict = {} if path is None else _read_yaml(path)
    if overrides:
        data = merge(data, parse_overrides(overrides))
    return from_dict(cls, data)


# ---------------------------------------------------------------------------
# describe
# ---------------------------------------------------------------------------


def _format_value(value: Any) -> str:
    plain = _plain(value)
    try:
        text = yaml.safe_dump(
            plain, default_flow_style=True, width=1 << 30, sort_keys=False
        ).strip()
    except yaml.YAMLError:
        return repr(value)
    if text.endswith("\n..."):
        text = text[: -len("\n...")].strip()
    return text


def _nested(tp: Any) -> tuple[type, str] | None:
    """The dataclass reachable under a field, with the key suffix leading to it."""
    tp = _strip_optional(tp)
    if _is_dataclass_type(tp):
        return tp, ""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in _DICT_ORIGINS and len(args) == 2:
        inner = _strip_optional(args[1])
        if _is_dataclass_type(inner):
            return inner, ".<name>"
    if origin in _LIST_ORIGINS or origin is tuple:
        if args and (origin is not tuple or (len(args) == 2 and args[1] is Ellipsis)):
            inner = _strip_optional(args[0])
            if _is_dataclass_type(inner):
                return inner, "[<i>]"
    return None


def _entries(cls: type) -> list[tuple[str, Any, Any, str | None]]:
    """(key, type, default or MISSING, doc) of every key of ``cls``; a section shows its class, no default."""
    hints, docs = _hints(cls), field_docs(cls)
    out = [(name, hints[name], _default_of(f), docs.get(name)) for name, f in _init_fields(cls).items()]
    if _is_sections(cls):
        for name, section in cls.section_types().items():
            out.append((name, _section_type(section), {} if section is None else None,
                        f"Options of the {name} {cls.kind}."))
    return out


def _describe(cls: type, prefix: str, lines: list[str], stack: tuple[type, ...]) -> None:
    for name, tp, default, doc in _entries(cls):
        key = prefix + name
        nested = _nested(tp)
        header = f"{key}: {_type_name(tp)}"
        direct = nested is not None and nested[1] == "" and _is_dataclass_type(tp)
        if default is dataclasses.MISSING:
            header += "  (required)"
        elif not direct:
            header += f" = {_format_value(default)}"
        lines.append(header)
        if doc:
            lines.extend("    " + ln if ln else "" for ln in doc.splitlines())
        if nested is not None and nested[0] not in stack:
            sub, suffix = nested
            _describe(sub, f"{key}{suffix}.", lines, stack + (sub,))


def describe(cls: type, *, prefix: str = "") -> str:
    """Listing of every field of ``cls``, recursively: dotted key, type,
    default and documentation.

    Fields inside ``dict[str, <dataclass>]`` entries are shown as
    ``key.<name>.field``, inside lists of dataclasses as ``key[<i>].field``.
    """
    _require_dataclass_type(cls, "describe")
    lines: list[str] = []
    _describe(cls, prefix, lines, (cls,))
    return "\n".join(lines)
