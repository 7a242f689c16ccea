"""Generic loading, validation and documentation of dataclass-based configs.

A config is a tree of ``@dataclass(kw_only=True)`` classes whose fields all
have defaults and are documented by a string literal placed directly under
the field (an *attribute docstring*)::

    @dataclass(kw_only=True)
    class OptimConfig:
        lr: float = 1e-5
        \"\"\"AdamW learning rate.\"\"\"

This module knows nothing about any particular schema.  It provides:

* :func:`from_dict` -- validate a plain nested mapping (as read from YAML)
  against a dataclass type and build the instance.  Every problem found
  anywhere in the tree is collected and raised once as :class:`ConfigError`.
* :func:`to_dict` -- the inverse: a dataclass instance as plain YAML-safe data.
* :func:`parse_overrides` / :func:`merge` -- ``a.b=value`` command-line
  overrides and deep merging of nested mappings.
* :func:`load` -- YAML file + overrides -> validated config.
* :func:`field_docs` / :func:`describe` -- field documentation, and a
  human-readable listing of every key of a config type.

Supported field types: ``bool``, ``int``, ``float``, ``str``, ``Literal[...]``,
unions (``X | None`` in particular), ``list[X]``, ``tuple[X, ...]``,
fixed-length ``tuple[X, Y]``, ``dict[K, V]``, nested dataclasses (also as the
``X`` / ``V`` of the containers above) and ``Any``.  Any other class is
checked with ``isinstance``.
"""

from __future__ import annotations

import ast
import collections.abc
import dataclasses
import enum
import functools
import inspect
import os
import re
import textwrap
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar, Union

import yaml

from teamrl.suggest import closest

