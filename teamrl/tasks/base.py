"""Task interface and registry: what a task is and how one is looked up by name.

A task supplies problems for the "train" and "test" splits, pulls a final answer
out of a model reply, and scores a final reply with a 0/1 reward. This module
defines the :class:`Problem` record, the :class:`Task` protocol, the ``TASKS``
registry with :func:`register_task` / :func:`build_task` (each task names the config
class of its ``task.<name>`` section), and small helpers
shared by tasks: :func:`config_from` (``None`` or a plain mapping to a task's
config dataclass), :func:`check_split`, :func:`last_number` (the last number
in a reply) and :func:`safe_score` (a task's score that cannot end a run: an
exception scores 0.0 with one warning, counted by :func:`grading_errors`).

Left out: prompt construction, multi-agent turn logic and reward shaping live
with the team and training code; concrete tasks live in sibling modules
(``arith``, ``math``).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import importlib
import logging
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from teamrl.plugins import load_plugins
from teamrl.suggest import closest, did_you_mean

__all__ = [
    "SPLITS",
    "TASKS",
    "Problem",
    "Task",
    "TaskSpec",
    "build_task",
    "check_split",
    "config_from",
    "count_grading_error",
    "grading_errors",
    "last_number",
    "MAX_REPLY_CHARS",
    "load_builtin_tasks",
    "safe_score",
    "register_task",
    "task_configs",
]

logger = logging.getLogger(__name__)

SPLITS: tuple[str, ...] = ("train", "test")
"""The split names every task accepts."""

# A number: a leading minus counts as a sign unless it follows a digit or a closing
# bracket (with at most one space between), so "10 - 4" reads as 10 and 4 while
# "is -7" reads as -7; "1,234,567" is one number; decimals are kept.
_NUMBER_RE = re.compile(
    r"(?:(?<![\d)\]])(?<![\d)\]] )(?P<sign>[-\u2212]))?"
    r"(?<![\d.])(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)"
    r"(?P<frac>\.\d+)?"
)


@dataclass(frozen=True)
class Problem:
    """One problem shown to the team.

    >>> Problem(id="arith-3", question="What is 1 + 2?", answer="3").answer
    '3'
    """

    id: str
    """Stable id, unique within a split."""
    question: str
    """Text shown to the agents."""
    answer: str
    """Gold answer as text."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Task-specific extras (source row, difficulty, operands, ...)."""


@runtime_checkable
class Task(Protocol):
    """What the trainer needs from a task.

    Optional: ``all_scores(problem, response) -> dict[str, float]`` (several answer metrics, e.g.
    the search task's em / f1 / substring_em); evaluation then reports each one's mean.
    ``passed(problem, response) -> bool`` (what pass@k counts when ``score`` gives partial credit).
    ``score_in_thread = True`` (the rollout scores in a worker thread: code tasks run programs).
    """

    name: str
    """Registry name of the task, e.g. "arith"."""
    answer_format: str
    """One sentence telling the model how to give its final answer; shown in prompts."""

    def problems(self, split: str) -> list[Problem]:
        """Problems of ``split`` ("train" or "test"); ValueError for any other split."""
        ...

    def extract_answer(self, response: str) -> str | None:
        """The final answer found in ``response``, or None when there is none."""
        ...

    def score(self, problem: Problem, response: str) -> float:
        """Reward of a final response: 1.0 if correct, else 0.0."""
        ...


@dataclass(frozen=True)
class TaskSpec:
    """A registered task: how it is built and what its options are."""

    factory: Callable[..., Task]
    """Builds the task from its config (an instance of ``config``, or a mapping when ``config`` is None)."""
    config: type | None = None
    """The dataclass of its ``task.<name>`` section; None: the section is a plain mapping."""
    smoke: Callable[[Any], list[str]] | None = None
    """``smoke(cfg)``: the overrides ``teamrl train --smoke`` adds for this task (data the package makes itself, a
    few problems, short episodes), from the whole config; None: none (:mod:`teamrl.smoke`)."""
    benchmarks: bool = False
    """It reads the test files of ``--benchmarks NAME=PATH`` (``teamrl eval``, ``teamrl ablate``): built with
    ``{"test_path": PATH}`` (:func:`benchmark_task`)."""


