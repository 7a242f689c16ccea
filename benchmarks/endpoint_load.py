"""The agent-program endpoint under load, with its limits on: many concurrent programs, some requests malformed.

Runs the ``agent_program`` workflow on ``--concurrency`` episodes at once over a real
SmolLM2-135M-Instruct (one ``HFEngine``, lockstep scheduler, the default 50 ms flush window).
Each episode's program sends ``--requests-each`` requests in turn on fresh loopback connections
(raw HTTP/1.1, ``Connection: close``): well-formed calls alternate between
``/v1/chat/completions`` and ``/v1/responses`` (at most ``--max-tokens`` new tokens) and must get
200; every ``--malformed-every``-th request is broken in one of the ways of :data:`MALFORMED`
and must get its 4xx in OpenAI's error shape. Meanwhile a thread polls ``GET /health`` every
50 ms. The run is bounded (``concurrency x requests-each`` requests, ``--deadline`` seconds).
Prints requests/s, status counts, latency percentiles of both kinds, the health route's latency
idle and under load, and::

    RESULT name=endpoint_load requests=... concurrency=... errors=... answered=... rejected=... p50_ms=...
    p99_ms=... throughput=... health_p99_ms=... health_max_ms=... ratio=...

``ratio``: the health route's p99 latency under load / its median idle (how much the load slows
the server's own answers). Exit status 1 when a request got an unexpected status or no reply.

    python benchmarks/endpoint_load.py [--concurrency 32] [--requests-each 20] [--malformed-every 4]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from teamrl.domains.math.arith import ArithConfig, ArithTask  # noqa: E402
from teamrl.engines.base import SamplingParams  # noqa: E402
from teamrl.engines.hf import HFEngine  # noqa: E402
from teamrl.models import load_model_and_tokenizer  # noqa: E402
from teamrl.serve import endpoint  # noqa: E402
from teamrl.serve.agent_program import AgentProgramConfig  # noqa: E402
from teamrl.team.agents import get_agent  # noqa: E402
from teamrl.team.team import AgentBinding, Dispatcher  # noqa: E402
from teamrl.team.workflows import get_workflow  # noqa: E402
from teamrl.train.rollout import Rollout  # noqa: E402

CHAT = {"model": "planner", "messages": [{"role": "user", "content": "What is 2 + 3?"}]}
MALFORMED: list[tuple[str, str, object, int]] = [  # (what, route, body: dict, bytes or None = head only, status)
    ("content: 5", "chat/completions", {**CHAT, "messages": [{"role": "user", "content": 5}]}, 400),
    ("stop: 5", "chat/completions", {**CHAT, "stop": 5}, 400),
    ("stream_options as a list", "chat/completions", {**CHAT, "stream_options": ["include_usage"]}, 400),
    ("100,000-deep JSON", "chat/completions", b"[" * 100_000 + b"]" * 100_000, 400),
    ("1 GB Content-Length", "chat/completions", None, 413),
    ("no token", "chat/completions", CHAT, 401),
    ("token id out of range", "completions", {"model": "planner", "prompt": [10**9]}, 400),
    ("NaN reward", "reward", b'{"id": "x", "reward": NaN}', 400),
    ("response_format json_schema", "chat/completions",
     {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}}}, 400),
    ("image part", "responses", {"model": "planner", "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "data:,"}]}]}, 400),
]
STATS: dict[str, list] = collections.defaultdict(list)
"""'good'/'bad' -> latencies (s); 'problems' -> what went wrong; 'status' -> every status seen."""


def request_bytes(path: str, body: object, token: str | None, announce: int | None = None) -> bytes:
    data = body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\n"
            f"{auth}Content-Length: {announce if announce is not None else len(data)}\r\n\r\n")
    return head.encode() + data


async def exchange(host: str, port: int, request: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 60)
    try:
        writer.write(request)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 600)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


async def hammer(question: str, base_url: str, api_key: str, reward_url: str) -> str:
    """One episode's program: its share of the load, recorded in STATS."""
    host, port = base_url.split("//")[1].split("/")[0].rsplit(":", 1)
    prefix = "/" + base_url.split("//")[1].split("/", 1)[1]
    args = ARGS
    for i in range(args.requests_each):
        if time.perf_counter() > STOP_AT:
            break
        if args.malformed_every and i % args.malformed_every == args.malformed_every - 1:
            what, route, body, want = MALFORMED[(sum(map(ord, question)) + i // args.malformed_every) % len(MALFORMED)]
            path = urlsplit(reward_url).path if route == "reward" else f"{prefix}/{route}"
            request = request_bytes(path, body, None if want == 401 else api_key, 10**9 if body is None else None)
            kind = "bad"
        else:
            what, want, kind = ("chat", 200, "good") if i % 2 == 0 else ("responses", 200, "good")
            body = ({**CHAT, "max_tokens": args.max_tokens} if what == "chat" else
                    {"model": "planner", "input": "What is 2 + 3?", "max_output_tokens": args.max_tokens})
            request = request_bytes(f"{prefix}/{what if what == 'responses' else 'chat/completions'}", body, api_key)
        t0 = time.perf_counter()
        try:
            status, reply = await exchange(host, int(port), request)
        except (OSError, asyncio.TimeoutError, ValueError, IndexError) as exc:
            STATS["problems"].append(f"{what}: {type(exc).__name__}: {exc}")
            continue
        STATS[kind].append(time.perf_counter() - t0)
        STATS["status"].append(status)
        shape_ok = status == 200 or set(json.loads(reply).get("error", {})) == {"message", "type", "param", "code"}
        if status != want or not shape_ok:
            STATS["problems"].append(f"{what}: HTTP {status} instead of {want}: {reply[:120]!r}")
    return "done"


def poll_health(url: str, stop: threading.Event, out: list[float]) -> None:
    host, port = url.split("//")[1].rsplit(":", 1)
    while not stop.is_set():
        t0 = time.perf_counter()
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            reply = b"".join(iter(lambda: sock.recv(65536), b""))
        if not reply.startswith(b"HTTP/1.1 200"):
            STATS["problems"].append(f"health: {reply[:60]!r}")
        out.append(time.perf_counter() - t0)
        stop.wait(0.05)


def ms(values: list[float], q: int) -> float:
    if len(values) < 2:
        return 1000 * values[0] if values else float("nan")
    return 1000 * statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def main() -> int:
    global ARGS, STOP_AT
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=32, help="episodes (programs) at once")
    ap.add_argument("--requests-each", type=int, default=20, help="requests per program")
    ap.add_argument("--malformed-every", type=int, default=4, help="every n-th request is malformed (0: none)")
    ap.add_argument("--max-tokens", type=int, default=4, help="new tokens per well-formed call")
    ap.add_argument("--deadline", type=float, default=300.0, help="stop sending after this many seconds")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ARGS = ap.parse_args()
    torch.set_num_threads(ARGS.threads)
    model, tok = load_model_and_tokenizer("default")
    server = endpoint()  # 127.0.0.1, a free port
    idle: list[float] = []
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    poll_health(server.url, stop, idle)
    cfg = AgentProgramConfig(program="__main__:hammer", models={"planner": "planner"}, timeout_s=3600)
    binding = AgentBinding(get_agent("planner"), "m", SamplingParams(0.7, max_new_tokens=ARGS.max_tokens), "")
    rollout = Rollout(Dispatcher({"m": HFEngine(model, tok, seed=0)}), {"planner": binding},
                      get_workflow("agent_program"), cfg, ArithTask(ArithConfig()))
    problems = rollout.task.problems("test")[:ARGS.concurrency]
    busy: list[float] = []
    stop = threading.Event()
    poller = threading.Thread(target=poll_health, args=(server.url, stop, busy), daemon=True)
    STOP_AT = time.perf_counter() + ARGS.deadline
    t0 = time.perf_counter()
    poller.start()
    episodes = rollout.collect(problems, 1, progress=False)
    wall = time.perf_counter() - t0
    stop.set()
    poller.join()
    good, bad, problems_seen = STATS["good"], STATS["bad"], STATS["problems"]
    sent = len(good) + len(bad) + sum(not p.startswith("health") and "HTTP" not in p for p in problems_seen)
    errors = len(problems_seen)
    counts = collections.Counter(STATS["status"])
    steps = sum(len(ep.steps) for ep in episodes)
    print(f"{sent} requests from {ARGS.concurrency} concurrent programs ({ARGS.requests_each} each, every "
          f"{ARGS.malformed_every}th malformed) in {wall:.1f} s: {sent / wall:.1f} requests/s; "
          f"{steps} calls recorded, {sum(ep.error is not None for ep in episodes)} failed episodes")
    print(f"statuses {dict(sorted(counts.items()))}; well-formed p50 {ms(good, 50):.0f} ms p99 {ms(good, 99):.0f} ms; "
          f"malformed p50 {ms(bad, 50):.1f} ms p99 {ms(bad, 99):.1f} ms")
    print(f"/health: idle p50 {ms(idle, 50):.2f} ms; under load p50 {ms(busy, 50):.2f} ms p99 {ms(busy, 99):.2f} ms "
          f"max {1000 * max(busy):.1f} ms over {len(busy)} polls")
    for p in problems_seen[:5]:
        print(f"  {p}")
    print(f"RESULT name=endpoint_load requests={sent} concurrency={ARGS.concurrency} errors={errors} "
          f"answered={sum(s == 200 for s in STATS['status'])} rejected={sum(400 <= s < 500 for s in STATS['status'])} "
          f"p50_ms={ms(good + bad, 50):.1f} p99_ms={ms(good + bad, 99):.1f} throughput={sent / wall:.1f} "
          f"health_p99_ms={ms(busy, 99):.1f} health_max_ms={1000 * max(busy):.1f} "
          f"ratio={ms(busy, 99) / ms(idle, 50):.2f}")
    return 1 if errors else 0


ARGS: argparse.Namespace
STOP_AT = 0.0

if __name__ == "__main__":
    sys.exit(main())
