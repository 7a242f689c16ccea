"""Your own data and reward in one file: a task made of a dataset and a Python reward function, registered with one
call (docs/own-task.md)::

    # my_task.py
    import teamrl

    def reward(*, completion: str, answer: str, **columns) -> float:
        return float(answer.lower() in completion.lower())

    teamrl.register_data_task("capitals", reward, train="data/train.jsonl", test="data/test.jsonl")

``teamrl train my.yaml --import my_task.py task.name=capitals`` then trains on it. The contract:

- **data**: a ``.jsonl`` / ``.json`` (a list of objects) / ``.parquet`` file, a dataset folder, or a Hugging Face
  dataset id (through the optional ``datasets`` package; :func:`teamrl.tasks.rows.load_rows`). Each row is one
  problem: its question from ``question_key`` (default: the first of question, problem, prompt; a chat list gives
  its last user message), its gold answer from ``answer_key`` (default: the first of answer, solution; absent is
  ``""``), and every other column goes to the reward.
- **reward**: ``reward(*, completion, question, answer, **columns) -> float``, called once per episode with the
  team's final text; sync or ``async def``. It may raise: the episode scores 0.0 with one warning
  (:func:`teamrl.tasks.base.safe_score`); a non-finite value fails its episode, not the run.
- **options**: ``task.<name>.train_path``, ``test_path`` (default: those given to :func:`register_data_task`),
  ``question_key``, ``answer_key``, ``limit_train``, ``limit_test``, ``seed``, ... (:class:`DataTaskConfig`),
  checked as every key is.

Nothing read from disk runs code: rows are data (JSON, Parquet, a saved dataset); the only code that runs is the
module the user names (``--import FILE``, or an import in their own script).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from teamrl.tasks.base import Problem, check_split, config_from, register_task
from teamrl.tasks.rows import BadLine, load_rows

__all__ = ["DataTask", "DataTaskConfig", "register_data_task"]

QUESTION_KEYS = ("question", "problem", "prompt")
"""Row fields tried, in order, for the question."""
ANSWER_KEYS = ("answer", "solution")
"""Row fields tried, in order, for the gold answer (none present: the answer is ``""``)."""


@dataclass(kw_only=True)
class DataTaskConfig:
    """Where a data task's rows come from (its reward is the registered function)."""

    train_path: str | None = None
    """Train rows: .jsonl/.json/.parquet file, dataset folder, or Hugging Face id; None: the path given to register_data_task."""
    test_path: str | None = None
    """Test rows, in the same forms; None: the path given to register_data_task."""
    hf_config: str | None = None
    """Config name for Hugging Face ids and dataset folders."""
    train_split: str = "train"
    """Split read from a Hugging Face id or dataset folder for the train problems."""
    test_split: str = "test"
    """Split read from a Hugging Face id or dataset folder for the test problems."""
    question_key: str | None = None
    """Row field with the question; None: the first of question, problem, prompt."""
    answer_key: str | None = None
    """Row field with the gold answer; None: the first of answer, solution (absent: "")."""
    limit_train: int = 0
    """Use at most this many train problems after shuffling; 0 = all."""
    limit_test: int = 0
    """Use the first this many test problems; 0 = all."""
    seed: int = 0
    """Seed for the order of the train problems (the test order is the file order)."""


Reward = Callable[..., Any]


