"""The retrieval service: an HTTP server speaking the Search-R1 retriever protocol.

``teamrl serve-retriever --corpus corpus.jsonl [--port 8000] [--host 127.0.0.1]`` loads (or
builds once) the BM25 index of the corpus and answers:

* ``POST /retrieve`` with ``{"queries": [str, ...], "topk": k, "return_scores": bool}``
  (``topk`` missing, null or 0 = the server's ``--topk``, at most 1000; ``return_scores``
  defaults to false). The reply is ``{"result": [per query]}``, where each query's entry is a
  list of documents ``{"id", "contents"}``, or, with ``return_scores``, a list of
  ``{"document": {"id", "contents"}, "score": float}``: the shape of Search-R1's
  ``retrieval_server.py``, so its e5/FAISS servers and this one replace each other.
* ``POST /retrieve`` with ``{"query": str, ...}`` (the single-query form that Dr. MAS and SkyRL
  send): answered exactly as ``{"queries": [str], ...}``, so ``result[0]`` is that query's list.
* ``GET /health``: ``{"status": "ok", "documents": n, "index": "bm25", "corpus_sha256": ...}``.

Every malformed request gets a 4xx reply ``{"error": message}`` naming the problem: an
unparseable request line, header or ``Content-Length`` (400, then the connection closes), a
body over 16 MiB (413), a body that is not JSON or has fields of the wrong type or a ``topk``
out of range (400), an unknown path (404) or method (405).

Replies are bounded too, each limit named in its 413 error: at most :data:`MAX_QUERIES` queries per
request, at most :data:`MAX_RESULTS` documents (queries x topk) per reply, and at most
:data:`MAX_REPLY_BYTES` of JSON (checked on the documents found, before the reply is encoded).

The app is a Starlette ASGI application served by uvicorn (its h11 protocol, a listen backlog
of 2048, idle keep-alive connections closed after 5 s), like Search-R1's FastAPI server. The
BM25 search and the encoding of its reply run in a worker thread (one call per request, all its
queries together), so the event loop keeps accepting and answering (``/health`` too) while they run. The server listens on loopback by
default; it has no authentication, so bind another address only on a trusted network.

Left out: TLS, authentication, request batching across clients.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
from typing import Any, NamedTuple

import h11
import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from uvicorn.protocols.http import h11_impl
from uvicorn.protocols.http.h11_impl import H11Protocol

from teamrl.domains.search.index import Bm25Index, Hit, load_index

__all__ = ["MAX_QUERIES", "MAX_REPLY_BYTES", "MAX_RESULTS", "Limits", "RetrievalServer", "make_app", "make_server",
           "parse_request", "response_payload", "serve"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 << 20
"""Largest request body accepted (16 MiB)."""
MAX_TOPK = 1000
"""Largest ``topk`` a request may ask for."""
MAX_QUERIES = 1024
"""Most queries in one request (Search-R1 sends one per active rollout: a few hundred)."""
MAX_RESULTS = 65_536
"""Most documents one reply may hold (queries x topk, counted before searching)."""
MAX_REPLY_BYTES = 64 << 20
"""Largest reply (64 MiB of JSON; about 65,000 wiki-18 passages of 100 words)."""
BACKLOG = 2048
"""Connections the kernel queues before the server accepts them (capped by net.core.somaxconn)."""
KEEP_ALIVE_S = 5
"""Idle keep-alive connections are closed after this many seconds (uvicorn's and Search-R1's default)."""


class Limits(NamedTuple):
    """What one ``/retrieve`` request may ask for (the module's constants by default)."""

    queries: int = MAX_QUERIES
    results: int = MAX_RESULTS
    reply_bytes: int = MAX_REPLY_BYTES


class _TooLarge(Exception):
    """A reply over :attr:`Limits.reply_bytes`."""


def check_size(queries: int, topk: int, limits: Limits) -> str | None:
    """Why a request of ``queries`` x ``topk`` is over ``limits`` (the limit named), or None.

    >>> check_size(2000, 1000, Limits())
    'a request may hold at most 1024 queries, got 2000; split it into several requests'
    >>> check_size(1000, 100, Limits()) is None, check_size(1000, 1000, Limits())[:46]
    (False, 'a reply may hold at most 65536 documents (quer')
    """
    if queries > limits.queries:
        return f"a request may hold at most {limits.queries} queries, got {queries}; split it into several requests"
    if queries * topk > limits.results:
        return (f"a reply may hold at most {limits.results} documents (queries x topk), asked for {queries} x {topk} = "
                f"{queries * topk}; ask fewer queries per request or a smaller topk")
    return None


def _answer(index: Bm25Index, queries: list[str], topk: int, scores: bool, max_bytes: int) -> bytes:
    """Search and encode the reply (in a worker thread); _TooLarge when the documents found exceed ``max_bytes``."""
    hits = index.retrieve(queries, topk)
    size = sum(len(h.doc.id) + len(h.doc.contents) + 40 for q in hits for h in q)  # <= the encoded size
    if size > max_bytes:
        raise _TooLarge(f"the reply would take over {size} bytes, more than the {max_bytes} a reply may take; "
                        "ask fewer queries per request or a smaller topk")
    body = json.dumps(response_payload(hits, scores), ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
    if len(body) > max_bytes:
        raise _TooLarge(f"the reply would take {len(body)} bytes, more than the {max_bytes} a reply may take; "
                        "ask fewer queries per request or a smaller topk")
    return body


def parse_request(body: Any, default_topk: int) -> tuple[list[str], int, bool]:
    """(queries, topk, return_scores) of a ``/retrieve`` body; ValueError says what is wrong.

    >>> parse_request({"queries": ["who"], "topk": 0}, 3)
    (['who'], 3, False)
    >>> parse_request({"query": "who", "topk": 2, "return_scores": True}, 3)
    (['who'], 2, True)
    """
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object with 'queries' (or 'query'), 'topk' and 'return_scores'")
    if "query" in body and "queries" in body:
        raise ValueError("give either 'queries' (a list of strings) or 'query' (one string), not both")
    if "query" in body:
        if not isinstance(body["query"], str):
            raise ValueError(f"'query' must be a string, got {body['query']!r:.80}")
        queries = [body["query"]]
    else:
        given = body.get("queries")
        if not isinstance(given, list) or not all(isinstance(q, str) for q in given):
            raise ValueError(f"'queries' must be a list of strings, got {given!r:.80}")
        queries = given
    topk = body.get("topk") or default_topk
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= MAX_TOPK:
        raise ValueError(f"'topk' must be a positive integer <= {MAX_TOPK}, got {topk!r:.40}")
    scores = body.get("return_scores", False)
    if not isinstance(scores, bool):
        raise ValueError(f"'return_scores' must be true or false, got {scores!r:.40}")
    return queries, topk, scores


def response_payload(hits: list[list[Hit]], return_scores: bool) -> dict[str, Any]:
    """The ``/retrieve`` reply for ``hits`` in the Search-R1 shape."""
    if return_scores:
        return {"result": [[{"document": h.doc.to_json(), "score": h.score} for h in q] for q in hits]}
    return {"result": [[h.doc.to_json() for h in q] for q in hits]}


def _error(status: int, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers or None)


async def _read_body(request: Request) -> bytes:
    """The request body, refused (HTTPException 413) past :data:`MAX_BODY_BYTES` before it is read."""
    declared = request.headers.get("content-length")  # h11 has checked that it is a number
    if declared is not None and int(declared) > MAX_BODY_BYTES:
        raise HTTPException(413, f"body of {declared} bytes is over {MAX_BODY_BYTES}; send fewer queries per request")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise HTTPException(413, f"body is over {MAX_BODY_BYTES} bytes; send fewer queries per request")
        chunks.append(chunk)
    return b"".join(chunks)


def make_app(index: Bm25Index, default_topk: int = 3, limits: Limits | None = None) -> Starlette:
    """The ASGI app answering ``POST /retrieve`` and ``GET /health`` from ``index``, within ``limits``."""
    limits = limits or Limits()

    async def retrieve(request: Request) -> Response:
        raw = await _read_body(request)
        try:
            body = json.loads(raw.decode("utf-8")) if raw.strip() else None
        except UnicodeDecodeError:
            return _error(400, "the body is not UTF-8 text; send a UTF-8 JSON object")
        except json.JSONDecodeError as exc:
            return _error(400, f"the body is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})")
        try:
            queries, topk, scores = parse_request(body, default_topk)
        except ValueError as exc:
            return _error(400, str(exc))
        too_large = check_size(len(queries), topk, limits)
        if too_large is not None:
            return _error(413, too_large)
        try:  # search and encoding are CPU-bound: off the event loop
            body = await run_in_threadpool(_answer, index, queries, topk, scores, limits.reply_bytes)
        except _TooLarge as exc:
            return _error(413, str(exc))
        except Exception as exc:  # a failing search answers 500 instead of dropping the connection
            log.exception("retrieval failed")
            return _error(500, f"retrieval failed: {type(exc).__name__}: {exc}")
        return Response(body, media_type="application/json")

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "documents": len(index), "index": "bm25",
                             "corpus_sha256": index.corpus_sha256})

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            return _error(404, f"no such path {request.url.path}; use GET /health or POST /retrieve")
        if exc.status_code == 405:
            return _error(405, f"{request.method} {request.url.path} is not served; use GET /health or "
                               "POST /retrieve", allow=exc.headers.get("Allow", "") if exc.headers else "")
        return _error(exc.status_code, str(exc.detail), connection="close")

    routes = [Route("/retrieve", retrieve, methods=["POST"]), Route("/health", health, methods=["GET"])]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})


