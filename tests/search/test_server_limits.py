"""The retrieval service's bounds: queries per request, documents and bytes per reply (each limit named in the
413 error), search and encoding off the event loop (``/health`` answers meanwhile), and a JSON error for a
reply that cannot be built."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from teamrl.domains.search.index import Bm25Index, Doc, Hit
from teamrl.domains.search.server import MAX_QUERIES, MAX_RESULTS, Limits, make_server
from tests.conftest import HANG_S
from tests.search.helpers import PASSAGES


def _index() -> Bm25Index:
    return Bm25Index.build([Doc(str(i), f'"{t}"\n{x}') for i, (t, x) in enumerate(PASSAGES)])


@pytest.fixture()
def serve():
    started = []

    def start(index, limits: Limits | None = None):
        srv = make_server(index, "127.0.0.1", 0, 3, limits=limits)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.shutdown()
        srv.server_close()


def _post(url: str, body: object, timeout: float = 30) -> tuple[int, dict, str]:
    req = urllib.request.Request(f"{url}/retrieve", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read()), resp.headers.get("content-type", "")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), err.headers.get("content-type", "")


def test_too_many_queries_or_documents_are_refused_naming_the_limit(serve) -> None:
    srv = serve(_index())
    status, body, _ = _post(srv.url, {"queries": ["capital"] * 2000, "topk": 1000})  # the 14 KB request
    assert status == 413 and body["error"].startswith(f"a request may hold at most {MAX_QUERIES} queries, got 2000")
    status, body, _ = _post(srv.url, {"queries": ["capital"] * 1000, "topk": 100})
    assert status == 413 and f"at most {MAX_RESULTS} documents" in body["error"] and "1000 x 100 = 100000" in body["error"]
    status, body, _ = _post(srv.url, {"queries": ["capital"] * MAX_QUERIES, "topk": MAX_RESULTS // MAX_QUERIES})
    assert status == 200 and len(body["result"]) == MAX_QUERIES  # exactly at both limits: answered


def test_a_reply_over_the_byte_limit_is_refused_naming_it(serve) -> None:
    srv = serve(_index(), Limits(reply_bytes=300))
    status, body, _ = _post(srv.url, {"query": "capital", "topk": 1})
    assert status == 200 and body["result"][0][0]["contents"].startswith('"')
    status, body, ctype = _post(srv.url, {"query": "capital", "topk": 10})
    assert status == 413 and "more than the 300 a reply may take" in body["error"] and ctype == "application/json"


_ENCODING, _RELEASE = threading.Event(), threading.Event()


class _BlockedDoc(Doc):
    """A document whose JSON form is built only once ``_RELEASE`` is set (a stand-in for a very large reply);
    ``_ENCODING`` says the reply is being built."""

    __slots__ = ()

    def to_json(self) -> dict[str, str]:
        _ENCODING.set()
        _RELEASE.wait(HANG_S)
        return super().to_json()


class _ReplyIndex:
    """Answers every query with ``docs`` (and raises ``error`` while building the reply, if given)."""

    corpus_sha256 = ""

    def __init__(self, docs: list[Doc]) -> None:
        self.docs = docs

    def __len__(self) -> int:
        return len(self.docs)

    def retrieve(self, queries: list[str], topk: int) -> list[list[Hit]]:
        return [[Hit(d, 1.0) for d in self.docs[:topk]] for _ in queries]


def test_health_answers_while_a_reply_is_encoded(serve) -> None:
    _ENCODING.clear()
    _RELEASE.clear()
    srv = serve(_ReplyIndex([_BlockedDoc(str(i), f'"T{i}"\ntext') for i in range(5)]))
    done: list[float] = []
    worker = threading.Thread(target=lambda: done.append(_post(srv.url, {"query": "q", "topk": 5})[0]))
    worker.start()
    try:
        assert _ENCODING.wait(HANG_S)  # the reply is being built now, and stays so until released
        # the old code encoded on the event loop: /health would wait for the release, which comes only after it
        with urllib.request.urlopen(f"{srv.url}/health", timeout=HANG_S) as resp:
            assert json.loads(resp.read())["status"] == "ok"
        assert not _RELEASE.is_set()
    finally:
        _RELEASE.set()
        worker.join(HANG_S)
    assert done == [200]


class _HugeDoc(Doc):
    __slots__ = ()

    def to_json(self) -> dict[str, str]:
        raise MemoryError


def test_a_reply_that_cannot_be_built_is_a_json_500(serve) -> None:
    srv = serve(_ReplyIndex([_HugeDoc("0", '"A"\nalpha')]))
    status, body, ctype = _post(srv.url, {"query": "q", "topk": 1})  # the old code answered plain text
    assert status == 500 and body["error"].startswith("retrieval failed: MemoryError") and ctype == "application/json"