class DataTask:
    """Problems from rows, scored by a user's reward function (:func:`register_data_task` builds it)."""

    def __init__(self, name: str, reward: Reward, answer_format: str, cfg: DataTaskConfig,
                 defaults: DataTaskConfig) -> None:
        self.name, self.reward, self.answer_format = name, reward, answer_format
        self.cfg = replace(cfg, train_path=cfg.train_path or defaults.train_path,
                           test_path=cfg.test_path or defaults.test_path)
        for key in ("limit_train", "limit_test"):
            if getattr(self.cfg, key) < 0:
                raise ValueError(f"task.{name}.{key} {getattr(self.cfg, key)} must be >= 0 (0: all)")
        self._cache: dict[str, list[Problem]] = {}

    def problems(self, split: str) -> list[Problem]:
        """The problems of ``split``: train shuffled by ``seed``, test in file order; then limited."""
        check_split(split)
        if split not in self._cache:
            self._cache[split] = self._load(split)
        return list(self._cache[split])

    def _load(self, split: str) -> list[Problem]:
        cfg = self.cfg
        source = cfg.train_path if split == "train" else cfg.test_path
        if source is None:
            raise ValueError(f"task {self.name!r} has no {split} data; set task.{self.name}.{split}_path (a data "
                             f"file, a dataset folder or a Hugging Face dataset id)")
        rows = load_rows(str(source), split=cfg.train_split if split == "train" else cfg.test_split,
                         hf_config=cfg.hf_config)
        problems = [self._problem(str(source), split, number, row) for number, row in rows]
        if split == "train":
            random.Random(cfg.seed).shuffle(problems)
        limit = cfg.limit_train if split == "train" else cfg.limit_test
        return problems[:limit] if limit else problems

    def _problem(self, source: str, split: str, number: int, row: Any) -> Problem:
        where = f"{source} row {number}"
        if isinstance(row, BadLine):
            raise ValueError(f"{where}: {row.reason}")
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected an object with a question, got {type(row).__name__}")
        qkey = self.cfg.question_key or next((k for k in QUESTION_KEYS if k in row), None)
        if qkey is None or qkey not in row:
            raise ValueError(f"{where}: no question field (looked for {qkey or ', '.join(QUESTION_KEYS)}; keys "
                             f"present: {sorted(row)}); set task.{self.name}.question_key")
        question = row[qkey]
        if isinstance(question, list) and question and all(isinstance(m, dict) for m in question):
            question = [m for m in question if m.get("role", "user") == "user"][-1].get("content")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{where}: {qkey!r} is not a non-empty text")
        akey = self.cfg.answer_key or next((k for k in ANSWER_KEYS if k in row), None)
        if self.cfg.answer_key is not None and akey not in row:
            raise ValueError(f"{where}: no {akey!r} field (keys present: {sorted(row)})")
        answer = "" if akey is None else str(row[akey])
        columns = {k: v for k, v in row.items() if k not in (qkey, akey)}
        return Problem(id=f"{self.name}-{split}-{number}", question=question.strip(), answer=answer, meta=columns)

    def extract_answer(self, response: str) -> str | None:
        """The last non-empty line of ``response`` (what transcripts show as the answer)."""
        lines = [line.strip() for line in response.splitlines() if line.strip()]
        return lines[-1] if lines else None

    def score(self, problem: Problem, response: str) -> float:
        """The reward function's value for the team's final text ``response``."""
        kwargs = {**problem.meta, "completion": response, "question": problem.question, "answer": problem.answer}
        value = self.reward(**kwargs)
        if inspect.isawaitable(value):
            value = _wait(value)
        return float(value)

    @property
    def score_in_thread(self) -> bool:
        """An async reward runs in a worker thread's event loop, so generation goes on meanwhile."""
        return inspect.iscoroutinefunction(self.reward)


def _wait(awaitable: Any) -> Any:
    """The value of ``awaitable``: in this thread's new event loop, or in a worker thread when a loop runs here."""
    async def run() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, run()).result()


def register_data_task(name: str, reward: Reward, *, train: str | Path | None = None, test: str | Path | None = None,
                       answer_format: str = "Give the final answer on the last line.") -> None:
    """Register task ``name``: the rows of ``train`` / ``test`` (or ``task.<name>.train_path`` / ``test_path``),
    each episode scored by ``reward(*, completion, question, answer, **columns)`` (sync or async).

    Args:
        name: the task's name (``task.name``); not registered already.
        reward: the reward function; it gets the team's final text, the row's question and gold answer, and the
            row's other columns by name, and returns a float (1.0 solved, 0.0 not, or anything between).
        train, test: default data sources (a file, a dataset folder or a Hugging Face id); a relative path is
            read from the current folder (``Path(__file__).parent / "train.jsonl"`` keeps it beside the module).
        answer_format: one sentence telling the agents how to give the answer (shown in their prompts).

    >>> register_data_task("doc-capitals", lambda *, completion, answer, **_: float(answer in completion))
    >>> from teamrl.tasks.base import TASKS, build_task
    >>> build_task("doc-capitals").score(Problem(id="1", question="Capital of France?", answer="Paris"), "Paris")
    1.0
    >>> del TASKS["doc-capitals"]
    """
    if not callable(reward):
        raise TypeError(f"register_data_task({name!r}): reward must be a function, got {type(reward).__name__}")
    defaults = DataTaskConfig(train_path=None if train is None else str(train),
                              test_path=None if test is None else str(test))

    def factory(cfg: Any = None) -> DataTask:
        return DataTask(name, reward, answer_format, config_from(DataTaskConfig, cfg), defaults)

    register_task(name, config=DataTaskConfig)(factory)