class _Connection(h11.Connection):
    """h11's connection, remembering why it could not parse the peer's request."""

    error = ""

    def next_event(self) -> Any:
        try:
            return super().next_event()
        except h11.RemoteProtocolError as exc:
            self.error = self.error or str(exc)
            raise


class _Protocol(H11Protocol):
    """uvicorn's h11 protocol, whose 400 for an unparseable request is JSON naming the problem."""

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        limit = config.h11_max_incomplete_event_size
        default = getattr(h11_impl, "DEFAULT_MAX_INCOMPLETE_EVENT_SIZE", 16 * 1024)  # uvicorn's header size limit
        self.conn = _Connection(h11.SERVER, default if limit is None else limit)

    def send_400_response(self, msg: str) -> None:
        reason = getattr(self.conn, "error", "") or "unparseable request"
        data = json.dumps({"error": f"malformed HTTP request: {reason}; send a valid HTTP/1.1 request"}).encode()
        head = (f"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n"
                "connection: close\r\n\r\n").encode()
        self.transport.write(head + data)  # raw bytes: h11 refuses to send once the peer is in error
        self.transport.close()


def _listen(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port``.

    Made with ``proto=IPPROTO_TCP`` (``socket.create_server`` leaves it 0): asyncio turns Nagle's
    algorithm off only on such sockets, and with it on, a reply's body waits ~40 ms for the
    client's delayed ACK of its headers.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


class RetrievalServer:
    """uvicorn serving :func:`make_app` on a socket bound at construction (so a busy port fails early)."""

    def __init__(self, address: tuple[str, int], index: Bm25Index, default_topk: int,
                 keep_alive_s: float = KEEP_ALIVE_S, limits: Limits | None = None) -> None:
        host, port = address
        self.socket = _listen(host, port)
        self.index, self.default_topk = index, default_topk
        config = uvicorn.Config(make_app(index, default_topk, limits), http=_Protocol, ws="none", lifespan="off",
                                backlog=BACKLOG, timeout_keep_alive=round(keep_alive_s), log_config=None,
                                log_level="error", access_log=False)
        self._uvicorn = uvicorn.Server(config)
        self._stopped = threading.Event()

    @property
    def server_address(self) -> tuple[str, int]:
        return self.socket.getsockname()[:2]

    @property
    def url(self) -> str:
        host, port = self.server_address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def serve_forever(self) -> None:
        """Serve until :meth:`shutdown` (or SIGINT/SIGTERM when run in the main thread)."""
        self._stopped.clear()
        try:
            self._uvicorn.run(sockets=[self.socket])
        finally:
            self._stopped.set()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop serving (from another thread) and wait until :meth:`serve_forever` has returned."""
        self._uvicorn.should_exit = True
        self._stopped.wait(timeout_s)

    def server_close(self) -> None:
        self.socket.close()


def make_server(index: Bm25Index, host: str = "127.0.0.1", port: int = 0, default_topk: int = 3, *,
                keep_alive_s: float = KEEP_ALIVE_S, limits: Limits | None = None) -> RetrievalServer:
    """A server bound to ``host:port`` (port 0 = any free port); call ``serve_forever`` to run it.

    ``keep_alive_s``: idle keep-alive connections are closed after this many seconds; ``limits``: what
    one request may ask for (default :class:`Limits`).
    """
    if not 1 <= default_topk <= MAX_TOPK:
        raise ValueError(f"--topk {default_topk} must be between 1 and {MAX_TOPK}")
    try:
        return RetrievalServer((host, port), index, default_topk, keep_alive_s, limits)
    except OSError as exc:
        raise ConnectionError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); pick another --port "
                              "(0 = any free port) or stop the process using it") from None


def serve(corpus: str | os.PathLike, *, host: str = "127.0.0.1", port: int = 8000, topk: int = 3,
          index_dir: str | os.PathLike | None = None) -> None:
    """Load the corpus's index and serve it until interrupted; prints one ready line with the URL."""
    index = load_index(corpus, index_dir=index_dir)
    server = make_server(index, host, port, topk)
    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("listening on %s: the retriever has no authentication; anyone who can reach it can query it", host)
    print(f"retriever ready: {server.url} ({len(index)} documents, bm25)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        print("retriever stopped", file=sys.stderr)
