"""The dispatcher that batches the calls of a team's agents (:class:`Dispatcher`).

A workflow is an ``async`` function; every ``await team.ask(agent, messages)`` (:mod:`teamrl.team.team`) becomes a
pending request on the engine of that agent's model. The :class:`Dispatcher` runs all episodes of a
rollout concurrently; calls of different episodes and of different agents sharing a model are
generated together. Every call is recorded as a :class:`~teamrl.team.records.Step`.

Two schedulers, per model:

* ``continuous`` (engines with a step API: ``add``, ``step``, ``busy``, ``reset``, as
  :class:`~teamrl.engines.hf.HFEngine`): the dispatcher advances each engine one decode step at a
  time; a call that finishes resolves at once, its episode runs on, and its next call (and any
  other new one) joins the running batch at the next step;
* ``lockstep`` (the default, and what engines without the step API always get): whenever every
  episode is waiting, each engine gets all its pending calls as one batch and generates them to
  completion.

Both are reproducible: the same seed gives the same run (each request's sampling uniforms are
drawn when it is added, so its tokens do not depend on its batch company).

Calls from programs teamrl cannot see (the OpenAI-compatible endpoint, :mod:`teamrl.serve`) arrive
at any time. While such programs run (:meth:`Dispatcher.outside`), a lockstep flush waits until
every one of them has a call pending, or until ``flush_window_s`` has passed since the oldest
pending call, so their calls share batches as the calls of in-process workflows do.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any

from teamrl.engines.base import Engine, GenOutput, GenRequest, SteppedEngine
from teamrl.team.context import infer_context_limit, max_token_chars

__all__ = ["Dispatcher"]


class Dispatcher:
    """Runs episodes concurrently and batches their LLM calls per physical model.

    ``schedulers`` maps a model to ``"continuous"`` or ``"lockstep"`` (see the module docstring);
    a model not named gets ``lockstep``; ``continuous`` needs an engine with the step API (others
    fall back to ``lockstep``).
    """

    SCHEDULERS = ("continuous", "lockstep")

    def __init__(self, engines: dict[str, Engine], *, schedulers: dict[str, str] | None = None,
                 context_limits: dict[str, int | None] | None = None) -> None:
        """``context_limits``: tokens a prompt plus its reply may take per model (``models.<m>.max_context``);
        a model not named gets :func:`~teamrl.team.context.infer_context_limit` of its engine."""
        self.engines = engines
        self._limits = {m: infer_context_limit((context_limits or {}).get(m), e) for m, e in engines.items()}
        self._token_chars: dict[str, int] = {}
        self.pending: dict[str, list[tuple[GenRequest, asyncio.Future[GenOutput]]]] = {m: [] for m in engines}
        self.continuous: set[str] = set()
        """Models whose engine is stepped (the others are lockstep)."""
        self._stepped_engines: dict[str, SteppedEngine] = {}
        for m, engine in engines.items():
            choice = (schedulers or {}).get(m, "lockstep")
            if choice not in self.SCHEDULERS:
                raise ValueError(f"scheduler {choice!r} of model {m!r} is not one of {self.SCHEDULERS}")
            if choice == "continuous" and isinstance(engine, SteppedEngine):
                self.continuous.add(m)
                self._stepped_engines[m] = engine
        self._running: dict[str, dict[int, asyncio.Future[GenOutput]]] = {m: {} for m in self.continuous}
        self.flush_window_s = 0.05
        """Longest wait of a lockstep flush for programs outside (see the module docstring)."""
        self._outside: dict[object, int] = {}  # running outside program -> its calls in flight
        self._oldest: float | None = None  # when the oldest pending lockstep call was submitted
        self.calls = 0
        self.on_calls: Callable[[int], None] | None = None
        """Called with the running count of generated calls after every engine step (for progress displays)."""
        self.budget_submitted = 0
        """Sum of ``max_new_tokens`` over the calls submitted so far (progress displays: the token total)."""
        self._budget_done = {m: 0 for m in engines}  # the same over finished calls, per model

    @property
    def budget_done(self) -> int:
        """How much of :attr:`budget_submitted` is done: tokens sampled plus the budget finished calls left
        unused, from engines that count them (``generated_tokens`` and ``unused_tokens``, e.g. the ``hf``
        engine) after every step; for other engines, the whole budget of each finished call."""
        total = 0
        for m, e in self.engines.items():
            if hasattr(e, "generated_tokens") and hasattr(e, "unused_tokens"):
                total += e.generated_tokens + e.unused_tokens
            else:
                total += self._budget_done[m]
        return total

    def submit(self, model: str, request: GenRequest) -> asyncio.Future[GenOutput]:
        fut = asyncio.get_running_loop().create_future()
        budget = request.sampling.max_new_tokens
        self.budget_submitted += budget

        def finished(_f: asyncio.Future[GenOutput]) -> None:
            self._budget_done[model] += budget

        fut.add_done_callback(finished)
        self.pending[model].append((request, fut))
        if self._oldest is None and model not in self.continuous:
            self._oldest = time.monotonic()
        return fut

    @contextlib.contextmanager
    def outside(self, key: object) -> Iterator[None]:
        """Mark a program outside teamrl's view as running while the block runs (``key`` names it)."""
        self._outside[key] = 0
        try:
            yield
        finally:
            self._outside.pop(key, None)

    @contextlib.asynccontextmanager
    async def outside_call(self, key: object) -> AsyncIterator[None]:
        """Mark one call of the outside program ``key`` as in flight while the block runs."""
        if key in self._outside:
            self._outside[key] += 1
        try:
            yield
        finally:
            if key in self._outside:
                self._outside[key] -= 1

    def _hold(self) -> bool:
        """Whether a lockstep flush should wait for outside programs still working towards their next call."""
        if self._oldest is None or all(n > 0 for n in self._outside.values()):
            return False
        return time.monotonic() - self._oldest < self.flush_window_s

    def tokenizer(self, model: str) -> Any:
        return self.engines[model].tokenizer

    def context_limit(self, model: str) -> int | None:
        """Tokens a prompt plus its reply may take on ``model`` (None: no limit known)."""
        return self._limits.get(model)

    def token_chars(self, model: str) -> int:
        """Most characters one token of ``model``'s tokenizer stands for (read once)."""
        if model not in self._token_chars:
            self._token_chars[model] = max_token_chars(self.tokenizer(model))
        return self._token_chars[model]

    def run(self, coros: Sequence[Awaitable[Any]], on_done: Callable[[], None] | None = None) -> list[Any]:
        """Run all coroutines to completion; returns their results in order."""
        return asyncio.run(self._run(list(coros), on_done))

    async def _run(self, coros: list[Awaitable[Any]], on_done: Callable[[], None] | None) -> list[Any]:
        tasks = [asyncio.ensure_future(c) for c in coros]
        if on_done is not None:
            for t in tasks:
                t.add_done_callback(lambda _t: on_done())
        try:
            while not all(t.done() for t in tasks):
                await self._settle(tasks)
                if self._hold():
                    worked = self._step()  # continuous models go on; lockstep ones wait
                    if not worked:
                        await asyncio.sleep(0.001)
                    continue
                worked = self._flush()
                worked = self._step() or worked
                if not worked and not all(t.done() for t in tasks):
                    await asyncio.sleep(0.001)  # episodes waiting on something else (a tool, I/O)
            return [t.result() for t in tasks]
        finally:
            for t in tasks:
                t.cancel()
            for m in self.continuous:  # an interrupted run leaves nothing behind in the engines
                if self._stepped(m).busy:
                    self._stepped(m).reset()
                self._running[m].clear()

    async def _settle(self, tasks: list[asyncio.Task[Any]]) -> None:
        """Let episodes run until no new request appears and no episode finishes."""
        prev = (-1, -1)
        for _ in range(1000):
            await asyncio.sleep(0)
            now = (sum(len(v) for v in self.pending.values()), sum(t.done() for t in tasks))
            if now == prev:
                return
            prev = now

    def _progress(self, n: int) -> None:
        self.calls += n
        if self.on_calls is not None:
            self.on_calls(self.calls)

    def _flush(self) -> bool:
        """Lockstep models: generate all pending calls as one batch. Returns whether there were any."""
        worked = False
        self._oldest = None
        for model, items in self.pending.items():
            if not items or model in self.continuous:
                continue
            worked = True
            self.pending[model] = []
            try:
                outs = self.engines[model].generate([req for req, _ in items], on_progress=self._progress)
            except Exception as exc:  # every waiting episode sees the engine's error
                self.engines[model].reset()  # drop what the failed batch left queued or running in the engine
                for _, fut in items:
                    fut.set_exception(exc)
                continue
            for (_, fut), out in zip(items, outs):
                fut.set_result(out)
        return worked

    def _stepped(self, model: str) -> SteppedEngine:
        return self._stepped_engines[model]  # the continuous models' engines, checked once in __init__

    def _step(self) -> bool:
        """Continuous models: queue new calls, run one decode step, resolve the calls that finished."""
        worked = False
        for model in self.continuous:
            engine = self._stepped(model)
            running = self._running[model]
            items, self.pending[model] = self.pending[model], []
            try:
                if items:
                    running.update(zip(engine.add([req for req, _ in items]), (fut for _, fut in items)))
                if not engine.busy:
                    continue
                worked = True
                done = engine.step()
            except Exception as exc:  # every call on this engine sees its error
                engine.reset()
                for fut in running.values():
                    fut.set_exception(exc)
                for _, fut in items:
                    if not fut.done():
                        fut.set_exception(exc)
                running.clear()
                continue
            for rid, out in done:
                running.pop(rid).set_result(out)
            self._progress(len(done))
        return worked
