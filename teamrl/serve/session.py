"""One episode's side of the agent endpoint: which agent answers which model name, and what the program posted.

A :class:`Session` runs each call on the episode's own event loop (from the server's thread), so
the call is batched by the episode's dispatcher and recorded as a Step of that episode. Left out:
HTTP (:mod:`teamrl.serve.server`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from teamrl.serve.openai_api import ApiError
from teamrl.suggest import did_you_mean
from teamrl.team.records import Step
from teamrl.team.team import Reply, Team


class Session:
    """One episode's calls through the endpoint: which agent answers which model name, and what the program posted.

    Args:
        team: the episode's team handle.
        loop: the event loop the episode (and its dispatcher) runs on.
        models: model name the program sends -> agent.
        fallback: agent answering every other model name (None: those are an error).
    """

    def __init__(self, team: Team, loop: asyncio.AbstractEventLoop, models: dict[str, str],
                 fallback: str | None = None) -> None:
        self.team, self.loop, self.models, self.fallback = team, loop, dict(models), fallback
        self.result: str | None = None
        """The answer POSTed to the result URL (None: none was)."""
        self.rewards: dict[int, float] = {}
        """Per-call rewards POSTed to the reward URL, by step index."""
        self.ids: dict[str, int] = {}
        """Completion id -> step index of every call answered."""
        self.name = ""
        """The episode's name in the endpoint's URLs (set by :meth:`Endpoint.open`)."""
        self.misaddressed = 0
        """Calls this episode's program made to another episode's URL (answered here, see :mod:`teamrl.serve.caller`)."""
        self._in_flight = 0
        self._busy_since = 0.0
        self._busy = 0.0

    def agent(self, model: str) -> str:
        """The agent answering ``model``; raises ApiError 404 for a name the session does not serve."""
        if model in self.models:
            return self.models[model]
        if self.fallback is not None:
            return self.fallback
        raise ApiError(404, f"model {model!r} is not served here{did_you_mean(model, self.models)} "
                       f"(served: {', '.join(sorted(self.models))})", code="model_not_found", param="model")

    def busy_s(self) -> float:
        """Seconds during which at least one call of the program was being answered (so far)."""
        return self._busy + (time.monotonic() - self._busy_since if self._in_flight else 0.0)

    async def call(self, make: Callable[[], Awaitable[Reply]]) -> tuple[Reply, Step]:
        """Run ``make()`` on the episode's loop (from the server's thread); returns the reply and its Step."""
        key = id(self)

        async def run() -> tuple[Reply, Step]:
            if self._in_flight == 0:
                self._busy_since = time.monotonic()
            self._in_flight += 1
            try:
                async with self.team.dispatcher.outside_call(key):
                    reply = await make()
            finally:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._busy += time.monotonic() - self._busy_since
            return reply, self.team.episode.steps[reply.step]

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run(), self.loop))
