"""Talking to a retriever: the HTTP client, and batching the searches of concurrent episodes.

:class:`HttpRetriever` posts to a Search-R1-protocol service (``teamrl serve-retriever`` or an
e5/FAISS server of that protocol) through an ``httpx`` pool of keep-alive connections shared by
all threads. Servers close idle connections (Search-R1's and ours after 5 s): such a connection is
replaced by a new one without costing a retry or a wait. A request that cannot connect, times
out, is cut off or gets HTTP 5xx is retried ``retries`` times, waiting ``backoff_s``, then twice
that, and so on; after the last try :class:`RetrieverUnavailableError` (a ``ConnectionError``)
names the URL, the attempts and the last error, and says to start the service only when nothing
accepted the connection. HTTP 4xx is not retried (ValueError with the server's message).

The in-process alternative is the index itself (:class:`teamrl.domains.search.index.Bm25Index` has the
same ``retrieve(queries, topk)``), so both modes give identical hits.

:class:`AsyncRetrieval` lets episodes ``await`` searches: the queries that episodes issue at the
same moment go out as one ``retrieve`` call, in a worker thread, so the event loop (and every
other episode) keeps running while it waits.

Left out: authentication, HTTPS client certificates, and load-balancing over several servers.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httpx

from teamrl.domains.search.index import Hit, doc_from_row

__all__ = ["AsyncRetrieval", "HttpRetriever", "RetrieverUnavailableError", "parse_response"]


class RetrieverUnavailableError(ConnectionError):
    """The retrieval service did not answer after every retry."""


_DROPPED = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
"""What a request on a connection that the server had just closed raises (no reply was read)."""


def parse_response(payload: Any, n_queries: int) -> list[list[Hit]]:
    """Hits from a ``/retrieve`` reply, with or without scores (score 0.0 when none is given).

    >>> parse_response({"result": [[{"document": {"id": "1", "contents": '"T"\\nx'}, "score": 2.5}]]}, 1)
    [[Hit(doc=Doc(id='1', contents='"T"\\nx'), score=2.5)]]
    """
    result = payload.get("result") if isinstance(payload, dict) else None
    if not isinstance(result, list) or len(result) != n_queries:
        raise ValueError(f"expected {{'result': [...]}} with {n_queries} entries, got {str(payload)[:200]}")
    hits = []
    for i, items in enumerate(result):
        row = []
        for item in items:
            if isinstance(item, dict) and "document" in item:
                row.append(Hit(doc_from_row(item["document"], f"result[{i}]"), float(item.get("score", 0.0))))
            else:
                row.append(Hit(doc_from_row(item, f"result[{i}]"), 0.0))
        hits.append(row)
    return hits


class HttpRetriever:
    """Client of a Search-R1-protocol retrieval service; thread-safe.

    Args:
        url: The service, e.g. ``http://127.0.0.1:8000`` (a trailing ``/retrieve`` is accepted).
        timeout_s: Seconds to wait for a connection and for each reply.
        retries: Extra attempts after a failed one (0 = try once).
        backoff_s: Wait before the first retry; doubled before each further one.
    """

    def __init__(self, url: str, *, timeout_s: float = 30.0, retries: int = 3, backoff_s: float = 0.5) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"retriever_url {url!r} is not an http(s) URL; use e.g. http://127.0.0.1:8000")
        if timeout_s <= 0 or retries < 0 or backoff_s < 0:
            raise ValueError(f"retriever timeout_s={timeout_s} must be > 0, retries={retries} and "
                             f"backoff_s={backoff_s} >= 0")
        base = parts.path.rstrip("/")
        base = base[: -len("/retrieve")] if base.endswith("/retrieve") else base
        self.url = f"{parts.scheme}://{parts.netloc}{base}"
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        # TCP_NODELAY: httpx writes headers and body separately, and with Nagle's algorithm the body waits for
        # the server's delayed ACK. trust_env=False: a loopback service is not reached through a proxy from the env.
        transport = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
        self._client = httpx.Client(transport=transport, timeout=timeout_s, trust_env=False,
                                    headers={"Content-Type": "application/json"})
        self.reconnects = 0
        """Requests sent again at once because the server had closed their pooled connection."""

    def _once(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        """One request; a pooled connection that the server closed in the meantime is replaced for free.

        httpx drops idle connections that the server has visibly closed before reusing them; a
        close that crosses the request on the wire surfaces as a connection dropped without a
        reply, and the request goes once more on a new connection without counting as a retry.
        """
        try:
            resp = self._client.request(method, self.url + path, content=body)
        except _DROPPED:
            self.reconnects += 1
            resp = self._client.request(method, self.url + path, content=body)
        return resp.status_code, resp.content

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode("utf-8")
        endpoint, start, last, refused = f"{self.url}{path}", time.monotonic(), "", True
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                status, payload = self._once(method, path, data)
            except httpx.TransportError as exc:
                last, refused = f"{type(exc).__name__}: {exc}", refused and isinstance(exc, httpx.ConnectError)
                continue
            if status >= 500:
                last, refused = f"HTTP {status}: {payload[:200].decode('utf-8', 'replace')}", False
                continue
            if status != 200:
                raise ValueError(f"retriever at {endpoint} rejected the request (HTTP {status}): "
                                 f"{payload[:300].decode('utf-8', 'replace')}")
            return json.loads(payload)
        hint = ("nothing accepts connections there: start it with `teamrl serve-retriever --corpus CORPUS --port "
                "PORT`, fix task.search.retriever_url, or set it to null to search in-process" if refused else
                "the service accepts connections but did not answer; check its log, or raise task.search.timeout_s "
                "or task.search.retries")
        raise RetrieverUnavailableError(
            f"retriever at {endpoint} did not answer after {self.retries + 1} attempt(s) in "
            f"{time.monotonic() - start:.1f}s (last error: {last}); {hint}")

    def retrieve(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """The best ``topk`` hits of each query, best first."""
        if not queries:
            return []
        payload = self._call("POST", "/retrieve", {"queries": list(queries), "topk": topk, "return_scores": True})
        return parse_response(payload, len(queries))

    def check(self) -> None:
        """Fail early (same errors as :meth:`retrieve`) when the service cannot answer a query.

        Uses ``POST /retrieve``, which every server of the protocol has (``/health`` is ours only).
        """
        self.retrieve(["connection check"], 1)

    def health(self) -> dict[str, Any]:
        """The service's ``GET /health`` reply."""
        return self._call("GET", "/health")

    def close(self) -> None:
        """Close the pooled connections."""
        self._client.close()


