"""Retrieval latency and throughput: the BM25 index in-process vs the HTTP service on loopback.

Builds the HotpotQA distractor corpus (10,787 passages) from the shared data unless --corpus is
given, starts ``teamrl serve-retriever`` as a separate process on a free loopback port, and
sends the HotpotQA test questions (one query per call, topk 3 by default) from a few client
threads, first to the in-process index and then over HTTP. Prints latency percentiles and
queries per second for both, and a last line::

    RESULT name=retriever qps_http=... qps_inproc=... p50_ms=... ratio=...

where p50_ms is the median latency of one query over HTTP and ratio = qps_http / qps_inproc.

    python benchmarks/retriever.py [--threads 4] [--queries 500] [--topk 3] [--corpus FILE]

``--load`` instead runs the service under load (:mod:`teamrl.domains.search.loadtest`): ``--concurrency``
connections at once on 127.0.0.1, ``--requests`` in all, every ``--malformed-every``-th one
malformed (bad or negative Content-Length, not JSON, wrong type, topk out of range; each must get
its 4xx JSON error), the others checked against the in-process index's documents. It stops after
``--requests`` requests or ``--deadline`` seconds and prints::

    RESULT name=retriever_load requests=... concurrency=... resets=... errors=... answered=... rejected=...
    p50_ms=... p99_ms=... throughput=...

(exit status 1 when any connection was reset or any answer was wrong). Then two large requests, each while
``/health`` is polled every 50 ms: the largest reply the service allows (``--big-queries`` queries x topk 1000,
about 45 MB of JSON by default) and an oversized one (2,000 queries x topk 1000, over the caps), printed as::

    big: status 200, 2.1 s, /health worst 35 ms; oversized: status 413, 20 ms, /health worst 3 ms

    python benchmarks/retriever.py --load [--requests 5000] [--concurrency 500] [--malformed-every 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from teamrl.domains.search.client import HttpRetriever  # noqa: E402
from teamrl.domains.search.corpus import build_corpus  # noqa: E402
from teamrl.domains.search.index import load_index  # noqa: E402
from teamrl.domains.search.loadtest import run_load as run_service_load  # noqa: E402
from teamrl.domains.search.qa import load_qa  # noqa: E402

HOTPOT = ("train.jsonl", "dev.jsonl", "test.jsonl")


def shared_data() -> Path:
    """``$TEAMRL_DATA`` or ``../shared/data`` beside the repository (the tests' rule)."""
    return Path(os.environ.get("TEAMRL_DATA", REPO.parent / "shared" / "data"))


def run_load(search: Callable[[str], object], queries: list[str], threads: int) -> tuple[float, list[float]]:
    """Send every query once from ``threads`` threads; returns (queries per second, latencies in s)."""
    latencies: list[float] = []
    lock = threading.Lock()
    chunks = [queries[i::threads] for i in range(threads)]

    def worker(chunk: list[str]) -> None:
        mine = []
        for q in chunk:
            t0 = time.perf_counter()
            search(q)
            mine.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(mine)

    pool = [threading.Thread(target=worker, args=(c,)) for c in chunks]
    start = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return len(queries) / (time.perf_counter() - start), latencies


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def start_server(corpus: Path, index_dir: Path | None, timeout_s: float = 120.0) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "teamrl.cli", "serve-retriever", "--corpus", str(corpus), "--host", "127.0.0.1",
           "--port", "0"] + (["--index-dir", str(index_dir)] if index_dir else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO)
    deadline = time.monotonic() + timeout_s
    for line in proc.stdout:
        match = re.search(r"retriever ready: (http://\S+)", line)
        if match:
            return proc, match.group(1)
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise SystemExit("the retrieval service did not start")


