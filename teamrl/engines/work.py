"""The running counts of an engine's work, read by the phases' floors (:mod:`teamrl.metrics.phases`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any


class Work(dict):
    """``prefill_tokens`` (prompt tokens run through the model: a group's identical prompts and shared prefixes
    once), ``decode_steps``, ``decode_rows`` (the tokens they decoded), ``decode_context`` (the keys those rows
    attended: their contexts' lengths), ``sync_s`` (seconds spent making the rollout copy and the decode copies
    from the learner's weights: the weight sync's work) and ``busy_s`` (seconds of the engine's own steps)."""

    def __init__(self) -> None:
        super().__init__(prefill_tokens=0, decode_steps=0, decode_rows=0, decode_context=0, sync_s=0.0, busy_s=0.0)
        self._nested = 0.0  # sync seconds inside the current busy() block

    @contextlib.contextmanager
    def sync(self) -> Iterator[None]:
        """Time a weight sync's work (its seconds go to ``sync_s``, not to ``busy_s``)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - t0
            self["sync_s"] += took
            self._nested += took

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Time the engine's own work: prefills, decode steps, sampling (``busy_s``; a weight sync inside apart)."""
        t0, self._nested = time.perf_counter(), 0.0
        try:
            yield
        finally:
            self["busy_s"] += time.perf_counter() - t0 - self._nested

    def forward(self, rows: int, context: int) -> None:
        """Count one decode forward of ``rows`` rows attending ``context`` keys in all."""
        self["decode_steps"] += 1
        self["decode_rows"] += rows
        self["decode_context"] += context

    def decoded(self, made: int, done: list[tuple[int, Any]], *, one_token: bool) -> None:
        """Count a loop's call that sampled ``made`` tokens where its forwards are not counted one by one: one step of
        the running rows (the device loop, ``one_token``), or a generic loop's whole batch (as many forwards as its
        longest reply, each row attending its reply so far; prompts not counted)."""
        if not made:
            return
        if one_token:
            self["decode_steps"] += 1
        else:
            lengths = [len(out.response_ids) for _, out in done]
            self["decode_steps"] += max(lengths, default=0)
            self["decode_context"] += sum(n * (n + 1) // 2 for n in lengths)
        self["decode_rows"] += made
