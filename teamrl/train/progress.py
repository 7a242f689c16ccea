"""Progress displays of rollouts, evaluations, the update and the training loop, in a terminal and in a log file.

A rollout's display counts **tokens**, with a total known when it starts: the ``max_new_tokens`` budget of every
call the workflow may make (the calls per episode it declares, :meth:`teamrl.train.rollout.Rollout.plan`). Its
position is the tokens sampled plus the budget that finished calls left unused
(:attr:`teamrl.team.dispatcher.Dispatcher.budget_done`) plus the budget of the calls a finished episode never made
(a verifier that approved at once). Under the lockstep scheduler every episode advances together and none
finishes until near the end, so a count of episodes would sit at 0% for minutes; the token count moves with every
decode step, never moves back and reaches exactly 100% when the last episode ends, so its rate gives an ETA from
the first seconds. (A workflow that declares no calls has a total that grows as calls arrive.)

The update's display (:class:`UpdateProgress`) counts the loss tokens of the rows trained, advanced by every
micro-batch, and says when the optimizer step after the last one is done.

When the stream is a terminal the display is a tqdm bar (rate, ETA). Otherwise (a log file, a
pipe) it writes one readable line every ``every_s`` seconds and one when it closes, instead of
tqdm's carriage-return updates. It does not decide what is counted: the caller feeds numbers.
(``eta_from_episodes`` keeps the former ETA from episodes done, for a caller whose total grows.)
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TextIO

from tqdm.auto import tqdm

LINE_EVERY_S = 30.0
"""Seconds between two lines when the display is not a terminal."""


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is an interactive terminal (a closed or odd stream counts as not)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


FALLBACK_SIZE = (100, 24)
"""Columns and lines of the bar's terminal when it reports none."""


