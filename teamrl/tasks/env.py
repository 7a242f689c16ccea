"""The environment contract: per-episode state that agents act in turn by turn, and its task adapter.

A :class:`Task` is a list of problems scored once at the end. An :class:`Environment` is what a
multi-turn team acts in: ``reset(problem) -> observation``, then ``step(action) -> Turn``
(observation, reward, done, info) until ``done`` or ``max_turns`` turns. Each environment also
owns its action parser (``parse_action``: a model reply to an action, or None when the reply has
none) and says in one sentence how an action is written (``action_format``).

An environment instance belongs to one episode: the workflow builds it with
:meth:`EnvTask.make_env` at the start of the episode and drops it at the end, so nothing leaks
between episodes. Instances must survive ``copy.deepcopy`` (tree-structured sampling steps copies
of one state, :mod:`teamrl.domains.environments.env_team`).

:func:`register_env` registers an environment class and, under the same name, a task
(:class:`EnvTask`) that draws its problems from seeds: ``task.name: plan_path`` with its options in
``task.plan_path`` (validated against the environment's config class, a subclass of
:class:`EnvConfig`). The task scores a final answer by replaying it: the episode's final text is
the list of actions it took (:func:`actions_text`); ``score`` resets a fresh environment on the
problem, steps the actions and returns 1.0 when the environment reports success.

Left out: concrete environments (``planning``, ``catalogues``) and the workflows that drive them
(:mod:`teamrl.domains.environments.env_team`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from teamrl.suggest import did_you_mean
from teamrl.tasks.base import Problem, check_split, config_from, register_task

__all__ = ["ENVS", "EnvConfig", "EnvSpec", "EnvTask", "Environment", "Turn", "actions_text", "parse_actions_text",
           "register_env"]

_ACTIONS_PREFIX = "actions: "


@dataclass(frozen=True)
class Turn:
    """What one ``step`` returns.

    >>> Turn("You are at (0, 1).", -0.01, False).done
    False
    """

    observation: str
    """What the agents see next."""
    reward: float
    """Reward of this turn's action (credited to the Step that chose it)."""
    done: bool
    """Whether the episode is over (solved, or failed for good)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Extras: ``message`` (feedback on the action, shown to the agents), ``invalid`` (the action was
    rejected), anything else the environment reports."""


@runtime_checkable
class Environment(Protocol):
    """What a multi-turn workflow needs from an environment (one instance per episode)."""

    max_turns: int
    """Most turns of one episode; the workflow stops after this many even when not ``done``."""
    action_format: str
    """One sentence telling the model how to write an action; shown in prompts."""

    def reset(self, problem: Problem) -> str:
        """Start the episode on ``problem`` (its ``meta['seed']`` draws the instance); returns the first observation."""
        ...

    def parse_action(self, text: str) -> Any | None:
        """The action found in a model reply, or None when there is none (the step is then invalid)."""
        ...

    def step(self, action: Any | None) -> Turn:
        """Apply ``action`` (None: the reply had no action; the environment penalises it) and return the turn."""
        ...

    @property
    def success(self) -> bool:
        """Whether the episode reached its goal so far."""
        ...


# Optional members: ``instance() -> str`` tells two instances apart when the first observation does not
# (a hidden target); ``distinct_instances = False`` lets the splits share instances (an environment whose
# start does not depend on the seed); ``problem_seeds(split) -> Iterable[int]`` gives the seeds of a split's
# problems in order instead of drawing them (an original's own seed layout, PettingLLMs' Sokoban).


@dataclass(kw_only=True)
class EnvConfig:
    """Options every environment task has (its own config class adds the difficulty knobs)."""

    n_train: int = 1000
    """Training problems (one seed each)."""
    n_test: int = 100
    """Held-out problems; drawn from other seeds, and an instance equal to a training one is skipped."""
    seed: int = 0
    """Seed of the problem draws."""
    max_turns: int = 5
    """Most turns per episode."""

    def __post_init__(self) -> None:
        for key in ("n_train", "n_test", "max_turns"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} {getattr(self, key)} must be >= 1")


@dataclass(frozen=True)
class EnvSpec:
    """A registered environment: its class (built from its config) and the config class."""

    factory: Callable[[Any], Environment]
    config: type


ENVS: dict[str, EnvSpec] = {}
"""Registered environments by name (each is also a task of the same name)."""

_E = TypeVar("_E")


def few_turns_smoke(name: str) -> Callable[[Any], list[str]]:
    """The ``--smoke`` overrides of environment ``name``: one turn, four train and two test problems."""
    return lambda cfg: [f"task.{name}.max_turns=1", f"task.{name}.n_train=4", f"task.{name}.n_test=2"]


