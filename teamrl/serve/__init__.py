"""An OpenAI-compatible endpoint in front of the team, so existing agent programs train unchanged.

:mod:`~teamrl.serve.server` holds the server, :mod:`~teamrl.serve.session` an episode's side of it,
:mod:`~teamrl.serve.openai_api` and :mod:`~teamrl.serve.responses_api` the wire formats,
:mod:`~teamrl.serve.guard` the limits on requests and :mod:`~teamrl.serve.caller` the tagging of
function-mode programs' calls with their episode;
the ``agent_program`` workflow (:mod:`teamrl.serve.agent_program`) runs a program per episode
against it. docs/agent-programs.md walks through training a program.
"""

from __future__ import annotations

import atexit

from teamrl.serve.guard import MAX_BODY_BYTES
from teamrl.serve.server import Endpoint
from teamrl.serve.session import Session

__all__ = ["Endpoint", "Session", "endpoint"]

_RUNNING: dict[tuple[str, int], Endpoint] = {}


def endpoint(host: str = "127.0.0.1", port: int = 0, max_body_bytes: int = MAX_BODY_BYTES) -> Endpoint:
    """The process's endpoint on ``host:port``, started on first use and stopped at exit (body limit: the latest asked)."""
    key = (host, port)
    if key not in _RUNNING:
        _RUNNING[key] = Endpoint(host, port).start()
        atexit.register(_RUNNING[key].stop)
    _RUNNING[key].max_body_bytes = max_body_bytes
    return _RUNNING[key]
