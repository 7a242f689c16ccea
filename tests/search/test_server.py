"""The retrieval service over real HTTP on loopback: protocol shape, equality with the in-process
index, errors, retries, and a service that goes away."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from teamrl.domains.search.client import HttpRetriever, RetrieverUnavailableError, parse_response
from teamrl.domains.search.index import Bm25Index, Doc, Hit, load_index
from teamrl.domains.search.server import make_server, parse_request
from tests.conftest import HANG_S
from tests.search.helpers import PASSAGES, retriever_process, write_corpus

QUERIES = ["capital of France", "highest mountain", "who wrote the first computer program", "river in Europe",
           "zzzz nothing matches", ""]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl")


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("indexes")


@pytest.fixture(scope="module")
def server(corpus, index_dir):
    with retriever_process(corpus, index_dir) as srv:
        yield srv


def _post(url: str, body: object) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_health(server):
    with urllib.request.urlopen(f"{server.url}/health", timeout=10) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "ok" and body["documents"] == len(PASSAGES) and body["index"] == "bm25"
    assert HttpRetriever(server.url).health()["corpus_sha256"] == body["corpus_sha256"]


def test_response_shapes_follow_search_r1(server):
    status, with_scores = _post(f"{server.url}/retrieve",
                                {"queries": ["capital of France", "Danube"], "topk": 2, "return_scores": True})
    assert status == 200 and list(with_scores) == ["result"] and len(with_scores["result"]) == 2
    first = with_scores["result"][0][0]
    assert set(first) == {"document", "score"} and set(first["document"]) == {"id", "contents"}
    paris = '"Paris"\nParis is the capital and most populous city of France.'
    assert first["document"] == {"id": "0", "contents": paris}
    assert isinstance(first["score"], float) and first["score"] > with_scores["result"][0][1]["score"]
    status, plain = _post(f"{server.url}/retrieve", {"queries": ["capital of France"], "topk": 2})
    assert plain == {"result": [[s["document"] for s in with_scores["result"][0]]]}  # return_scores defaults to false
    status, default_k = _post(f"{server.url}/retrieve", {"queries": ["capital"]})  # topk missing: the server's 3
    assert status == 200 and len(default_k["result"][0]) == 3


def test_http_results_equal_in_process_index(server, corpus, index_dir):
    over_http = HttpRetriever(server.url).retrieve(QUERIES, 4)
    in_process = load_index(corpus, index_dir=index_dir).retrieve(QUERIES, 4)
    assert over_http == in_process
    assert over_http[0][0].doc.title == "Paris" and over_http[2][0].doc.title == "Ada Lovelace"
    assert len(HttpRetriever(server.url + "/retrieve").retrieve(["Rome"], 100)[0]) == len(PASSAGES)


@pytest.mark.parametrize("body,message", [
    ({"queries": "capital"}, "'queries' must be a list of strings"),
    ({"queries": ["a"], "topk": -1}, "'topk' must be a positive integer"),
    ({"queries": ["a"], "return_scores": "yes"}, "'return_scores' must be true or false"),
    ([1, 2], "must be a JSON object"),
])
def test_bad_requests_get_400_with_the_reason(server, body, message):
    status, reply = _post(f"{server.url}/retrieve", body)
    assert status == 400 and message in reply["error"]


def test_client_raises_value_error_on_4xx_without_retrying(server):
    client = HttpRetriever(server.url, retries=3, backoff_s=3 * HANG_S)  # a retry would break the guard below
    start = time.monotonic()
    with pytest.raises(ValueError, match="rejected the request .HTTP 400"):
        client.retrieve(["a"], -1)
    assert time.monotonic() - start < HANG_S  # no retry: its wait alone is 3 x HANG_S


def test_unknown_path_is_404(server):
    status, reply = _post(f"{server.url}/search", {"queries": ["a"]})
    assert status == 404 and "POST /retrieve" in reply["error"]


def test_concurrent_clients_get_consistent_answers(server):
    client = HttpRetriever(server.url)
    expected = client.retrieve(QUERIES, 3)
    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(client.retrieve(QUERIES, 3))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert results == [expected] * 4


def test_killed_service_gives_a_clear_error_after_bounded_retries(corpus, index_dir):
    with retriever_process(corpus, index_dir) as srv:
        client = HttpRetriever(srv.url, timeout_s=2.0, retries=2, backoff_s=0.05)
        assert client.retrieve(["Paris"], 1)[0][0].doc.title == "Paris"
        srv.kill()
        start = time.monotonic()
        with pytest.raises(RetrieverUnavailableError) as err:
            client.retrieve(["Paris"], 1)
        elapsed = time.monotonic() - start
    msg = str(err.value)
    assert f"{srv.url}/retrieve" in msg and "after 3 attempt(s)" in msg and "teamrl serve-retriever" in msg
    assert isinstance(err.value, ConnectionError)
    assert 0.15 <= elapsed < HANG_S  # waited 0.05 + 0.1 between the 3 attempts (the message counts them), then gave up


# ------------------------------------------------------------------ in-thread servers (fast protocol checks)


class _FlakyIndex:
    """Fails the first ``failures`` searches, then answers like ``index``."""

    def __init__(self, index: Bm25Index, failures: int) -> None:
        self.index, self.failures, self.calls = index, failures, 0
        self.corpus_sha256, self.docs = "", index.docs

    def __len__(self) -> int:
        return len(self.index)

    def retrieve(self, queries, topk):
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError("disk hiccup")
        return self.index.retrieve(queries, topk)


@pytest.fixture()
def thread_server():
    started = []

    def start(index):
        srv = make_server(index, "127.0.0.1", 0, 3)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.shutdown()
        srv.server_close()


def test_server_errors_are_500_and_retried(thread_server):
    index = Bm25Index.build([Doc(str(i), f'"{t}"\n{x}') for i, (t, x) in enumerate(PASSAGES)])
    flaky = _FlakyIndex(index, failures=2)
    srv = thread_server(flaky)
    hits = HttpRetriever(srv.url, retries=2, backoff_s=0.01).retrieve(["Berlin"], 1)
    assert hits[0][0].doc.title == "Berlin" and flaky.calls == 3
    flaky.calls = 0
    with pytest.raises(RetrieverUnavailableError, match="HTTP 500.*disk hiccup"):
        HttpRetriever(srv.url, retries=1, backoff_s=0.01).retrieve(["Berlin"], 1)


def test_busy_port_is_a_connection_error(thread_server):
    index = Bm25Index.build([Doc("0", '"A"\nalpha')])
    srv = thread_server(index)
    with pytest.raises(ConnectionError, match="cannot listen on 127.0.0.1"):
        make_server(index, "127.0.0.1", srv.server_address[1])


def test_client_rejects_non_http_urls():
    with pytest.raises(ValueError, match="not an http"):
        HttpRetriever("127.0.0.1:8000")


def test_parse_request_and_response_helpers():
    assert parse_request({"queries": ["q"], "topk": None, "return_scores": True}, 5) == (["q"], 5, True)
    plain = {"result": [[{"id": "3", "contents": '"T"\ntext'}], []]}
    assert parse_response(plain, 2) == [[Hit(Doc("3", '"T"\ntext'), 0.0)], []]
    # Pyserini-style documents (title/text, no id) from other servers of the protocol are accepted
    other = {"result": [[{"document": {"title": "T", "text": "body", "contents": '"T"\nbody'}, "score": 1.5}]]}
    assert parse_response(other, 1)[0][0] == Hit(Doc("", '"T"\nbody'), 1.5)
    with pytest.raises(ValueError, match="expected .* 2 entries"):
        parse_response({"result": [[]]}, 2)


def test_cli_reports_a_missing_corpus(tmp_path, capsys):
    from teamrl.cli import main

    assert main(["serve-retriever", "--corpus", str(tmp_path / "none.jsonl"), "--port", "0"]) == 2
    assert "none.jsonl does not exist" in capsys.readouterr().err


# ------------------------------------------------------------------ malformed requests and load


def _raw(url: str, request: bytes, timeout_s: float = 5.0) -> tuple[int, dict]:
    """Send raw bytes on a new connection; (status, JSON body) of the reply (a hang fails on the timeout)."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout_s) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