def register_env(name: str, *, config: type, smoke: Callable[[Any], list[str]] | None = None) -> Callable[[_E], _E]:
    """Register an environment class under ``name``, and a task of the same name that serves its problems.

    Args:
        name: Registry name, e.g. "plan_path" (also the task's name).
        config: Its config dataclass, a subclass of :class:`EnvConfig`.

    Returns:
        A decorator that stores the class in ``ENVS`` and returns it unchanged.
    """
    if not (isinstance(config, type) and issubclass(config, EnvConfig)):
        raise TypeError(f"the config of environment {name!r} must subclass EnvConfig, got {config!r}")

    def decorator(factory: _E) -> _E:
        if name in ENVS:
            raise ValueError(f"environment {name!r} is already registered; pick a different name")
        ENVS[name] = EnvSpec(factory, config)  # type: ignore[arg-type]
        register_task(name, config=config, smoke=smoke)(lambda cfg: EnvTask(name, cfg))
        return factory

    return decorator


def get_env(name: str) -> EnvSpec:
    """Look up an environment; unknown names list the registered ones."""
    if name not in ENVS:
        raise ValueError(f"unknown environment {name!r}{did_you_mean(name, ENVS)} (registered: {', '.join(sorted(ENVS))})")
    return ENVS[name]


def actions_text(actions: list[Any]) -> str:
    """The final text of an environment episode: the actions it took, as JSON.

    >>> actions_text([["R", "D"], None])
    'actions: [["R", "D"], null]'
    """
    return _ACTIONS_PREFIX + json.dumps(actions)


def parse_actions_text(text: str) -> list[Any] | None:
    """The actions of :func:`actions_text`, or None when ``text`` is not such a list.

    >>> parse_actions_text('actions: [["R"], null]')
    [['R'], None]
    >>> parse_actions_text("R R D") is None
    True
    """
    if not text.startswith(_ACTIONS_PREFIX):
        return None
    try:
        out = json.loads(text[len(_ACTIONS_PREFIX):])
    except json.JSONDecodeError:
        return None
    return out if isinstance(out, list) else None


class EnvTask:
    """The task of an environment: seeded problems, and scoring by replaying an episode's actions.

    Problem ``i`` of a split carries ``meta['seed']``; the question is the first observation and
    the answer is empty (success is judged by the environment, not against a gold text).
    """

    def __init__(self, name: str, cfg: Any = None) -> None:
        self.name = name
        self.spec = get_env(name)
        self.cfg: Any = config_from(self.spec.config, cfg)
        self.answer_format = self.make_env().action_format
        self._splits: dict[str, list[Problem]] = {}

    def make_env(self) -> Environment:
        """A fresh environment for one episode."""
        return self.spec.factory(self.cfg)

    def problems(self, split: str) -> list[Problem]:
        """``n_train`` or ``n_test`` problems; test instances never repeat a training one (unless the
        environment sets ``distinct_instances = False``). Seeds are drawn from ``seed``, or taken in order from the
        environment's ``problem_seeds(split)`` when it has one."""
        check_split(split)
        if not self._splits:
            rng = random.Random(f"{self.name}:{self.cfg.seed}")
            seen: set[str] = set()
            for part, n in (("train", self.cfg.n_train), ("test", self.cfg.n_test)):
                out: list[Problem] = []
                own = getattr(self.make_env(), "problem_seeds", None)
                seeds = iter(own(part)) if callable(own) else None
                for _ in range(50 * n):
                    if len(out) == n:
                        break
                    seed = rng.randrange(2**31) if seeds is None else next(seeds, None)
                    if seed is None:
                        break
                    probe = Problem(id="", question="", answer="", meta={"seed": seed})
                    env = self.make_env()
                    first = env.reset(probe)
                    key = env.instance() if hasattr(env, "instance") else first
                    if key in seen and getattr(env, "distinct_instances", True):
                        continue
                    seen.add(key)
                    out.append(Problem(id=f"{self.name}-{part}-{len(out)}", question=first, answer="",
                                       meta={"seed": seed}))
                if len(out) < n:
                    raise ValueError(f"{self.name}: only {len(out)} distinct {part} instances found for n_{part}={n}; "
                                     f"lower n_{part} or make the instances larger")
                self._splits[part] = out
        return self._splits[split]

    def extract_answer(self, response: str) -> str | None:
        """The actions of a final episode text (as JSON), or None."""
        actions = parse_actions_text(response)
        return None if actions is None else json.dumps(actions)

    def score(self, problem: Problem, response: str) -> float:
        """1.0 when replaying the episode's actions on a fresh environment reaches the goal, else 0.0."""
        actions = parse_actions_text(response)
        if actions is None:
            return 0.0
        env = self.make_env()
        env.reset(problem)
        for action in actions[: env.max_turns]:
            if env.step(action).done:
                break
        return float(env.success)
