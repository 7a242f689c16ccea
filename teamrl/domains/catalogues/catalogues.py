"""Adapters to task and environment catalogues: reasoning-gym (a task), TextArena and Gymnasium (environments).

* ``reasoning_gym``: any reasoning-gym dataset by name with its options (``task.reasoning_gym.dataset:
  mini_sudoku``, ``options: {...}``), generated from a seed into train and test splits (a test
  question equal to a training one is dropped), scored by the dataset's own verifier
  (``score_answer``) on the answer inside ``<answer></answer>``. ``pip install 'teamrl[reasoning-gym]'``.
* ``textarena``: a single-player TextArena game by id (``FrozenLake-v0``, ``GuessTheNumber-v0``,
  ``Minesweeper-v0-small``, ...), in :mod:`teamrl.domains.environments.textarena` (imported here, so it registers).
* ``gymnasium``: a Gymnasium environment with a text rendering (``render_mode="ansi"``: FrozenLake,
  CliffWalking, Taxi); the action is ``#### <name or number>`` of its discrete actions; the reward is
  Gymnasium's; success is termination (for FrozenLake, termination with reward 1: it also ends in a
  hole). ``pip install 'teamrl[gymnasium]'``.

Left out: Gymnasium environments without a text rendering.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from teamrl.domains.environments.textarena import TextArenaConfig, TextArenaEnv
from teamrl.tasks.base import Problem, check_split, config_from, register_task, require
from teamrl.tasks.env import EnvConfig, Turn, register_env

__all__ = ["GymnasiumConfig", "GymnasiumEnv", "ReasoningGymConfig", "ReasoningGymTask", "TextArenaConfig",
           "TextArenaEnv", "require"]

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_RED_CELL = re.compile(r"\x1b\[41m(.)\x1b\[0m")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _one_line(exc: BaseException) -> str:
    """An exception as ``Type: its first non-empty line``.

    >>> _one_line(FileNotFoundError("\\nno such file: words.txt\\nmore"))
    'FileNotFoundError: no such file: words.txt'
    """
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


@dataclass(kw_only=True)
class ReasoningGymConfig:
    dataset: str = "mini_sudoku"
    """reasoning-gym dataset name (reasoning_gym.factory.DATASETS), e.g. mini_sudoku, countdown, maze."""
    options: dict[str, Any] = field(default_factory=dict)
    """Options of the dataset's own config class (e.g. {min_empty: 4} for mini_sudoku)."""
    n_train: int = 1000
    """Training problems."""
    n_test: int = 100
    """Held-out problems (another seed; questions seen in training are dropped, so there may be fewer)."""
    seed: int = 0
    """Seed of the training split; the test split uses seed + 1000000 (reasoning-gym seeds item i with seed + i)."""

    def __post_init__(self) -> None:
        if self.n_train < 1 or self.n_test < 1:
            raise ValueError(f"n_train {self.n_train} and n_test {self.n_test} must be >= 1")


@register_task("reasoning_gym", config=ReasoningGymConfig)
class ReasoningGymTask:
    """A reasoning-gym dataset as a task, scored by its own verifier."""

    name = "reasoning_gym"
    answer_format = "Give your final answer inside <answer></answer> tags."

    def __init__(self, cfg: Any = None) -> None:
        self.cfg = config_from(ReasoningGymConfig, cfg)
        rg = require("reasoning_gym", "reasoning-gym")
        if self.cfg.dataset not in rg.factory.DATASETS:
            raise ValueError(f"unknown reasoning-gym dataset {self.cfg.dataset!r}; pick one of "
                             f"reasoning_gym.factory.DATASETS (e.g. mini_sudoku, countdown, maze)")
        try:
            self._data = {split: rg.create_dataset(self.cfg.dataset, size=n, seed=self.cfg.seed + k * 1_000_000,
                                                    **self.cfg.options)
                          for k, (split, n) in enumerate((("train", self.cfg.n_train), ("test", self.cfg.n_test)))}
        except TypeError as exc:
            raise ValueError(f"task.reasoning_gym.options {self.cfg.options} do not fit dataset "
                             f"{self.cfg.dataset!r}: {exc}") from None
        except Exception as exc:  # a dataset's own generator failing (missing data, an optional package)
            raise ValueError(f"reasoning-gym dataset {self.cfg.dataset!r} cannot be made: {_one_line(exc)}") from None
        self._entries: dict[str, dict[str, Any]] = {}
        self._problems: dict[str, list[Problem]] = {}
        seen: set[str] = set()
        for split in ("train", "test"):
            out = []
            for i, entry in enumerate(self._data[split]):
                if split == "test" and entry["question"] in seen:
                    continue
                seen.add(entry["question"])
                pid = f"rg-{self.cfg.dataset}-{split}-{i}"
                self._entries[pid] = entry
                out.append(Problem(id=pid, question=entry["question"], answer=str(entry["answer"])))
            self._problems[split] = out

    def problems(self, split: str) -> list[Problem]:
        return self._problems[check_split(split)]

    def extract_answer(self, response: str) -> str | None:
        """The text inside the last ``<answer></answer>``, stripped, or None."""
        found = _ANSWER.findall(response)
        return found[-1].strip() if found else None

    def score(self, problem: Problem, response: str) -> float:
        """The dataset's own verifier on the extracted answer (0 without one); some datasets give partial credit."""
        answer = self.extract_answer(response)
        if answer is None:
            return 0.0
        split = "test" if "-test-" in problem.id else "train"
        return float(self._data[split].score_answer(answer, self._entries[problem.id]))

    def passed(self, problem: Problem, response: str) -> bool:
        """Fully correct (reward 1)."""
        return self.score(problem, response) >= 1.0


