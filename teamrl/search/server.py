"""The retrieval service: an HTTP server speaking the Search-R1 retriever protocol.

``teamrl serve-retriever --corpus corpus.jsonl [--port 8000] [--host 127.0.0.1]`` loads (or
builds once) the BM25 index of the corpus and answers:

* ``POST /retrieve`` with ``{"queries": [str, ...], "topk": k, "return_scores": bool}``
  (``topk`` missing, null or 0 = the server's ``--topk``; ``return_scores`` defaults to false).
  The reply is ``{"result": [per query]}``, where each query's entry is a list of documents
  ``{"id", "contents"}``, or, with ``return_scores``, a list of
  ``{"document": {"id", "contents"}, "score": float}``: the shape of Search-R1's
  ``retrieval_server.py``, so its e5/FAISS servers and this one replace each other.
* ``GET /health``: ``{"status": "ok", "documents": n, "index": "bm25", "corpus_sha256": ...}``.

Malformed requests get HTTP 400 with ``{"error": message}``. The server listens on loopback by
default; it has no authentication, so bind another address only on a trusted network. It uses
the standard library's ``ThreadingHTTPServer`` with HTTP/1.1 keep-alive.

Left out: TLS, authentication, request batching across clients.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from teamrl.search.index import Bm25Index, Hit, load_index

__all__ = ["RetrievalServer", "make_server", "parse_request", "response_payload", "serve"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 << 20
"""Largest request body accepted (16 MiB)."""


def parse_request(body: Any, default_topk: int) -> tuple[list[str], int, bool]:
    """(queries, topk, return_scores) of a ``/retrieve`` body; ValueError says what is wrong.

    >>> parse_request({"queries": ["who"], "topk": 0}, 3)
    (['who'], 3, False)
    """
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object with 'queries', 'topk' and 'return_scores'")
    queries = body.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise ValueError(f"'queries' must be a list of strings, got {queries!r:.80}")
    topk = body.get("topk") or default_topk
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise ValueError(f"'topk' must be a positive integer, got {topk!r}")
    scores = body.get("return_scores", False)
    if not isinstance(scores, bool):
        raise ValueError(f"'return_scores' must be true or false, got {scores!r}")
    return queries, topk, scores


def response_payload(hits: list[list[Hit]], return_scores: bool) -> dict[str, Any]:
    """The ``/retrieve`` reply for ``hits`` in the Search-R1 shape."""
    if return_scores:
        return {"result": [[{"document": h.doc.to_json(), "score": h.score} for h in q] for q in hits]}
    return {"result": [[h.doc.to_json() for h in q] for q in hits]}


class RetrievalServer(ThreadingHTTPServer):
    """A threading HTTP server holding one index."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], index: Bm25Index, default_topk: int) -> None:
        super().__init__(address, _Handler)
        self.index = index
        self.default_topk = default_topk

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # small replies leave at once instead of waiting for a delayed ACK
    wbufsize = -1  # headers and body go out in one write (flushed after each request)
    server: RetrievalServer

    def _send(self, status: HTTPStatus, payload: dict[str, Any]) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path.split("?", 1)[0] != "/health":
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no such path {self.path}; use GET /health or POST /retrieve"})
            return
        index = self.server.index
        self._send(HTTPStatus.OK, {"status": "ok", "documents": len(index), "index": "bm25",
                                   "corpus_sha256": index.corpus_sha256})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                       {"error": f"body of {length} bytes is over {MAX_BODY_BYTES}; send fewer queries per request"})
            return
        raw = self.rfile.read(length)
        if self.path.split("?", 1)[0] != "/retrieve":
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no such path {self.path}; use POST /retrieve"})
            return
        try:
            queries, topk, scores = parse_request(json.loads(raw or b"null"), self.server.default_topk)
        except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
            self._send(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
            return
        try:
            hits = self.server.index.retrieve(queries, topk)
        except Exception as exc:  # a failing search answers 500 instead of dropping the connection
            log.exception("retrieval failed")
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"retrieval failed: {exc}"})
            return
        self._send(HTTPStatus.OK, response_payload(hits, scores))

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
        log.debug("%s " + format, self.address_string(), *args)


def make_server(index: Bm25Index, host: str = "127.0.0.1", port: int = 0, default_topk: int = 3) -> RetrievalServer:
    """A server bound to ``host:port`` (port 0 = any free port); call ``serve_forever`` to run it."""
    if default_topk < 1:
        raise ValueError(f"--topk {default_topk} must be >= 1")
    try:
        return RetrievalServer((host, port), index, default_topk)
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
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        print("retriever stopped", file=sys.stderr)
    finally:
        server.server_close()
