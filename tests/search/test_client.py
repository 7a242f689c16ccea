"""The HTTP client against real servers that close idle keep-alive connections: a closed pooled
connection is replaced without costing a retry, and "start the service" is said only when nothing
accepts connections."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from teamrl.domains.search.client import HttpRetriever, RetrieverUnavailableError
from teamrl.domains.search.index import Bm25Index, Doc
from teamrl.domains.search.server import make_server
from tests.conftest import HANG_S
from tests.search.helpers import PASSAGES

BACKOFF_S = 3 * HANG_S  # any retry's wait would break the hang guard: elapsed < HANG_S shows that none was slept


@pytest.fixture(scope="module")
def index() -> Bm25Index:
    return Bm25Index.build([Doc(str(i), f'"{t}"\n{x}') for i, (t, x) in enumerate(PASSAGES)])


def test_a_connection_the_server_closed_when_idle_is_replaced_without_a_retry(index):
    srv = make_server(index, keep_alive_s=0.2)  # closes idle connections after 0.2 s (Search-R1's: 5 s)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        client = HttpRetriever(srv.url, retries=0, backoff_s=BACKOFF_S)
        for _ in range(3):
            assert client.retrieve(["Paris"], 1)[0][0].doc.title == "Paris"
            time.sleep(0.6)  # the server has closed the pooled connection by now
            start = time.monotonic()
            assert client.retrieve(["Berlin"], 1)[0][0].doc.title == "Berlin"  # retries=0: no second chance
            assert time.monotonic() - start < HANG_S  # and no backoff wait (one would take BACKOFF_S)
        client.close()
    finally:
        srv.shutdown()
        srv.server_close()


_REPLY = json.dumps({"result": [[{"id": "0", "contents": '"A"\nalpha'}]]}).encode()


def _read_request(conn: socket.socket) -> bool:
    """Read one HTTP request (headers and Content-Length body); False at EOF."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return False
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lengths = [int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")]
    length = lengths[0] if lengths else 0
    while len(body) < length:
        body += conn.recv(65536)
    return True


def _raw_server(answered_per_connection: int) -> Iterator[str]:
    """A loopback server answering the first ``answered_per_connection`` requests of each connection,
    then closing it when the next request arrives, without a reply (a keep-alive close crossing a request)."""
    sock = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def handle(conn: socket.socket) -> None:
        with conn:
            for _ in range(answered_per_connection):
                if not _read_request(conn):
                    return
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(_REPLY), _REPLY))
            _read_request(conn)  # then close without answering

    def accept() -> None:
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        acceptor.join(timeout=5)
        sock.close()


@pytest.fixture()
def raw_server() -> Iterator[Callable[[int], str]]:
    gens = []

    def start(answered: int) -> str:
        gens.append(_raw_server(answered))
        return next(gens[-1])

    yield start
    for g in gens:
        g.close()


def test_a_close_crossing_the_request_is_sent_again_for_free(raw_server):
    client = HttpRetriever(raw_server(1), retries=0, backoff_s=BACKOFF_S)
    start = time.monotonic()
    for _ in range(3):  # each second request meets the closing connection and goes again on a new one
        assert client.retrieve(["alpha"], 1)[0][0].doc.title == "A"
    assert client.reconnects == 2 and time.monotonic() - start < HANG_S  # no backoff (BACKOFF_S) was slept


def test_a_server_that_accepts_but_never_answers_is_not_told_to_start(raw_server):
    client = HttpRetriever(raw_server(0), retries=1, backoff_s=0.01)
    with pytest.raises(RetrieverUnavailableError) as err:
        client.retrieve(["alpha"], 1)
    msg = str(err.value)
    assert "accepts connections but did not answer" in msg and "teamrl serve-retriever" not in msg


def test_a_refused_connection_says_to_start_the_service():
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port = sock.getsockname()[1]  # free now, and nothing listens once it is closed
    with pytest.raises(RetrieverUnavailableError, match=r"nothing accepts connections there: start it with `teamrl "
                                                          r"serve-retriever"):
        HttpRetriever(f"http://127.0.0.1:{port}", retries=1, backoff_s=0.01).retrieve(["alpha"], 1)