class AsyncRetrieval:
    """Awaitable searches; the queries issued by concurrent episodes in one moment share a call.

    Args:
        retrieve: A blocking ``retrieve(queries, topk)``, e.g. an index's or an
            :class:`HttpRetriever`'s; it runs in a worker thread.
        topk: Hits per query.
        settle_ticks: Event-loop turns to wait for more queries before sending a batch.
    """

    def __init__(self, retrieve: Callable[[list[str], int], list[list[Hit]]], topk: int,
                 settle_ticks: int = 8) -> None:
        self.retrieve, self.topk, self.settle_ticks = retrieve, topk, settle_ticks
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[tuple[list[str], asyncio.Future]] = []
        self._flusher: asyncio.Task | None = None
        self.calls = 0
        """Retrieve calls made (each may carry the queries of many episodes)."""

    async def search(self, queries: list[str]) -> list[list[Hit]]:
        """The hits of each query; raises what the retriever raised."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (one per rollout): forget the old one's state
            self._loop, self._pending, self._flusher = loop, [], None
        fut = loop.create_future()
        self._pending.append((list(queries), fut))
        if self._flusher is None:
            self._flusher = loop.create_task(self._flush())
        return await fut

    async def _flush(self) -> None:
        for _ in range(self.settle_ticks):
            await asyncio.sleep(0)
        batch, self._pending, self._flusher = self._pending, [], None
        flat = [q for qs, _ in batch for q in qs]
        self.calls += 1
        try:
            hits = await asyncio.to_thread(self.retrieve, flat, self.topk)
        except Exception as exc:  # every waiting episode sees the retriever's error
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        start = 0
        for qs, fut in batch:
            if not fut.done():
                fut.set_result(hits[start : start + len(qs)])
            start += len(qs)
