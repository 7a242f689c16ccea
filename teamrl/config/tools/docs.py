"""Field documentation from attribute docstrings, and the listing of every key (``--help-config``)."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import typing
from typing import Any

import yaml

from teamrl.config.tools.introspect import (
    _DICT_ORIGINS,
    _LIST_ORIGINS,
    _default_of,
    _hints,
    _init_fields,
    _is_dataclass_type,
    _is_sections,
    _require_dataclass_type,
    _section_type,
    _strip_optional,
    _type_name,
)
from teamrl.config.tools.plain import _plain


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


def _describe(cls: type, prefix: str, lines: list[str], stack: tuple[type, ...],
              registered: dict[str, list[str]]) -> None:
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
        if key in registered:
            lines.append(f"    Registered ({len(registered[key])}): {', '.join(registered[key])}.")
        if nested is not None and nested[0] not in stack:
            sub, suffix = nested
            _describe(sub, f"{key}{suffix}.", lines, stack + (sub,), registered)


def describe(cls: type, *, prefix: str = "", registered: dict[str, typing.Iterable[str]] | None = None) -> str:
    """Listing of every field of ``cls``, recursively: dotted key, type,
    default and documentation.

    Fields inside ``dict[str, <dataclass>]`` entries are shown as
    ``key.<name>.field``, inside lists of dataclasses as ``key[<i>].field``. ``registered`` maps a dotted
    key whose value names a registry entry to the registered names, listed under that key's documentation
    (so the help text is the registry's, never a hand-kept list).
    """
    _require_dataclass_type(cls, "describe")
    lines: list[str] = []
    _describe(cls, prefix, lines, (cls,), {k: sorted(v) for k, v in (registered or {}).items()})
    return "\n".join(lines)
