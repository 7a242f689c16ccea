"""The stage registry: what runs between rollout and update, by kind and name.

A stage is a class registered with :func:`register_stage`; its ``kind`` says where it runs:

* ``credit``: sets per-agent (or per-step) rewards on the episodes; exactly one runs (``algo.credit``);
* ``rewards``: turns each step's credited reward into its final one; every active one, by ``order``;
* ``advantages``: the advantage of every step from the rewards; exactly one;
* ``advantage_terms``: per-token terms added to the advantages (on-policy distillation); every active one;
* ``selection``: which steps the update trains on (it may roll out more); at most one.

Each stage says when it is active (:meth:`Stage.active`, read off ``cfg.algo``), the options it reads
(its own ``Options`` dataclass, :meth:`Stage.options`), what it refuses (:meth:`Stage.errors`, called by
the config's rules with the workflow's :class:`~teamrl.team.registry.Capabilities`) and, when it keeps
state across steps, :meth:`Stage.state_dict`. A new method is one registered class; nothing else
branches on its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from teamrl.team.registry import Capabilities, WorkflowSpec

__all__ = ["KINDS", "STAGES", "Context", "Stage", "active_stages", "register_stage", "stage_errors"]

KINDS = ("credit", "rewards", "advantages", "advantage_terms", "selection")


@dataclass(frozen=True)
class Context:
    """What stages are built from besides ``cfg.algo``."""

    rollout: Any = None
    """The run's :class:`~teamrl.train.rollout.Rollout` (the team, its workflow and task): credit that runs the
    workflow again uses it; None for scoring recorded episodes alone."""
    max_tokens: dict[str, int] | None = None
    """Each agent's ``max_new_tokens`` (the overlong penalty's limits)."""
    game: str = ""
    """The task's name: the running baselines of RAE are kept per (game, role)."""
    seed: int = 0
    """``train.seed``."""
    modules: dict[str, Any] | None = None
    """The run's in-process models by name (a distillation teacher's log-probs); None: none loaded."""
    logits_chunk: int = 0
    """``loss.logits_chunk_tokens``: response tokens per LM-head chunk of a teacher's forward."""
    row_tokens: int = 4096
    """``loss.micro_batch_tokens``: prompt and reply tokens of one teacher forward at most."""
    pack: tuple[bool, bool, bool] = (False, False, False)
    """A teacher forward's ``loss.pack_rows``, ``loss.share_prefixes`` and bf16 autocast (the learners')."""


class Stage:
    """One stage between rollout and update (subclass it and register it with :func:`register_stage`)."""

    kind: ClassVar[str] = ""
    name: ClassVar[str] = ""
    order: ClassVar[int] = 0
    """Where an active ``rewards`` stage runs among the others (smaller first)."""

    @classmethod
    def active(cls, algo: Any) -> bool:
        """Whether ``algo`` (``cfg.algo``) turns this stage on."""
        raise NotImplementedError

    @classmethod
    def errors(cls, algo: Any, caps: Capabilities, spec: WorkflowSpec | None) -> list[str]:
        """One-line problems of ``algo`` for this stage on a workflow with capabilities ``caps`` (``spec``: its
        registry entry, None when the workflow is not registered); checked whether or not the stage is active, so
        its options set without it are refused too."""
        return []

    @classmethod
    def config_errors(cls, cfg: Any) -> list[str]:
        """One-line problems of the whole config ``cfg`` for this stage (the models and agents it names); called by
        the config's rules after :meth:`errors`."""
        return []

    def state_dict(self) -> dict[str, Any]:
        """What the stage carries across training steps (saved in every checkpoint)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


STAGES: dict[str, dict[str, type[Stage]]] = {kind: {} for kind in KINDS}


def register_stage(cls: type[Stage]) -> type[Stage]:
    """Register stage class ``cls`` under its ``kind`` and ``name`` (a class decorator)."""
    if cls.kind not in KINDS:
        raise ValueError(f"stage {cls.__name__}: kind {cls.kind!r} must be one of {', '.join(KINDS)}")
    if not cls.name or cls.name in STAGES[cls.kind]:
        raise ValueError(f"stage {cls.__name__}: name {cls.name!r} is empty or already registered as a {cls.kind} stage")
    STAGES[cls.kind][cls.name] = cls
    return cls


def active_stages(kind: str, algo: Any) -> list[type[Stage]]:
    """The registered ``kind`` stages ``algo`` turns on, in their order; exactly one for credit and advantages, at
    most one for selection (else a ValueError naming them)."""
    found = sorted((c for c in STAGES[kind].values() if c.active(algo)), key=lambda c: (c.order, c.name))
    if kind in ("credit", "advantages") and len(found) != 1 or kind == "selection" and len(found) > 1:
        names = ", ".join(c.name for c in found) or "none"
        raise ValueError(f"the config turns on {names} as {kind} stage(s); it takes "
                         f"{'exactly one' if kind != 'selection' else 'at most one'}")
    return found


def stage_errors(algo: Any, caps: Capabilities, spec: WorkflowSpec | None, cfg: Any = None) -> list[str]:
    """Every registered stage's :meth:`Stage.errors` for ``algo`` on a workflow with capabilities ``caps``, then its
    :meth:`Stage.config_errors` of the whole config ``cfg`` when one is given."""
    stages = [cls for kind in KINDS for cls in STAGES[kind].values()]
    return [e for cls in stages for e in cls.errors(algo, caps, spec)] + \
        ([e for cls in stages for e in cls.config_errors(cfg)] if cfg is not None else [])