_GYM_ACTIONS: dict[str, list[str]] = {
    "FrozenLake": ["left", "down", "right", "up"],
    "CliffWalking": ["up", "right", "down", "left"],
    "Taxi": ["south", "north", "east", "west", "pickup", "dropoff"],
}


@dataclass(kw_only=True)
class GymnasiumConfig(EnvConfig):
    env_id: str = "FrozenLake-v1"
    """A Gymnasium environment with render_mode ansi and discrete actions (FrozenLake-v1, CliffWalking-v1, Taxi-v3)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Keywords of gymnasium.make (e.g. {is_slippery: false, map_name: 4x4})."""
    max_turns: int = 20
    """Most turns per episode (one action each)."""


@register_env("gymnasium", config=GymnasiumConfig)
class GymnasiumEnv:
    """A text-rendered Gymnasium environment; one action per turn.

    Splits differ by their seeds only: an environment whose start does not depend on the seed (FrozenLake
    with a fixed map) gives the same instance in both.
    """

    distinct_instances = False

    def __init__(self, cfg: GymnasiumConfig) -> None:
        self.cfg, self.max_turns = cfg, cfg.max_turns
        gym = require("gymnasium", "gymnasium")
        try:
            self.env = gym.make(cfg.env_id, render_mode="ansi", **cfg.options)
        except Exception as exc:
            raise ValueError(f"gymnasium cannot make {cfg.env_id!r} with {cfg.options} ({exc}); pick a text-rendered "
                             f"environment such as FrozenLake-v1, CliffWalking-v1 or Taxi-v3") from None
        n = getattr(self.env.action_space, "n", None)
        if n is None:
            raise ValueError(f"{cfg.env_id!r} has no discrete actions; teamrl's gymnasium environment needs them")
        family = cfg.env_id.split("-")[0]
        self.names = _GYM_ACTIONS.get(family, [str(i) for i in range(int(n))])
        self.action_format = f"End with #### and one action: {', '.join(self.names)}."
        self.reward_sum, self.done = 0.0, False

    def reset(self, problem: Problem) -> str:
        self.env.reset(seed=int(problem.meta["seed"]) % (2**31))
        self.reward_sum, self.done = 0.0, False
        return self._render()

    def _render(self) -> str:
        text = _RED_CELL.sub("@", str(self.env.render()))  # FrozenLake marks the player with a red cell
        you = "@ is you. " if "@" in text else ""
        return f"{_ANSI.sub('', text)}\n{you}Actions: {', '.join(self.names)}."

    def parse_action(self, text: str) -> int | None:
        parts = text.rsplit("####", 1)
        if len(parts) < 2:
            return None
        word = parts[1].strip().split()[0].strip(".,").lower() if parts[1].strip() else ""
        if word in self.names:
            return self.names.index(word)
        return int(word) if word.isdigit() and int(word) < len(self.names) else None

    def step(self, action: Any | None) -> Turn:
        if action is None:
            return Turn(self._render(), -1.0, False, {"message": "no action found", "invalid": True})
        _, reward, terminated, truncated, _ = self.env.step(int(action))
        self.reward_sum += float(reward)
        # the episode ends at the goal, except FrozenLake, which also ends in a hole (reward 0)
        self.done = bool(terminated) and (float(reward) > 0 or not self.cfg.env_id.startswith("FrozenLake"))
        msg = f"{self.names[int(action)]}: reward {reward}"
        return Turn(self._render(), float(reward), bool(terminated or truncated), {"message": msg})

    @property
    def success(self) -> bool:
        return self.done
