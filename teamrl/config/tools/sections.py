"""Sections: config keys named after registered plug-ins (``task.<name>``), each validated against
the config class its plug-in registered."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, ClassVar

import pydantic
from pydantic_core import core_schema

from teamrl.config.tools.introspect import _hints, _init_fields, _section_type, remember_sections
from teamrl.config.tools.plain import _plain
from teamrl.config.tools.validate import from_dict


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

    _plugin_sections: ClassVar[bool] = True  # what introspect._is_sections looks for

    name: str
    """The selected plug-in."""
    sections: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Every registered plug-in's options, by name (in YAML: keys beside ``name``)."""

    kind: ClassVar[str] = "plug-in"
    alias: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        remember_sections(cls)  # the validators' cache key reads every registry (validate._sections_key)

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
