"""The task contract of teamrl/tasks/data.py: rows from a file, a reward function (sync or async) with the row's
columns by name, registered with one call; options checked as keys are."""

from __future__ import annotations

import asyncio
import json

import pytest

from teamrl.config import tools as configtools
from teamrl.config.schema import load_config
from teamrl.tasks.base import TASKS, Problem, build_task, safe_score
from teamrl.tasks.data import register_data_task


@pytest.fixture
def rows(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [
        {"question": "Capital of France?", "answer": "Paris", "level": 1},
        {"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Capital of Peru?"}],
         "answer": "Lima", "level": 2}]))
    return path


@pytest.fixture
def registered():
    names = []

    def register(name, reward, **kwargs):
        register_data_task(name, reward, **kwargs)
        names.append(name)

    yield register
    for name in names:
        del TASKS[name]


def test_rows_become_problems_and_the_reward_gets_the_columns_by_name(rows, registered):
    seen = []

    def reward(*, completion, question, answer, level):
        seen.append((question, answer, level))
        return float(answer in completion)

    registered("t_sync", reward, train=rows, test=rows)
    task = build_task("t_sync")
    test = task.problems("test")
    assert [(p.question, p.answer) for p in test] == [("Capital of France?", "Paris"), ("Capital of Peru?", "Lima")]
    assert task.score(test[0], "It is Paris.") == 1.0 and task.score(test[1], "Quito") == 0.0
    assert seen == [("Capital of France?", "Paris", 1), ("Capital of Peru?", "Lima", 2)]
    assert not task.score_in_thread


def test_an_async_reward_is_awaited_inside_and_outside_an_event_loop(rows, registered):
    async def reward(*, completion, answer, **columns):
        await asyncio.sleep(0)
        return 0.5 if answer in completion else 0.0

    registered("t_async", reward, test=rows)
    task = build_task("t_async")
    problem = task.problems("test")[0]
    assert task.score_in_thread  # the rollout scores it in a worker thread
    assert task.score(problem, "Paris") == 0.5

    async def inside() -> float:
        return task.score(problem, "Paris")

    assert asyncio.run(inside()) == 0.5


def test_a_reward_that_raises_scores_zero_and_bad_rows_name_their_line(rows, tmp_path, registered):
    def reward(**_):
        raise KeyError("oops")

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a?", "answer": "b"}\n{"text": "no question"}\n')
    registered("t_raise", reward, test=rows, train=bad)
    task = build_task("t_raise")
    assert safe_score(task, task.problems("test")[0], "x") == 0.0
    with pytest.raises(ValueError, match=r"bad.jsonl row 2: no question field .*keys present: \['text'\]"):
        task.problems("train")
    registered("t_none", reward)
    with pytest.raises(ValueError, match="task 't_none' has no train data; set task.t_none.train_path"):
        build_task("t_none").problems("train")


def test_its_options_are_config_keys_checked_as_every_key_is(rows, registered):
    registered("t_cfg", lambda **_: 1.0, test=rows)
    cfg = load_config(None, ["task.name=t_cfg", f"task.t_cfg.train_path={rows}", "task.t_cfg.limit_test=1"])
    task = build_task("t_cfg", cfg.task.selected)
    assert len(task.problems("train")) == 2 and len(task.problems("test")) == 1
    with pytest.raises(configtools.ConfigError, match="did you mean 'task.t_cfg.train_path'"):
        load_config(None, ["task.name=t_cfg", "task.t_cfg.train_pth=x.jsonl"])


def test_register_refuses_what_is_not_a_function():
    with pytest.raises(TypeError, match="reward must be a function"):
        register_data_task("t_bad", "not a function")  # type: ignore[arg-type]
    assert "t_bad" not in TASKS
    assert Problem(id="x", question="q", answer="a").meta == {}
