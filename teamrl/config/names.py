"""Names checked like keys: an entry of a name-keyed section that nothing uses is refused with the nearest name.

A typo in a key (``rollout.bacth_size``) is an unknown key; a typo in a *name* (``agents.solvr.temperature=0.2``,
``models.mian.optim.lr=1e-5``) would otherwise create a new entry that nothing reads, while the setting the user
meant keeps its value. The rule covers every name-keyed section of the config:

- ``agents.<a>``: an agent is called by the workflow (or by ``eval.workflow``);
- ``models.<m>``: a model is the model of some agent;
- ``task.<t>`` and ``workflow.<w>``: options are those of the selected plug-in (``task.name``, ``workflow.name``
  or ``eval.workflow``).

It applies to an entry an override creates, always, and to an entry the config file writes unless an override
changes what selects it (``teamrl eval configs/quickstart.yaml workflow.name=single`` leaves the file's verifier
unused, and that is the command's point). Entries nobody wrote (the defaults' ``solver`` and ``verifier``) and
entries that set nothing (empty, or whole and equal to their defaults, as a run's resolved ``config.yaml`` writes
every plug-in's options) are not checked. A workflow that declares no agents of its own (``agent_program``
without ``agents``) leaves the agents unchecked. Checked by :meth:`teamrl.config.schema.Config.__post_init__`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from teamrl.suggest import did_you_mean
from teamrl.team.registry import WORKFLOWS

__all__ = ["name_errors"]


def _part(data: Mapping[str, Any] | None, *keys: str) -> Mapping[str, Any]:
    for key in keys:
        data = data.get(key) if isinstance(data, Mapping) else None
    return data if isinstance(data, Mapping) else {}


def _unset(entry: Any, value: Any) -> bool:
    """Whether a written entry sets nothing: empty, only unknown keys (reported as such), or every key written with
    its default (a resolved config, as a run's config.yaml, writes every entry whole)."""
    if entry is None or entry == {}:
        return True
    if not (dataclasses.is_dataclass(value) and isinstance(entry, Mapping)):
        return False
    fields = {f.name for f in dataclasses.fields(value) if f.init}
    if not fields & set(entry):
        return True
    return fields <= set(entry) and _default(type(value)) == value


def _default(cls: type) -> Any:
    try:
        return cls()
    except (TypeError, ValueError):  # a class that cannot be built without settings
        return None


def _fix(name: str, used: list[str], what: str) -> str:
    """``"; did you mean 'x'? (what)"``, or ``"; what"`` when no used name is close."""
    hint = did_you_mean(name, used)
    return f"{hint} ({what})" if hint else f"; {what}"


def _called(cfg: Any) -> tuple[list[str], list[str]] | None:
    """(agents the workflows call, the workflows' names), or None when a workflow does not say which it calls."""
    called: list[str] = []
    names = []
    for name in dict.fromkeys(n for n in (cfg.workflow.name, cfg.eval.workflow) if n is not None):
        if name not in WORKFLOWS or name not in cfg.workflow.sections:
            return None  # an unknown workflow is reported as such
        agents = WORKFLOWS[name].agents_for(cfg.workflow.sections[name])
        if not agents:
            return None
        called += [a for a in agents if a not in called]
        names.append(name)
    return called, names


class _Written:
    """Which entries to check: those an override created, and the file's while no override changes their
    selection."""

    def __init__(self, written: Mapping[str, Any], sources: tuple[Mapping, Mapping] | None) -> None:
        self.written = written
        self.file: Mapping[str, Any] = sources[0] if sources is not None else written
        self.overrides: Mapping[str, Any] = sources[1] if sources is not None else {}

    def names(self, section: str, *, reselected: bool) -> list[str]:
        from_file = [] if reselected else list(_part(self.file, section))
        created = [k for k in _part(self.overrides, section) if k not in _part(self.file, section)]
        return [k for k in dict.fromkeys([*from_file, *created]) if isinstance(k, str)]

    def entry(self, section: str, name: str) -> Any:
        return _part(self.written, section).get(name)


def name_errors(cfg: Any, written: Mapping[str, Any] | None,
                sources: tuple[Mapping, Mapping] | None = None) -> list[str]:
    """Entries of name-keyed sections that the config writes and nothing uses.

    Args:
        cfg: the whole config (:class:`teamrl.config.schema.Config`).
        written: the data the config was validated from (:func:`teamrl.config.tools.written`); None: nothing
            to check (a config built in code).
        sources: the file's data and the overrides' apart (:func:`teamrl.config.tools.sources`); None: all of
            ``written`` counts as the file's.

    Returns:
        One message per unused entry, with the nearest used name and how to fix it.
    """
    if written is None:
        return []
    w = _Written(written, sources)
    ov = w.overrides
    errors = []
    called = _called(cfg)
    if called is not None:
        agents, workflows = called
        moved = "workflow" in ov or "workflow" in _part(ov, "eval")
        for name in w.names("agents", reselected=moved):
            if name not in agents and name in cfg.agents and not _unset(w.entry("agents", name), cfg.agents[name]):
                who = f"{' and '.join(workflows)} call{'s' if len(workflows) == 1 else ''} {', '.join(agents)}"
                errors.append(f"agents.{name}: no workflow calls agent {name!r} ({who})"
                              f"{_fix(name, agents, 'rename it or remove it')}")
    mapped = list(dict.fromkeys([a.model for a in cfg.agents.values()] + cfg.algo.distill.models()))
    moved = any(not isinstance(a, Mapping) or "model" in a for a in _part(ov, "agents").values())
    for name in w.names("models", reselected=moved):
        if name not in mapped and name in cfg.models and not _unset(w.entry("models", name), cfg.models[name]):
            fix = _fix(name, mapped, f"rename it, map an agent to it (agents.<a>.model: {name}) or remove it")
            errors.append(f"models.{name}: no agent maps to model {name!r} (agents map to {', '.join(mapped)}){fix}")
    for section, selected in (("task", [cfg.task.name]), ("workflow", [cfg.workflow.name, cfg.eval.workflow])):
        sections = getattr(cfg, section)
        own = {f.name for f in dataclasses.fields(sections)} | {sections.alias}
        moved = "name" in _part(ov, section) or (section == "workflow" and "workflow" in _part(ov, "eval"))
        for name in w.names(section, reselected=moved):
            if name in own or name in selected or name not in sections.sections or \
                    _unset(w.entry(section, name), sections.sections[name]):
                continue  # the section's own key, the selected one's options, an unknown key (reported), or defaults
            errors.append(f"{section}.{name}: options of {section} {name!r}, which is not selected ({section}.name is "
                          f"{sections.name!r}); set {section}.name={name}, or remove them")
    return errors
