"""Which episode's program made an HTTP call: function-mode programs tag their requests with their episode.

Function-mode programs of all episodes share one process and one event loop. A program that keeps
a client in process-global state (the OpenAI Agents SDK's ``set_default_openai_client``, a module
level ``AsyncOpenAI``) sends its calls to the base URL of whichever episode set it last, so without
this the call would be recorded in another episode. The workflow runs each program in a context
that names its episode (:data:`CALLER`, a context variable: asyncio tasks and ``to_thread`` copy
it); :func:`install` makes httpx and httpx2 (the transports of the ``openai`` client and of the
frameworks built on it) add that name as the ``X-Teamrl-Caller`` header to requests bound for the endpoint, and the
endpoint answers a call in the caller's episode whatever episode its URL names, counting it.
Left out: clients that do not use httpx (aiohttp, requests) and threads started without the
context; their misaddressed calls show as episodes without calls (``rollout/episodes_without_calls``).
Command programs need none of this: each runs in its own process with its own environment.
"""

from __future__ import annotations

import contextvars
import functools
from typing import Any

CALLER_HEADER = "x-teamrl-caller"
CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("teamrl_caller", default=None)
"""The endpoint episode whose program runs in the current context (None: not a program)."""

_ORIGINS: set[str] = set()
_PATCHED: set[str] = set()
CLIENT_MODULES = ("httpx", "httpx2")
"""HTTP client packages whose clients are tagged (the ``openai`` client uses httpx2, or httpx when given one)."""


def _tag(request: Any) -> None:
    caller = CALLER.get()
    if caller is not None and any(str(request.url).startswith(origin + "/") for origin in _ORIGINS):
        request.headers[CALLER_HEADER] = caller


def install(origin: str) -> None:
    """Tag requests to ``origin`` (``http://host:port``) made inside a program's context; idempotent."""
    import importlib

    _ORIGINS.add(origin)
    for name in CLIENT_MODULES:
        if name in _PATCHED:
            continue
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        _PATCHED.add(name)
        _wrap_send(module.Client, module.AsyncClient)


def _wrap_send(sync_cls: Any, async_cls: Any) -> None:
    sync_send, async_send = sync_cls.send, async_cls.send

    @functools.wraps(sync_send)
    def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        _tag(request)
        return sync_send(self, request, *args, **kwargs)

    @functools.wraps(async_send)
    async def asend(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        _tag(request)
        return await async_send(self, request, *args, **kwargs)

    sync_cls.send, async_cls.send = send, asend
