"""YAML files, ``a.b=value`` overrides, deep merging, and loading a validated config.

Reading YAML is bounded: nesting deeper than :data:`MAX_DEPTH` levels, or a document that expands (each
alias counted as a copy of what it names) to more than :data:`MAX_NODES` values, is refused with the
limit in the error, so an alias bomb fails at once instead of running for hours.
"""

from __future__ import annotations

import contextvars
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import yaml

from teamrl.config.tools.errors import ConfigError
from teamrl.config.tools.introspect import _got, _require_dataclass_type
from teamrl.config.tools.validate import from_dict

T = TypeVar("T")

MAX_DEPTH = 64
"""Deepest nesting of mappings and lists in a YAML config (teamrl's own configs use 5 levels)."""
MAX_NODES = 100_000
"""Most values a YAML config may hold once its aliases are expanded (teamrl's own configs hold a few hundred)."""


class YAMLLimitError(yaml.YAMLError):
    """A YAML document over :data:`MAX_DEPTH` or :data:`MAX_NODES`."""


def _measure(root: yaml.Node) -> int:
    """Values in the tree ``root`` expands to, each alias counted as a full copy; shared nodes are counted
    once and remembered, so this takes time in the size of the document, not of its expansion.

    Raises:
        YAMLLimitError: an alias inside the node it names (a document that never ends).
    """
    size: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        kids = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else \
            node.value if isinstance(node, yaml.SequenceNode) else []
        if done:
            size[id(node)] = 1 + sum(size[id(k)] for k in kids)
            open_.discard(id(node))
        elif id(node) not in size:
            if id(node) in open_:
                raise YAMLLimitError(f"an alias refers to a node that contains it (line {node.start_mark.line + 1}), "
                                     f"which would expand forever")
            open_.add(id(node))
            stack.append((node, True))
            stack.extend((k, False) for k in kids if id(k) not in size)
    return size[id(root)]


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

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        depth = getattr(self, "_depth", 0)
        if depth >= MAX_DEPTH:
            raise YAMLLimitError(f"nesting deeper than {MAX_DEPTH} levels (line {self.peek_event().start_mark.line + 1}; "
                                 f"the limit is MAX_DEPTH={MAX_DEPTH})")
        self._depth = depth + 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth = depth

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None and (count := _measure(node)) > MAX_NODES:
            raise YAMLLimitError(f"the document expands to {count:,} values once its aliases (*name) are expanded; "
                                 f"the limit is MAX_NODES={MAX_NODES:,}")
        return node


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
    None, ``'3'`` -> str).  An empty value is the empty string: a shell turns
    ``key=''`` into ``key=``, and the user meant ``''`` (write ``key=null``
    for None).  Later items win; all malformed items are reported together as
    one :class:`ConfigError`.

    >>> parse_overrides(["a.b=3", "a.c=", "d=null"])
    {'a': {'b': 3, 'c': ''}, 'd': None}
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
            value = yaml.load(raw, Loader=_Loader) if raw else ""
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
    except YAMLLimitError as exc:
        raise ConfigError(f"{name}: refused: {exc}") from None
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
    given = parse_overrides(overrides) if overrides else {}
    token = _SOURCES.set((data, given))
    try:
        return from_dict(cls, merge(data, given) if given else data)
    finally:
        _SOURCES.reset(token)


_SOURCES: contextvars.ContextVar[tuple[Mapping, Mapping] | None] = contextvars.ContextVar("teamrl_config_sources",
                                                                                         default=None)


def sources() -> tuple[Mapping, Mapping] | None:
    """Inside :func:`load`, the data of the file and that of the overrides, apart (a rule that tells an entry the
    file wrote from one an override created reads them); None outside it."""
    return _SOURCES.get()


# ---------------------------------------------------------------------------