@pytest.mark.parametrize("length,body,message", [
    (b"abc", b"{}", "bad Content-Length"),
    (b"-1", b"{}", "bad Content-Length"),
    (b"9", b"{queries:", "not valid JSON"),
    (b"3", b"\xff\xfe\xfd", "not UTF-8"),
    (b"99999999999", b"", "is over 16777216"),
])
def test_malformed_http_gets_a_json_4xx_not_a_traceback_or_a_hang(server, length, body, message):
    status, reply = _raw(server.url, b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: " + length
                         + b"\r\n\r\n" + body)
    assert status in (400, 413) and message in reply["error"]
    assert HttpRetriever(server.url).retrieve(["Paris"], 1)[0][0].doc.title == "Paris"  # still serving


@pytest.mark.parametrize("body,message", [
    ({"queries": ["a"], "topk": 1001}, "'topk' must be a positive integer <= 1000"),
    ({"queries": ["a"], "topk": "3"}, "'topk' must be a positive integer"),
    ({"query": ["a"]}, "'query' must be a string"),
    ({"query": "a", "queries": ["b"]}, "not both"),
])
def test_wrong_types_and_ranges_are_400(server, body, message):
    status, reply = _post(f"{server.url}/retrieve", body)
    assert status == 400 and message in reply["error"]


def test_single_query_form_is_answered_like_a_one_query_list(server):
    status, single = _post(f"{server.url}/retrieve", {"query": "capital of France", "topk": 2, "return_scores": True})
    _, listed = _post(f"{server.url}/retrieve", {"queries": ["capital of France"], "topk": 2, "return_scores": True})
    assert status == 200 and single == listed and len(single["result"]) == 1
    assert single["result"][0][0]["document"]["contents"].startswith('"Paris"')


def test_wrong_method_is_a_json_405(server):
    req = urllib.request.Request(f"{server.url}/retrieve", method="GET")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 405 and "POST /retrieve" in json.loads(err.value.read())["error"]


@pytest.mark.slow  # 500 connections at once (about 5 s)
def test_500_concurrent_connections_some_malformed_get_no_resets_and_right_answers(server, corpus, index_dir):
    import asyncio

    from teamrl.domains.search.loadtest import run_load

    index = load_index(corpus, index_dir=index_dir)
    questions = [q for q in QUERIES if q]
    expected = {q: [h.doc.id for h in hits] for q, hits in zip(questions, index.retrieve(questions, 3))}
    result = asyncio.run(run_load(server.url, expected, requests=600, concurrency=500, malformed_every=6,
                                  timeout_s=15.0, deadline_s=25.0))
    assert result.requests == 600, result.line("load")  # all sent before the deadline
    assert (result.resets, result.errors) == (0, 0), result.first_errors
    assert (result.answered, result.rejected) == (500, 100)
