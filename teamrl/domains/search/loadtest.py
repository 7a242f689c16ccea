"""A bounded load test of a retrieval service on loopback: many concurrent clients, some malformed.

:func:`run_load` opens ``concurrency`` connections at once, each sending one request and reading
the reply (``Connection: close``), until ``requests`` requests have been sent or ``deadline_s``
has passed. Every ``malformed_every``-th request is broken in one of the ways listed in
:data:`MALFORMED` and must get its 4xx JSON error; every other one asks for the documents of a
question (alternating the ``queries`` and the single ``query`` form) and must get exactly the
document ids that the in-process index gives. Connection resets, refused or cut-off connections,
timeouts and wrong answers are counted separately. It speaks raw HTTP/1.1 over asyncio streams,
so that requests no HTTP client would send (a ``Content-Length`` of ``abc``) can be sent too.

Used by ``benchmarks/retriever.py --load`` and the service's tests. It talks only to loopback
addresses.

Left out: keep-alive reuse (each request opens a connection, the harder case for a listen queue)
and TLS.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import statistics
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

__all__ = ["MALFORMED", "LoadResult", "run_load"]

MALFORMED: list[tuple[str, bytes, int]] = [
    ("bad Content-Length", b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}", 400),
    ("negative Content-Length", b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n{}", 400),
    ("not JSON", b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n{queries:", 400),
    ("wrong type", b'POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 16\r\n\r\n{"queries": "x"}', 400),
    ("topk out of range", b'POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 32\r\n\r\n'
                          b'{"queries": ["x"], "topk": 10000}', 400),
]
"""(what is wrong, the raw request, the status it must get); each reply must be JSON with an ``error``."""


@dataclass
class LoadResult:
    """Counts and latencies of one :func:`run_load`."""

    requests: int = 0
    concurrency: int = 0
    answered: int = 0
    """Well-formed requests answered 200 with the expected documents."""
    rejected: int = 0
    """Malformed requests answered with the expected 4xx JSON error."""
    resets: int = 0
    """Connections reset, refused or closed by the server before a full reply."""
    errors: int = 0
    """Timeouts, wrong statuses and wrong answers."""
    wall_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    first_errors: list[str] = field(default_factory=list)

    def percentile_ms(self, q: float) -> float:
        """The ``q``-th percentile of the per-request latency, in milliseconds."""
        if len(self.latencies_s) < 2:
            return 1000 * (self.latencies_s[0] if self.latencies_s else float("nan"))
        return 1000 * statistics.quantiles(self.latencies_s, n=100, method="inclusive")[int(q) - 1]

    @property
    def throughput(self) -> float:
        """Replies per second over the whole run."""
        return (self.answered + self.rejected) / self.wall_s if self.wall_s else 0.0

    def line(self, name: str) -> str:
        """A ``RESULT name=... key=value`` line of the measured numbers."""
        return (f"RESULT name={name} requests={self.requests} concurrency={self.concurrency} resets={self.resets} "
                f"errors={self.errors} answered={self.answered} rejected={self.rejected} "
                f"p50_ms={self.percentile_ms(50):.1f} p99_ms={self.percentile_ms(99):.1f} "
                f"throughput={self.throughput:.1f}")


def _loopback(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, parts.port, proto=socket.IPPROTO_TCP)}
    except socket.gaierror:
        addresses = set()
    if parts.scheme != "http" or not parts.port or not addresses or not all(
            ipaddress.ip_address(a).is_loopback for a in addresses):
        raise ValueError(f"load test url {url!r} must be http://127.0.0.1:PORT (loopback only)")
    return host, parts.port


def _good_request(query: str, single: bool, topk: int) -> bytes:
    body = {"query": query} if single else {"queries": [query]}
    data = json.dumps({**body, "topk": topk, "return_scores": True}).encode()
    return (b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))


async def _exchange(host: str, port: int, request: bytes, timeout_s: float) -> tuple[int, bytes]:
    """Send ``request`` on a new connection; (status, body) of the reply read up to EOF."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    try:
        writer.write(request)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout_s)
    finally:
        writer.close()
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        raise ConnectionResetError(f"connection closed after {len(raw)} bytes, before a full reply")
    return int(head.split(b" ", 2)[1]), body


def _check(status: int, body: bytes, want_status: int, want_ids: list[str] | None) -> str | None:
    """Why the reply is wrong, or None."""
    try:
        payload = json.loads(body)
    except ValueError:
        return f"HTTP {status} with a non-JSON body {body[:80]!r}"
    if status != want_status:
        return f"HTTP {status} instead of {want_status}: {body[:120]!r}"
    if want_ids is None:
        has_error = isinstance(payload, dict) and isinstance(payload.get("error"), str)
        return None if has_error else f"no error message: {body[:80]!r}"
    got = [item["document"]["id"] for item in payload["result"][0]]
    return None if got == want_ids else f"documents {got} instead of {want_ids}"


async def run_load(url: str, expected: dict[str, list[str]], *, requests: int = 1000, concurrency: int = 500,
                   malformed_every: int = 5, topk: int = 3, timeout_s: float = 30.0,
                   deadline_s: float = 120.0) -> LoadResult:
    """Load the service at ``url`` (loopback only) and count what came back.

    Args:
        url: ``http://127.0.0.1:PORT`` of the service.
        expected: Question → ids of its ``topk`` best documents (from the in-process index).
        requests: Requests sent in all (well-formed and malformed).
        concurrency: Connections open at the same time.
        malformed_every: Every n-th request is malformed (0 = none).
        timeout_s: Limit on connecting and on reading each reply.
        deadline_s: Limit on the whole run; requests not started by then are not sent.

    Raises:
        ValueError: ``url`` is not a loopback address, or the sizes are not positive.
    """
    host, port = _loopback(url)
    if requests < 1 or concurrency < 1 or malformed_every < 0 or not expected:
        raise ValueError(f"requests {requests} and concurrency {concurrency} must be >= 1, malformed_every "
                         f"{malformed_every} >= 0, and expected must hold at least one question")
    questions = list(expected)
    result = LoadResult(concurrency=concurrency)
    next_id = iter(range(requests))
    start = time.perf_counter()
    stop_at = start + deadline_s

    async def one(i: int) -> None:
        if malformed_every and i % malformed_every == malformed_every - 1:
            what, request, want_status = MALFORMED[(i // malformed_every) % len(MALFORMED)]
            want_ids = None
        else:
            what = questions[i % len(questions)]
            request, want_status, want_ids = _good_request(what, i % 2 == 1, topk), 200, expected[what]
        t0 = time.perf_counter()
        problem: str | None
        try:
            status, body = await _exchange(host, port, request, timeout_s)
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            result.resets += 1
            problem = f"{type(exc).__name__}: {exc}"
        except (asyncio.TimeoutError, OSError) as exc:
            result.errors += 1
            problem = f"{type(exc).__name__}: {exc}"
        else:
            result.latencies_s.append(time.perf_counter() - t0)
            problem = _check(status, body, want_status, want_ids)
            if problem is None:
                result.rejected += want_ids is None
                result.answered += want_ids is not None
            else:
                result.errors += 1
        if problem is not None and len(result.first_errors) < 5:
            result.first_errors.append(f"{what!r}: {problem}")

    async def client() -> None:
        for i in next_id:  # the shared iterator bounds the count
            if time.perf_counter() > stop_at:
                return
            result.requests += 1
            await one(i)

    await asyncio.gather(*(client() for _ in range(concurrency)))
    result.wall_s = time.perf_counter() - start
    return result
