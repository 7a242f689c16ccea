"""The rollout scores a task that runs programs (``score_in_thread``) off the event loop, so episodes keep going."""

from __future__ import annotations

import threading
import time

from teamrl.tasks.base import Problem
from teamrl.team.registry import WorkflowSpec
from teamrl.team.team import Dispatcher
from teamrl.train.rollout import Rollout
from tests.conftest import HANG_S


class _SlowTask:
    name = "slow"
    answer_format = ""

    def __init__(self, in_thread: bool) -> None:
        self.score_in_thread = in_thread
        self.threads: list[str] = []
        self.running, self.most_running = 0, 0
        self._lock = threading.Condition()

    def problems(self, split):
        return []

    def extract_answer(self, response):
        return response

    def score(self, problem, response):
        self.threads.append(threading.current_thread().name)
        with self._lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
            self._lock.notify_all()
            if self.score_in_thread:  # a program running in the sandbox: it waits until a second one runs beside it
                self._lock.wait_for(lambda: self.most_running >= 2, timeout=HANG_S)
        if not self.score_in_thread:
            time.sleep(0.2)  # a program running in the sandbox, on the event loop's thread
        with self._lock:
            self.running -= 1
        return 1.0


async def _answer(team, problem, task, cfg):
    return "x"


def _collect(task) -> float:
    rollout = Rollout(Dispatcher({}), {}, WorkflowSpec(_answer, object, ()), None, task)
    start = time.monotonic()
    episodes = rollout.collect([Problem("p", "q", "a")], 4, progress=False)
    assert [ep.reward for ep in episodes] == [1.0] * 4
    return time.monotonic() - start


def test_scores_in_worker_threads_when_the_task_asks():
    task = _SlowTask(in_thread=True)
    seconds = _collect(task)
    assert threading.main_thread().name not in task.threads
    assert task.most_running >= 2  # scores side by side: in a row, the first would wait out HANG_S alone
    assert seconds < HANG_S


def test_other_tasks_score_in_the_loop_as_before():
    task = _SlowTask(in_thread=False)
    assert _collect(task) >= 0.8 and set(task.threads) == {threading.main_thread().name}
    assert task.most_running == 1