TASKS: dict[str, TaskSpec] = {}
"""Registered tasks by name."""

_F = TypeVar("_F", bound=Callable[..., Any])
_C = TypeVar("_C")


def register_task(name: str, *, config: type | None = None,
                  smoke: Callable[[Any], list[str]] | None = None, benchmarks: bool = False) -> Callable[[_F], _F]:
    """Decorator that registers a task factory (usually the task class) under ``name``.

    Args:
        name: Registry name, e.g. "arith". Must not be registered already.
        config: The dataclass of the task's options (``task.<name>`` in a config file is
            validated against it); None: the options are a plain mapping.
        smoke: The task's ``--smoke`` overrides (:attr:`TaskSpec.smoke`).
        benchmarks: It reads ``--benchmarks`` files (:attr:`TaskSpec.benchmarks`; one task does).

    Returns:
        A decorator that stores the factory in ``TASKS`` and returns it unchanged.

    >>> @register_task("doc-example")
    ... class DocTask:
    ...     def __init__(self, cfg=None):
    ...         self.cfg = cfg
    >>> "doc-example" in TASKS
    True
    >>> del TASKS["doc-example"]
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"task name must be a non-empty string, got {name!r}")

    def decorator(factory: _F) -> _F:
        if name in TASKS:
            raise ValueError(
                f"task {name!r} is already registered (by {TASKS[name].factory!r}); pick a different name for {factory!r}"
            )
        TASKS[name] = TaskSpec(factory, config, smoke, benchmarks)
        return factory

    return decorator


def load_builtin_tasks() -> None:
    """Import the modules that register the tasks of every plug-in, teamrl's domains included
    (:func:`teamrl.plugins.load_plugins`); idempotent."""
    load_plugins("tasks")


def task_configs() -> dict[str, type | None]:
    """The config class of every registered task (built-in ones included), by name."""
    load_builtin_tasks()
    return {name: spec.config for name, spec in TASKS.items()}


def build_task(name: str, cfg: Any = None) -> Task:
    """Build the task registered as ``name`` from its config.

    Args:
        name: Registry name, e.g. "arith" or "math".
        cfg: The task's config dataclass, a mapping of its fields, or None for defaults.

    Returns:
        The task instance.

    >>> build_task("arith").name
    'arith'
    """
    load_builtin_tasks()
    if name not in TASKS:
        known = sorted(TASKS)
        raise ValueError(f"unknown task {name!r}{did_you_mean(name, known)} "
                         f"(registered tasks: {', '.join(known) or 'none'})")
    return TASKS[name].factory(cfg)


def benchmark_task(path: str) -> Task:
    """The task that reads the test file ``path`` of ``--benchmarks NAME=PATH``: the registered task that declares
    ``benchmarks=True`` (the math domain's, for GSM8K/MATH-style files), built with ``{"test_path": path}``."""
    load_builtin_tasks()
    readers = sorted(name for name, spec in TASKS.items() if spec.benchmarks)
    if len(readers) != 1:
        raise ValueError(f"--benchmarks needs exactly one task registered with benchmarks=True, found "
                         f"{', '.join(readers) or 'none'}")
    return build_task(readers[0], {"test_path": path})


def config_from(cls: type[_C], cfg: Any) -> _C:
    """Turn ``cfg`` into an instance of the config dataclass ``cls``.

    Args:
        cls: A dataclass type, e.g. ``ArithConfig``.
        cfg: None (all defaults), an instance of ``cls``, or a mapping of field names to values.

    Returns:
        An instance of ``cls``.

    >>> from dataclasses import dataclass
    >>> @dataclass(kw_only=True)
    ... class Cfg:
    ...     size: int = 3
    >>> config_from(Cfg, {"size": 5}).size
    5
    """
    if cfg is None:
        return cls()
    if isinstance(cfg, cls):
        return cfg
    if isinstance(cfg, Mapping):
        names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        unknown = [k for k in cfg if k not in names]
        if unknown:
            hints = []
            for key in unknown:
                close = closest(key, names)
                hints.append(f"{key!r}" + (f" (did you mean {close!r}?)" if close else ""))
            raise ValueError(f"unknown {cls.__name__} field(s): {', '.join(hints)}; valid fields: {', '.join(names)}")
        return cls(**dict(cfg))
    raise ValueError(f"expected a {cls.__name__}, a mapping of its fields, or None; got {type(cfg).__name__}: {cfg!r}")


def last_number(text: str) -> str | None:
    """The last number in ``text``, normalised (thousands commas dropped, ASCII minus).

    Args:
        text: Any text, typically a model reply.

    Returns:
        The number as text, e.g. "1234" for "The answer is 1,234.", or None if there is none.

    >>> last_number("3 + 4 = 7")
    '7'
    >>> last_number("so x = -2.5 here")
    '-2.5'
    >>> last_number("no number") is None
    True
    """
    match = None
    for found in _NUMBER_RE.finditer(text):  # keeps only the last: memory stays flat on a huge reply
        match = found
    if match is None:
        return None
    sign = "-" if match.group("sign") else ""
    return sign + match.group("int").replace(",", "") + (match.group("frac") or "")


def check_split(split: str) -> str:
    """Return ``split`` if it is a known split name, else raise ValueError.

    Args:
        split: The requested split.

    Returns:
        The same split name.

    >>> check_split("test")
    'test'
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    return split


_GRADING_ERRORS = [0]
_GRADING_LOCK = threading.Lock()


_GRADING_SCOPE: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("teamrl_grading_scope",
                                                                                 default=None)


def count_grading_error() -> None:
    """Count one grade that could not finish (timed out, crashed, or refused its input) and scored 0.0: in the
    process's total and in the :func:`grading_scope` it runs under, if any."""
    scope = _GRADING_SCOPE.get()
    with _GRADING_LOCK:
        _GRADING_ERRORS[0] += 1
        if scope is not None:
            scope[0] += 1


@contextlib.contextmanager
def grading_scope() -> Iterator[list[int]]:
    """Count the grading errors of what runs inside (its asyncio tasks and ``to_thread`` calls share the
    context) in ``box[0]``; a grade finishing late in another thread is not counted here.

    >>> with grading_scope() as box:
    ...     count_grading_error()
    >>> box
    [1]
    """
    box = [0]
    token = _GRADING_SCOPE.set(box)
    try:
        yield box
    finally:
        _GRADING_SCOPE.reset(token)


def grading_errors() -> int:
    """How many grades in this process scored 0.0 because they could not finish; the trainer logs the
    difference over a step as ``rollout/grading_errors``."""
    with _GRADING_LOCK:
        return _GRADING_ERRORS[0]


MAX_REPLY_CHARS = 1_000_000
"""Longest reply :func:`safe_score` hands to a task (about 250,000 tokens, past any reply a model writes
within ``max_new_tokens``; an agent program's posted answer can be anything)."""


def safe_score(task: Task, problem: Problem, response: str) -> float:
    """``task.score(problem, response)``, or 0.0 with one warning (counted by :func:`grading_errors`)
    when the task raises or ``response`` is over :data:`MAX_REPLY_CHARS` characters (it is then not
    read at all): a reply or a data row a grader chokes on never ends a run.

    Args:
        task: The task that scores.
        problem: The problem answered.
        response: The reply scored.

    Returns:
        The task's score (unchecked: non-finite values are the trainer's to refuse), or 0.0.
    """
    name = getattr(task, "name", type(task).__name__)
    if len(response) > MAX_REPLY_CHARS:
        count_grading_error()
        logger.warning("%s task: the reply to problem %r has %d characters, over %d; scored 0.0 without reading it",
                       name, problem.id, len(response), MAX_REPLY_CHARS)
        return 0.0
    try:
        return float(task.score(problem, response))
    except Exception as exc:  # noqa: BLE001 (a grader's failure scores 0.0; it must not end the run)
        count_grading_error()
        text = f"{type(exc).__name__}: {exc}"
        logger.warning("%s task could not score problem %r (%s); scored 0.0", name, problem.id, text[:200])
        return 0.0


def require(module: str, extra: str) -> Any:
    """Import ``module``, or raise a one-line error naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ValueError(f"{module} is not installed; pip install 'teamrl[{extra}]'") from None
