"""Limits on what enters the agent endpoint: body size, JSON nesting depth, reward values.

Every check raises :class:`~teamrl.serve.openai_api.ApiError` (a 4xx in OpenAI's error shape), so
a malformed or hostile request never becomes a 500 and never reaches the run. The body is read
chunk by chunk and refused with 413 as soon as it passes the limit (or at once when its
``Content-Length`` says so), so an oversized body is never held whole. Left out: limits on the
number of messages or prompt tokens (the model's context limit bounds those).
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from typing import Any

from teamrl.serve.openai_api import ApiError
from teamrl.tasks.rows import json_depth

MAX_BODY_BYTES = 16 * 1024 * 1024
"""Default largest request body (16 MiB: a long multi-turn chat with tool outputs is well under it)."""
MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects a request body may have (OpenAI requests need under 10)."""
MAX_ABS_REWARD = 1e6
"""Largest |reward| a program may post; larger or non-finite values are refused."""


async def read_body(chunks: AsyncIterator[bytes], content_length: str | None, limit: int) -> bytes:
    """The request body, refused with 413 once it is larger than ``limit`` bytes.

    Args:
        chunks: the body as it arrives (Starlette's ``request.stream()``).
        content_length: the ``Content-Length`` header, if any (checked before reading).
        limit: most bytes accepted.

    Returns:
        The body.
    """
    too_big = ApiError(413, f"the request body is larger than the endpoint's limit of {limit} bytes "
                       f"(workflow.agent_program.max_body_bytes)", code="request_too_large")
    if content_length is not None and content_length.strip().isdigit() and int(content_length) > limit:
        raise too_big
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise too_big
        parts.append(chunk)
    return b"".join(parts)


def parse_json(body: bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The body as JSON; 400 for invalid JSON (including NaN/Infinity literals) or nesting deeper than ``max_depth``.

    >>> parse_json(b'{"a": [1]}')
    {'a': [1]}
    """
    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not valid JSON")

    try:
        value = json.loads(body, parse_constant=no_constant)
    except RecursionError:
        raise ApiError(400, f"the request body nests deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON ({exc})") from None
    if json_depth(value) > max_depth:
        raise ApiError(400, f"the request body nests deeper than {max_depth} levels")
    return value


def check_reward(value: Any, limit: float = MAX_ABS_REWARD) -> float:
    """A posted reward as a float; 400 naming the value unless it is a finite number with |r| <= ``limit``.

    >>> check_reward(0.5), check_reward(-1)
    (0.5, -1.0)
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ApiError(400, f"reward must be a number, got {value!r}", param="reward")
    try:
        reward = float(value)
    except OverflowError:  # an integer too large for a float
        reward = math.inf
    if not math.isfinite(reward) or abs(reward) > limit:
        raise ApiError(400, f"reward {value!r} is out of range: rewards must be finite with |reward| <= {limit:g}",
                       param="reward")
    return reward
