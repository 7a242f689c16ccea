"""A headless Chromium from the system packages, driven over the DevTools protocol on a pipe.

``--remote-debugging-pipe`` makes Chromium read NUL-terminated JSON commands on fd 3 and write
replies and events on fd 4, so no port is opened and no client package is needed.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """The first Chromium-family browser on PATH, or None."""
    return next((p for p in map(shutil.which, BINARIES) if p), None)


class Chromium:
    """One headless browser; :meth:`open` loads a page and reports its errors."""

    def __init__(self, binary: str, timeout_s: float = 60.0) -> None:
        self.timeout_s, self.next_id, self.buffer, self.events = timeout_s, 0, b"", []
        self.profile = tempfile.mkdtemp(prefix="teamrl-chromium-")
        to_browser, self.write_fd = map(_above_4, os.pipe())
        self.read_fd, from_browser = map(_above_4, os.pipe())

        def fds() -> None:  # the child's fd 3 reads our commands, fd 4 writes its replies
            os.dup2(to_browser, 3)
            os.dup2(from_browser, 4)

        self.proc = subprocess.Popen(
            [binary, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-extensions", "--hide-scrollbars", f"--user-data-dir={self.profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=False, preexec_fn=fds)
        os.close(to_browser)
        os.close(from_browser)

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict[str, Any]:
        """Send one command and wait for its reply (events that arrive meanwhile go to ``events``)."""
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.write_fd, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def wait_event(self, method: str) -> dict[str, Any]:
        """Wait for the next event ``method`` (one already received counts)."""
        while True:
            for i, ev in enumerate(self.events):
                if ev.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._read())

    def _read(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        while b"\0" not in self.buffer:
            ready, _, _ = select.select([self.read_fd], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(self.read_fd, 1 << 20) if ready else b""
            if not chunk:
                raise TimeoutError(f"chromium sent nothing for {self.timeout_s:.0f} s (or exited)")
            self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(raw)

    def open(self, page: Path, width: int = 1200) -> dict[str, Any]:
        """Load ``page``; return its console errors, exceptions, failed loads, images and a full-page PNG."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        s = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=s)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": 800, "deviceScaleFactor": 1, "mobile": False}, session=s)
        self.send("Page.navigate", {"url": page.resolve().as_uri()}, session=s)
        self.wait_event("Page.loadEventFired")
        images = self.send("Runtime.evaluate", {"returnByValue": True, "expression":
                           "Array.from(document.images).map(i => [i.getAttribute('src'), i.complete, i.naturalWidth])"},
                           session=s)["result"]["value"]
        text = self.send("Runtime.evaluate", {"expression": "document.body.innerText", "returnByValue": True},
                         session=s)["result"]["value"]
        png = base64.b64decode(self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                                         session=s)["data"])
        errors = [_describe(ev) for ev in self.events if _is_error(ev)]
        return {"errors": errors, "images": images, "text": text, "png": png}

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        for fd in (self.read_fd, self.write_fd):
            os.close(fd)
        shutil.rmtree(self.profile, ignore_errors=True)


def _above_4(fd: int) -> int:
    """``fd`` moved to a number above 4, so that placing the child's fds 3 and 4 never overwrites it."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


def _is_error(ev: dict[str, Any]) -> bool:
    m, p = ev.get("method"), ev.get("params", {})
    return (m == "Runtime.exceptionThrown" or (m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"))
            or (m == "Log.entryAdded" and p["entry"]["level"] == "error") or m == "Network.loadingFailed")


def _describe(ev: dict[str, Any]) -> str:
    p = ev["params"]
    if ev["method"] == "Log.entryAdded":
        return f"{p['entry']['source']}: {p['entry']['text']} {p['entry'].get('url', '')}".strip()
    if ev["method"] == "Network.loadingFailed":
        return f"load failed: {p.get('errorText')}"
    return json.dumps(p)[:300]
