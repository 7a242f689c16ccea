"""An OpenAI-compatible endpoint in front of the team, so existing agent programs train unchanged.

:mod:`~teamrl.serve.server` holds the server, :mod:`~teamrl.serve.openai_api` the wire format;
the ``agent_program`` workflow (:mod:`teamrl.serve.agent_program`) runs a program per episode
against it. docs/agent-programs.md walks through training a program.
"""

from __future__ import annotations

import atexit

from teamrl.serve.server import Endpoint, Session

__all__ = ["Endpoint", "Session", "endpoint"]

_RUNNING: dict[tuple[str, int], Endpoint] = {}


def endpoint(host: str = "127.0.0.1", port: int = 0) -> Endpoint:
    """The process's endpoint on ``host:port``, started on first use and stopped at exit."""
    key = (host, port)
    if key not in _RUNNING:
        _RUNNING[key] = Endpoint(host, port).start()
        atexit.register(_RUNNING[key].stop)
    return _RUNNING[key]