__all__ = [
    "ConfigError",
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


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception as exc:  # NameError for unresolvable forward references, ...
        raise TypeError(
            f"cannot resolve the type annotations of {cls.__qualname__}: {exc}"
        ) from exc


def _init_fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def _has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


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


_LIST_ORIGINS = (
    list,
    collections.abc.Sequence,
    collections.abc.MutableSequence,
)
_DICT_ORIGINS = (
    dict,
    collections.abc.Mapping,
    collections.abc.MutableMapping,
)


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


def _short(value: Any) -> str:
    r = repr(value)
    if len(r) > _REPR_LIMIT:
        r = r[: _REPR_LIMIT - 3] + "..."
    return r


def _got(value: Any) -> str:
    return f"got {_short(value)} ({type(value).__name__})"


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _where(path: str) -> str:
    return path or "<root>"


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


@functools.lru_cache(maxsize=None)
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
# from_dict
# ---------------------------------------------------------------------------


class _Invalid:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<invalid>"


_INVALID: Any = _Invalid()


def _fail(errors: list[str], path: str, expected: str, value: Any, hint: str = "") -> Any:
    errors.append(f"{_where(path)}: expected {expected}, {_got(value)}{hint}")
    return _INVALID


def _build_dataclass(cls: type, data: Any, path: str, errors: list[str]) -> Any:
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        return _fail(errors, path, f"a mapping ({cls.__name__})", data)

    hints = _hints(cls)
    flds = _init_fields(cls)
    kwargs: dict[str, Any] = {}
    complete = True

    for key, raw in data.items():
        if not isinstance(key, str) or key not in flds:
            full = _join(path, key)
            suggestion = closest(key, flds) if isinstance(key, str) else None
            if suggestion is not None:
                errors.append(
                    f"unknown key {full!r}; did you mean {_join(path, suggestion)!r}?"
                )
            elif flds:
                errors.append(
                    f"unknown key {full!r}; valid keys are: {', '.join(flds)}"
                )
            else:
                errors.append(f"unknown key {full!r}; {cls.__name__} takes no keys")
            continue
        value = _convert(hints[key], raw, _join(path, key), errors)
        if value is _INVALID:
            complete = False
        else:
            kwargs[key] = value

    for name, f in flds.items():
        if name not in data and not _has_default(f):
            errors.append(f"{_join(path, name)}: required")
            complete = False

    if not complete:
        # Some field could not be converted; constructing (and running
        # __post_init__ checks) on partial data would only add noise.
        return _INVALID

    try:
        return cls(**kwargs)
    except ConfigError as exc:
        errors.extend(f"{path}: {e}" if path else e for e in exc.errors)
    except ValueError as exc:
        errors.append(f"{path}: {exc}" if path else str(exc))
    return _INVALID


def _convert_union(tp: Any, value: Any, path: str, errors: list[str]) -> Any:
    args = typing.get_args(tp)
    if value is None and type(None) in args:
        return None
    others = [a for a in args if a is not type(None)]
    if len(others) == 1 and not _is_leaf(others[0]):
        # Optional[<container or dataclass>]: report the inner errors directly.
        return _convert(others[0], value, path, errors)
    for option in others:
        scratch: list[str] = []
        result = _convert(option, value, path, scratch)
        if result is not _INVALID:
            return result
    hint = ""
    if isinstance(value, str):
        words = [
            a
            for o in others
            if typing.get_origin(o) is Literal
            for a in typing.get_args(o)
            if isinstance(a, str)
        ]
        suggestion = closest(value, words)
        if suggestion is not None:
            hint = f"; did you mean {suggestion!r}?"
    return _fail(errors, path, _type_name(tp), value, hint)


def _is_leaf(tp: Any) -> bool:
    if _is_dataclass_type(tp):
        return False
    origin = typing.get_origin(tp)
    if origin in _LIST_ORIGINS or origin in _DICT_ORIGINS or origin is tuple:
        return False
    if tp in (list, tuple, dict):
        return False
    if _is_union(tp):
        return all(_is_leaf(a) for a in typing.get_args(tp))
    return True


def _convert_items(
    elem_types: Sequence[Any], value: Sequence[Any], path: str, errors: list[str]
) -> list[Any] | Any:
    out: list[Any] = []
    ok = True
    for i, (etp, item) in enumerate(zip(elem_types, value)):
        conv = _convert(etp, item, f"{path}[{i}]", errors)
        if conv is _INVALID:
            ok = False
        out.append(conv)
    return out if ok else _INVALID


def _convert(tp: Any, value: Any, path: str, errors: list[str]) -> Any:
    """Convert ``value`` to ``tp``; on failure append messages and return _INVALID."""
    if tp is Any or tp is object:
        return value
    if tp is type(None) or tp is None:
        return None if value is None else _fail(errors, path, "None", value)

    origin = typing.get_origin(tp)
    args = typing.get_args(tp)

    if origin is Literal:
        for option in args:
            if value == option and type(value) is type(option):
                return option
        hint = ""
        if isinstance(value, str):
            suggestion = closest(value, [a for a in args if isinstance(a, str)])
            if suggestion is not None:
                hint = f"; did you mean {suggestion!r}?"
        expected = "one of " + ", ".join(repr(a) for a in args)
        return _fail(errors, path, expected, value, hint)

    if _is_union(tp):
        return _convert_union(tp, value, path, errors)

    if _is_dataclass_type(tp):
        return _build_dataclass(tp, value, path, errors)

    if origin in _LIST_ORIGINS or tp is list:
        if not isinstance(value, (list, tuple)):
            return _fail(errors, path, _type_name(tp), value)
        etp = args[0] if args else Any
        return _convert_items([etp] * len(value), value, path, errors)

    if origin is tuple or tp is tuple:
        if not isinstance(value, (list, tuple)):
            return _fail(errors, path, _type_name(tp), value)
        if not args:
            elem_types = [Any] * len(value)
        elif len(args) == 2 and args[1] is Ellipsis:
            elem_types = [args[0]] * len(value)
        else:
            fixed = [] if args == ((),) else list(args)
            if len(fixed) != len(value):
                return _fail(
                    errors, path, f"{_type_name(tp)} ({len(fixed)} items)", value
                )
            elem_types = fixed
        items = _convert_items(elem_types, value, path, errors)
        return items if items is _INVALID else tuple(items)

    if origin in _DICT_ORIGINS or tp is dict:
        if not isinstance(value, Mapping):
            return _fail(errors, path, f"a mapping ({_type_name(tp)})", value)
        ktp, vtp = args if args else (Any, Any)
        out: dict[Any, Any] = {}
        ok = True
        for k, v in value.items():
            kpath = _join(path, k)
            key_errors: list[str] = []
            ck = _convert(ktp, k, kpath, key_errors)
            if ck is _INVALID:
                errors.append(
                    f"{_where(path)}: expected keys of type {_type_name(ktp)}, {_got(k)}"
                )
                ok = False
                continue
            cv = _convert(vtp, v, kpath, errors)
            if cv is _INVALID:
                ok = False
                continue
            out[ck] = cv
        return out if ok else _INVALID

    if tp is bool:
        return value if isinstance(value, bool) else _fail(errors, path, "bool", value)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return _fail(errors, path, "int", value)
    if tp is float:
        if isinstance(value, float):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:
                pass
        return _fail(errors, path, "float", value)
    if tp is str:
        return value if isinstance(value, str) else _fail(errors, path, "str", value)

    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        return _fail(errors, path, tp.__name__, value)

    # Typing constructs without a runtime check (TypeVar, NewType, ...).
    return value


def from_dict(cls: type[T], data: Mapping[str, Any], *, path: str = "") -> T:
    """Validate ``data`` against dataclass ``cls`` and build the instance.

    Keys missing from ``data`` take the dataclass defaults.  All problems in
    the whole tree (unknown keys, wrong types, ``__post_init__`` failures) are
    collected and raised together as one :class:`ConfigError`.  ``path``
    prefixes every key in messages.
    """
    _require_dataclass_type(cls, "from_dict")
    errors: list[str] = []
    result = _build_dataclass(cls, data, path, errors)
    if errors:
        raise ConfigError(errors)
    assert result is not _INVALID
    return result


# ---------------------------------------------------------------------------
# to_dict
# ---------------------------------------------------------------------------


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            f.name: _plain(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if f.init
        }
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

    Tuples become lists; fields declared with ``init=False`` are left out so
    that ``from_dict(type(obj), to_dict(obj)) == obj``.
    """
    if not (
        (dataclasses.is_dataclass(obj) and not isinstance(obj, type))
        or isinstance(obj, Mapping)
    ):
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


def _strip_optional(tp: Any) -> Any:
    if _is_union(tp):
        others = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(others) == 1:
            return others[0]
    return tp


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


def _describe(cls: type, prefix: str, lines: list[str], stack: tuple[type, ...]) -> None:
    hints = _hints(cls)
    docs = field_docs(cls)
    for name, f in _init_fields(cls).items():
        tp = hints[name]
        key = prefix + name
        nested = _nested(tp)
        header = f"{key}: {_type_name(tp)}"
        direct = nested is not None and nested[1] == "" and _is_dataclass_type(tp)
        if not _has_default(f):
            header += "  (required)"
        elif not direct:
            header += f" = {_format_value(_default_of(f))}"
        lines.append(header)
        doc = docs.get(name)
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
