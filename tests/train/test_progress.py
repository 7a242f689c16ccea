"""Progress displays (teamrl/train/progress.py): the log-file lines, and a rollout whose display moves
with every decode step, long before any episode finishes."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from teamrl.domains.math.arith import ArithConfig, ArithTask
from teamrl.engines.base import SamplingParams
from teamrl.engines.hf import HFEngine
from teamrl.tasks.base import Problem
from teamrl.team.agents import get_agent
from teamrl.team.team import AgentBinding, Dispatcher
from teamrl.team.workflows import MathTeamConfig, get_workflow
from teamrl.train import progress as progress_mod
from teamrl.train import rollout as rollout_mod
from teamrl.train.progress import TokenProgress, progress_line
from teamrl.train.rollout import Rollout


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_off_a_terminal_one_line_every_n_seconds_and_no_carriage_returns():
    out, clock = io.StringIO(), Clock()
    p = TokenProgress("eval (before)", stream=out, every_s=30, clock=clock)
    assert p.bar is None  # a StringIO is not a terminal
    for i in range(1, 101):  # 100 updates over 99 s: lines at 30, 60 and 90 s, then the closing one
        # at 30 s: (1240 - 40) tokens / 30 s = 40 tokens/s; (4000 - 1240) / 40 = 69 s to go
        clock.t = i - 1.0
        p.update(40 * i, 4000, f"calls {i // 10}/10, episodes 0/5")
    p.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and len(lines) == 4
    assert lines[0] == "eval (before): 31% 1.24k/4.00k tokens, 00:30 elapsed, 40 tokens/s, ETA 01:09, calls 3/10, episodes 0/5"
    assert lines[-1].startswith("eval (before): 100% 4.00k/4.00k tokens, 01:39 elapsed")


def test_close_does_not_repeat_the_last_line_and_disabled_writes_nothing():
    out, clock = io.StringIO(), Clock()
    p = TokenProgress("train", stream=out, every_s=0, unit="steps", clock=clock)
    p.update(0, 2)
    clock.t = 10.0
    p.update(1, 2, "reward 0.500, 10 s/step")
    p.close()
    assert out.getvalue().splitlines() == [
        "train: 0% 0/2 steps, 00:00 elapsed, - steps/s, ETA -",
        "train: 50% 1/2 steps, 00:10 elapsed, 0.1 steps/s, ETA 00:10, reward 0.500, 10 s/step"]
    quiet = io.StringIO()
    q = TokenProgress("x", enabled=False, stream=quiet, every_s=0)
    q.update(1, 2)
    q.close()
    assert quiet.getvalue() == ""


def test_a_terminal_gets_a_tqdm_bar():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    p = TokenProgress("rollout", stream=out)
    p.update(512, 1024, "calls 0/8, episodes 0/4")
    p.close()
    assert p.bar is not None and "rollout" in out.getvalue() and "calls 0/8, episodes 0/4" in out.getvalue()
    out = Tty()
    p = TokenProgress("rollout", stream=out, eta_from_episodes=True)  # the ETA is a postfix, not tqdm's token one
    p.update(512, 1024, "episodes 0/4", (0, 4))
    p.close()
    assert "episodes 0/4, ETA -]" in out.getvalue() and "<" not in out.getvalue()


def test_a_terminal_that_reports_no_size_still_gets_a_bar():
    """A pseudo-terminal nobody sized (0 columns, 0 lines: ``docker exec -t``, ``script`` in a pipeline): tqdm
    alone draws nothing there. The display runs in a child process whose stderr is such a terminal."""
    pty = pytest.importorskip("pty", reason="pseudo-terminals are POSIX only")
    master, slave = pty.openpty()
    code = ("import sys\nfrom teamrl.train.progress import TokenProgress, terminal_size\n"
            "assert terminal_size(sys.stderr) == (0, 0), terminal_size(sys.stderr)\n"
            "p = TokenProgress('eval (before)')\np.update(700, 1024, 'calls 48, episodes 0/48')\np.close()\n")
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    child = subprocess.run([sys.executable, "-c", code], stdin=slave, stdout=slave, stderr=slave, env=env,
                           timeout=60, check=False)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the other end is closed and everything was read
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    text = b"".join(chunks).decode("utf-8", "replace")
    assert child.returncode == 0, text
    assert "eval (before)" in text and "68%" in text and "calls 48" in text, text


def test_progress_line_rate_and_eta_are_after_the_start_position():
    assert progress_line("train", 3, 4, 20.0, unit="steps", initial=1) == (
        "train: 75% 3/4 steps, 00:20 elapsed, 0.1 steps/s, ETA 00:10")


def test_a_lockstep_rollout_moves_before_any_episode_finishes(tokenizer, monkeypatch):
    from tests.conftest import make_tiny_model

    seen: list[tuple[int, int, str]] = []

    class Recording(TokenProgress):
        def update(self, done: int, total: int, extra: str = "", episodes: tuple[int, int] = (0, 0)) -> None:
            seen.append((done, total, extra))
            super().update(done, total, extra, episodes)

    monkeypatch.setattr(rollout_mod, "TokenProgress", Recording)
    engine = HFEngine(make_tiny_model(tokenizer).eval(), tokenizer, seed=0)
    sp = SamplingParams(temperature=1.0, max_new_tokens=12)
    bindings = {a: AgentBinding(get_agent(a), "m", sp, get_agent(a).system_prompt) for a in ("solver", "verifier")}
    ro = Rollout(Dispatcher({"m": engine}), bindings, get_workflow("math_team"), MathTeamConfig(max_loops=1),
                 ArithTask(ArithConfig()))
    out = io.StringIO()
    monkeypatch.setattr(progress_mod.sys, "stderr", out)
    episodes = ro.collect([Problem(id="p", question="What is 2 + 3?", answer="5")], 4, progress=True)
    assert len(episodes) == 4
    before_any = [(d, t) for d, t, extra in seen if "episodes 0/4" in extra and d > 0]
    assert len(before_any) >= 5  # the solver batch alone is 12 decode steps
    assert all(d <= t for d, t, _ in seen)
    assert [d for d, _, _ in seen] == sorted(d for d, _, _ in seen)  # it only moves forward
    assert {t for _, t, _ in seen} == {8 * 12}  # the total is known up front: the calls the workflow declares
    done, total, extra = seen[-1]
    assert done == total == 8 * 12 and extra == "calls 8 (max 8), episodes 4/4"  # 4 solver + 4 verifier calls of 12
    assert "100% 96/96 tokens" in out.getvalue() and "\r" not in out.getvalue()


def test_a_rollouts_eta_comes_from_episodes_done_not_the_growing_token_total():
    out, clock = io.StringIO(), Clock()
    p = TokenProgress("rollout", stream=out, every_s=0, clock=clock, eta_from_episodes=True)
    clock.t = 10.0
    p.update(500, 1000, "episodes 0/4", (0, 4))   # no episode done yet: no ETA, whatever the tokens say
    clock.t = 20.0
    p.update(900, 3000, "episodes 1/4", (1, 4))   # the token total tripled; one episode in 20 s, three to go: 60 s
    p.close()
    lines = out.getvalue().splitlines()
    assert "ETA -," in lines[0]
    assert "ETA 01:00," in lines[1]


def test_the_update_phase_has_its_own_bar_fed_by_each_micro_batch():
    from teamrl.learner.accum import WATCHERS
    from teamrl.train.progress import UpdateProgress

    out = io.StringIO()
    with UpdateProgress(300, stream=out, every_s=0) as bar:
        assert bar.add in WATCHERS
        for tokens in (100.0, 120.0, 80.0):  # what Accum.add reports for each micro-batch
            for watch in WATCHERS:
                watch(tokens)
    assert WATCHERS == []
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("update: 0% 0/300 tokens") and lines[0].endswith("micro-batches 0")
    assert lines[1].startswith("update: 33% 100/300 tokens") and lines[-1].startswith("update: 100% 300/300 tokens")
    assert lines[-2].endswith("micro-batches 3") and lines[-1].endswith("micro-batches 3, optimizer step done")