def report(label: str, qps: float, lat: list[float]) -> None:
    print(f"{label:<10} {qps:9.1f} q/s   p50 {1000 * percentile(lat, 50):7.2f} ms   "
          f"p95 {1000 * percentile(lat, 95):7.2f} ms   ({len(lat)} queries)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path,
                    help="wiki-18 JSONL corpus (default: built from the HotpotQA distractor files)")
    ap.add_argument("--queries", type=int, default=500, help="questions sent per mode (default 500)")
    ap.add_argument("--threads", type=int, default=4, help="concurrent client threads (default 4)")
    ap.add_argument("--topk", type=int, default=3, help="documents per query (default 3)")
    ap.add_argument("--index-dir", type=Path, default=None,
                    help="folder of built indexes (default $TEAMRL_CACHE/retriever)")
    ap.add_argument("--load", action="store_true", help="load-test the service instead (see the module docstring)")
    ap.add_argument("--requests", type=int, default=5000, help="--load: requests in all (default 5000)")
    ap.add_argument("--concurrency", type=int, default=500, help="--load: connections at once (default 500)")
    ap.add_argument("--malformed-every", type=int, default=10, help="--load: every n-th request is malformed "
                    "(default 10; 0 = none)")
    ap.add_argument("--deadline", type=float, default=300.0, help="--load: stop sending after this many seconds "
                    "(default 300)")
    ap.add_argument("--big-queries", type=int, default=65, help="--load: queries of the large request sent after "
                    "the load, at topk 1000 (default 65: the most the service's 65,536-document cap allows)")
    ap.add_argument("--no-oversized", dest="oversized", action="store_false",
                    help="--load: skip the oversized request (2,000 x topk 1000; a service without caps builds a "
                         "reply of over 600 MB for it)")
    args = ap.parse_args()

    data = shared_data() / "hotpotqa_distractor_rpt"
    if not (data / "test.jsonl").is_file():
        raise SystemExit(f"HotpotQA distractor files not found in {data}; set TEAMRL_DATA to the shared data folder")
    queries = [it.question for it in load_qa(data / "test.jsonl")][: args.queries]
    with tempfile.TemporaryDirectory() as tmp:
        corpus = args.corpus
        if corpus is None:
            corpus = Path(tmp) / "hotpot_corpus.jsonl"
            n = build_corpus([data / f for f in HOTPOT], corpus)
            print(f"corpus: {n} passages from {data}")
        t0 = time.perf_counter()
        index = load_index(corpus, index_dir=args.index_dir)
        print(f"index: {len(index)} documents ready in {time.perf_counter() - t0:.1f}s")
        if args.load:
            return load_mode(args, corpus, index, queries)
        for q in queries[:20]:  # warm-up
            index.retrieve([q], args.topk)
        qps_in, lat_in = run_load(lambda q: index.retrieve([q], args.topk), queries, args.threads)

        proc, url = start_server(corpus, args.index_dir)
        try:
            client = HttpRetriever(url, timeout_s=30.0)
            same = client.retrieve(queries[:20], args.topk) == index.retrieve(queries[:20], args.topk)
            qps_http, lat_http = run_load(lambda q: client.retrieve([q], args.topk), queries, args.threads)
        finally:
            proc.kill()
            proc.wait()
    print(f"{len(queries)} queries, topk {args.topk}, {args.threads} client threads; HTTP results equal "
          f"in-process: {same}")
    report("in-process", qps_in, lat_in)
    report("http", qps_http, lat_http)
    print(json.dumps({"qps_http": qps_http, "qps_inproc": qps_in, "p50_ms_http": 1000 * percentile(lat_http, 50),
                      "p95_ms_http": 1000 * percentile(lat_http, 95), "p50_ms_inproc": 1000 * percentile(lat_in, 50),
                      "p95_ms_inproc": 1000 * percentile(lat_in, 95)}))
    print(f"RESULT name=retriever qps_http={qps_http:.1f} qps_inproc={qps_in:.1f} "
          f"p50_ms={1000 * percentile(lat_http, 50):.2f} ratio={qps_http / qps_in:.3f}")
    return 0 if same else 1


def probe(url: str, queries: list[str], n: int, topk: int) -> tuple[int, float, float]:
    """POST ``n`` queries x ``topk`` while polling /health; (status, seconds, worst /health seconds)."""
    body = json.dumps({"queries": [queries[i % len(queries)] for i in range(n)], "topk": topk}).encode()
    waits: list[float] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            with urllib.request.urlopen(f"{url}/health", timeout=300) as resp:
                resp.read()
            waits.append(time.perf_counter() - t0)
            stop.wait(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    t0 = time.perf_counter()
    req = urllib.request.Request(f"{url}/retrieve", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            resp.read()
            status = resp.status
    except urllib.error.HTTPError as err:
        err.read()
        status = err.code
    except OSError:
        status = 0  # the connection was dropped
    elapsed = time.perf_counter() - t0
    stop.set()
    poller.join()
    return status, elapsed, max(waits, default=0.0)


def load_mode(args: argparse.Namespace, corpus: Path, index, queries: list[str]) -> int:
    """Run the service under ``args.concurrency`` concurrent connections; 0 when nothing was reset or wrong."""
    expected = {q: [h.doc.id for h in hits] for q, hits in zip(queries, index.retrieve(queries, args.topk))}
    proc, url = start_server(corpus, args.index_dir)
    try:
        result = asyncio.run(run_service_load(url, expected, requests=args.requests, concurrency=args.concurrency,
                                              malformed_every=args.malformed_every, topk=args.topk,
                                              deadline_s=args.deadline))
        big = probe(url, queries, args.big_queries, 1000)
        oversized = probe(url, queries, 2000, 1000) if args.oversized else None
    finally:
        proc.kill()
        proc.wait()
    print(f"{result.requests} requests ({len(expected)} distinct questions, every {args.malformed_every}th "
          f"malformed), {result.concurrency} concurrent connections on {url}, {result.wall_s:.1f}s")
    print(f"answered {result.answered}, rejected (4xx as expected) {result.rejected}, resets {result.resets}, "
          f"errors {result.errors}; p50 {result.percentile_ms(50):.1f} ms, p99 {result.percentile_ms(99):.1f} ms, "
          f"{result.throughput:.1f} replies/s")
    for problem in result.first_errors:
        print(f"  {problem}")
    print(f"big ({args.big_queries} x 1000): status {big[0]}, {big[1]:.2f} s, /health worst {1000 * big[2]:.0f} ms"
          + (f"; oversized (2000 x 1000): status {oversized[0]}, {1000 * oversized[1]:.0f} ms, /health worst "
             f"{1000 * oversized[2]:.0f} ms" if oversized else ""))
    print(result.line("retriever_load") + f" big_status={big[0]} big_s={big[1]:.2f} big_health_ms={1000 * big[2]:.0f}"
          + (f" oversized_status={oversized[0]} oversized_ms={1000 * oversized[1]:.0f}" if oversized else ""))
    return 0 if result.resets == result.errors == 0 and result.requests == args.requests else 1


if __name__ == "__main__":
    sys.exit(main())
