"""Helpers shared by the search tests: a small corpus and a real retrieval server process."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PASSAGES: list[tuple[str, str]] = [
    ("Paris", "Paris is the capital and most populous city of France."),
    ("Berlin", "Berlin is the capital and largest city of Germany."),
    ("Rome", "Rome is the capital city of Italy and of the Lazio region."),
    ("Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris, completed in 1889."),
    ("Danube", "The Danube is the second-longest river in Europe, flowing through Vienna and Budapest."),
    ("Mount Everest", "Mount Everest is Earth's highest mountain above sea level, in the Himalayas."),
    ("Ada Lovelace", "Ada Lovelace was an English mathematician who wrote the first computer program."),
    ("Python (programming language)", "Python is a programming language created by Guido van Rossum."),
    ("Kilimanjaro", "Mount Kilimanjaro is a dormant volcano in Tanzania, the highest mountain in Africa."),
    ("Amazon River", "The Amazon River in South America is the largest river by discharge of water."),
    ("Marie Curie", "Marie Curie was a physicist and chemist who won two Nobel Prizes."),
    ("Great Wall of China", "The Great Wall of China is a series of fortifications across northern China."),
]


def write_corpus(path: Path, passages: list[tuple[str, str]] = PASSAGES) -> Path:
    """A wiki-18-format corpus of ``passages`` (ids "0", "1", ...)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for i, (title, text) in enumerate(passages):
            f.write(json.dumps({"id": str(i), "contents": f'"{title}"\n{text}'}) + "\n")
    return path


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    url: str

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@contextmanager
def retriever_process(corpus: Path, index_dir: Path, timeout_s: float = 60.0) -> Iterator[ServerProcess]:
    """``python -m teamrl.cli serve-retriever`` on a free loopback port; killed on exit."""
    cmd = [sys.executable, "-m", "teamrl.cli", "serve-retriever", "--corpus", str(corpus), "--port", "0",
           "--host", "127.0.0.1", "--index-dir", str(index_dir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    seen, url, deadline = [], None, time.monotonic() + timeout_s
    while url is None and time.monotonic() < deadline and proc.poll() is None:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            continue
        seen.append(line)
        match = re.search(r"retriever ready: (http://\S+)", line)
        url = match.group(1) if match else None
    server = ServerProcess(proc, url or "")
    try:
        if url is None:
            raise RuntimeError(f"the retriever did not start: {''.join(seen)}")
        yield server
    finally:
        server.kill()