def terminal_size(stream: TextIO) -> tuple[int, int]:
    """The columns and lines the terminal behind ``stream`` reports ((0, 0) when it reports none or cannot be
    asked)."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, ValueError, OSError):
        return 0, 0
    return size.columns, size.lines


def count(n: int) -> str:
    """A count as tqdm shows it: exact below 1,000, else with a k/M suffix.

    >>> count(512), count(1024), count(40960)
    ('512', '1.02k', '41.0k')
    """
    return str(n) if n < 1000 else tqdm.format_sizeof(n)


def episode_eta(elapsed: float, done: int, total: int) -> str:
    """Time left from episodes done: elapsed x (total - done) / done; ``-`` until a quarter of them have ended.

    Episodes run side by side and end in waves (most of an evaluation's end near its close), so the
    first few that end say little about the rest: extrapolated from 22 of 800 they gave 35 minutes for
    an evaluation that had one left.

    >>> episode_eta(60.0, 2, 8)   # 30 s an episode, 6 to go
    '03:00'
    >>> episode_eta(60.0, 1, 8)   # under a quarter done
    '-'
    """
    return tqdm.format_interval(elapsed * (total - done) / done) if 0 < done <= total and 4 * done >= total else "-"


def progress_line(desc: str, done: int, total: int, elapsed: float, extra: str = "", unit: str = "tokens",
                  initial: int = 0, eta: str | None = None) -> str:
    """One line of the non-terminal display.

    Args:
        desc: what runs (``rollout``, ``eval (before)``).
        done, total: position and total in ``unit``.
        elapsed: seconds since the start, when the position was ``initial``.
        extra: appended after a comma (calls, episodes, ...).
        eta: the ETA to show (:func:`episode_eta`); None: from the rate of ``unit``.

    Returns:
        e.g. ``eval (before): 25% 1.02k/4.10k tokens, 00:10 elapsed, 102 tokens/s, ETA 00:30, calls 32/64``.

    >>> progress_line("eval (before)", 1024, 4096, 10.0, "calls 32/64")
    'eval (before): 25% 1.02k/4.10k tokens, 00:10 elapsed, 102 tokens/s, ETA 00:30, calls 32/64'
    >>> progress_line("rollout", 0, 0, 0.0)
    'rollout: 0% 0/0 tokens, 00:00 elapsed, - tokens/s, ETA -'
    >>> progress_line("train", 5, 12, 90.0, "reward 0.234", unit="steps", initial=2)  # resumed at step 2: 30 s/step
    'train: 41% 5/12 steps, 01:30 elapsed, 0.033 steps/s, ETA 03:30, reward 0.234'
    """
    pct = 100 * done // total if total else 0
    rate = (done - initial) / elapsed if elapsed > 0 and done > initial else 0.0
    if eta is None:
        eta = tqdm.format_interval((total - done) / rate) if rate else "-"
    shown = f"{rate:.2g}" if 0 < rate < 1 else f"{rate:.0f}" if rate else "-"
    text = (f"{desc}: {pct}% {count(done)}/{count(total)} {unit}, {tqdm.format_interval(elapsed)} elapsed, "
            f"{shown} {unit}/s, ETA {eta}")
    return f"{text}, {extra}" if extra else text


class TokenProgress:
    """A progress display fed with (done, total, extra) as the work goes on.

    Args:
        desc: what runs.
        enabled: False: show nothing.
        stream: where to write (default: ``sys.stderr``, as tqdm).
        every_s: seconds between lines when ``stream`` is not a terminal (0: a line per update).
        unit: what is counted (``tokens``, ``steps``).
        leave: keep the terminal bar when it closes.
        clock: seconds (tests pass their own).
        eta_from_episodes: the ETA comes from the ``episodes`` (done, total) each update passes
            (:func:`episode_eta`), not from the rate of ``unit``.
    """

    def __init__(self, desc: str, *, enabled: bool = True, stream: TextIO | None = None,
                 every_s: float = LINE_EVERY_S, unit: str = "tokens", leave: bool = False,
                 clock: Callable[[], float] = time.monotonic, eta_from_episodes: bool = False) -> None:
        self.desc, self.enabled, self.every_s, self.unit, self.clock = desc, enabled, every_s, unit, clock
        self.eta_from_episodes = eta_from_episodes
        self.episodes = (0, 0)
        self.stream = stream if stream is not None else sys.stderr
        self.start = self.last = clock()
        self.done, self.total, self.extra = 0, 0, ""
        self.initial: int | None = None
        self.written: tuple[int, int, str] | None = None
        self.bar: tqdm | None = None
        if enabled and is_terminal(self.stream):
            # a terminal that reports no width (a pseudo-terminal nobody sized: `docker exec -t`, `script` in a
            # pipeline) gets nothing from tqdm, which sizes and hides its bar by the terminal: it gets FALLBACK_SIZE
            sized = min(terminal_size(self.stream)) > 0
            self.bar = tqdm(total=0, desc=desc, unit=" tokens" if unit == "tokens" else unit, unit_scale=True,
                            leave=leave, file=self.stream, dynamic_ncols=sized,
                            ncols=None if sized else FALLBACK_SIZE[0], nrows=None if sized else FALLBACK_SIZE[1],
                            # tqdm's own remaining time comes from the token rate: left out, the ETA is a postfix
                            **({"bar_format": "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}]"}
                               if eta_from_episodes else {}))

    def update(self, done: int, total: int, extra: str = "", episodes: tuple[int, int] = (0, 0)) -> None:
        """The new position (``done`` of ``total``), a short postfix (e.g. calls and episodes) and the episodes
        (done, total) the ETA comes from under ``eta_from_episodes``."""
        self.done, self.total, self.extra = max(0, min(done, total)), max(0, total), extra
        self.episodes = episodes
        if self.initial is None:
            self.initial = self.done
            if self.bar is not None:
                self.bar.n = self.bar.last_print_n = self.bar.initial = self.done
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.total = self.total
            eta = f", ETA {self._eta(self.clock())}" if self.eta_from_episodes else ""
            self.bar.set_postfix_str(f"{extra}{eta}", refresh=False)
            self.bar.update(self.done - self.bar.n)  # refreshes at most every tqdm's mininterval
            return
        now = self.clock()
        if now - self.last >= self.every_s:
            self.last = now
            self._line(now)

    def close(self) -> None:
        """End the display; off a terminal, write the last line unless it is already written."""
        if self.bar is not None:
            self.bar.refresh()
            self.bar.close()
        elif self.enabled and self.written != (self.done, self.total, self.extra):
            self._line(self.clock())

    def _line(self, now: float) -> None:
        self.written = (self.done, self.total, self.extra)
        eta = self._eta(now) if self.eta_from_episodes else None
        print(progress_line(self.desc, self.done, self.total, now - self.start, self.extra, self.unit,
                            self.initial or 0, eta), file=self.stream, flush=True)

    def _eta(self, now: float) -> str:
        return episode_eta(now - self.start, *self.episodes)


class UpdateProgress:
    """The update phase's display: loss tokens and micro-batches done, of the tokens the step's trained rows hold
    (every row's reply tokens whose advantage is not 0: the rows the loss reads), as a bar or as log lines.

    Used as a context manager around the learners' update; an in-process learner reports each micro-batch
    (:data:`teamrl.learner.accum.WATCHERS`), a remote one reports nothing until it ends.
    """

    def __init__(self, total_tokens: int, *, enabled: bool = True, stream: TextIO | None = None,
                 every_s: float = LINE_EVERY_S) -> None:
        self.bar = TokenProgress("update", enabled=enabled, stream=stream, every_s=every_s)
        self.total, self.done, self.micro_batches = total_tokens, 0, 0

    def add(self, tokens: float) -> None:
        self.done += int(tokens)
        self.micro_batches += 1
        self.total = max(self.total, self.done)  # rows the estimate left out (a loss term reading every token)
        self.bar.update(self.done, self.total, f"micro-batches {self.micro_batches}")

    def __enter__(self) -> UpdateProgress:
        from teamrl.learner.accum import WATCHERS

        WATCHERS.append(self.add)
        self.bar.update(0, self.total, "micro-batches 0")
        return self

    def __exit__(self, *exc: object) -> None:
        from teamrl.learner.accum import WATCHERS

        WATCHERS.remove(self.add)
        # the optimizer step and the weight sync after the last micro-batch: said, so a 100% line is not repeated
        self.bar.update(self.total, self.total, f"micro-batches {self.micro_batches}, optimizer step done")
        self.bar.close()
