"""``openai`` engine: generation through any OpenAI-compatible server (vLLM serve, SGLang, ...).

Rollout-only: the weights live in the server, so a model with this engine is frozen
(``models.<name>.trainable: false``). Use it for fixed agents (an opponent, a tool-calling helper)
and for evaluation against a served checkpoint.

Each call is one ``POST {base_url}/completions`` with the prompt as **token ids** (the chat
template is applied locally with the model's tokenizer, exactly as for the other engines, so a
Step's ``prompt_ids`` are what the server saw), the call's own sampling (``temperature``,
``top_p``, ``top_k``, ``max_tokens``, ``stop``, ``ignore_eos``, a ``seed`` drawn from the engine's
generator) and ``logprobs: 1``. Calls of one batch are sent concurrently (``concurrency``) and the
server batches them.

Response token ids, two ways (``token_ids``):

* ``server`` (default, exact): the request sets vLLM's ``return_tokens_as_token_ids``, so every
  entry of ``logprobs.tokens`` reads ``token_id:N``; those N are the response ids and
  ``logprobs.token_logprobs`` their log-probs. A server that ignores the flag is reported with
  the fix (``token_ids: retokenize``).
* ``retokenize``: the reply text is tokenized locally. The server's log-probs are kept when the
  token counts agree, else they are NaN (the steps of a frozen model are never trained on).

The server's log-probs are whatever it computes (vLLM: of the raw logits unless it runs with
``--logprobs-mode processed_logprobs``); nothing here depends on them.

Failures: connection errors, timeouts, HTTP 429 and 5xx are retried ``retries`` times with
exponential back-off; the final error names the URL and the last cause. Other HTTP errors (a
wrong model name, a bad request) fail at once with the server's message.

Only the standard library is used (``urllib``); no client package is needed.
"""

from __future__ import annotations

import json
import math
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from teamrl.engines.base import GenOutput, GenRequest

_RETRY_STATUS = {408, 429, 500, 502, 503, 504}


class OpenAIEngineError(RuntimeError):
    """A request to the OpenAI-compatible server failed (after its retries)."""


class OpenAIEngine:
    """Generates by calling an OpenAI-compatible ``/v1/completions`` endpoint.

    Args:
        base_url: e.g. ``http://localhost:8000/v1`` (``/completions`` is appended).
        model: the served model's name (the request's ``model``).
        tokenizer: the model's tokenizer (chat template, stop tokens, retokenizing).
        api_key: sent as ``Authorization: Bearer ...`` when not None.
        timeout_s, retries, concurrency: see ``teamrl.config.schema.OpenAIEngineConfig``.
        token_ids: ``server`` or ``retokenize`` (module docstring).
        seed: seed of the generator that draws each request's ``seed``.
    """

    def __init__(self, base_url: str, model: str, tokenizer: Any, *, api_key: str | None = None,
                 timeout_s: float = 120.0, retries: int = 3, concurrency: int = 32,
                 token_ids: str = "server", seed: int = 0) -> None:
        if token_ids not in ("server", "retokenize"):
            raise ValueError(f"token_ids {token_ids!r} must be 'server' or 'retokenize'")
        self.url = base_url.rstrip("/") + "/completions"
        self.model_name = model
        self.tokenizer = tokenizer
        self.api_key = api_key
        self.timeout_s, self.retries, self.concurrency = timeout_s, retries, concurrency
        self.token_ids = token_ids
        self.generator = torch.Generator(device="cpu").manual_seed(seed)

    def sync_weights(self) -> None:
        """Nothing to do: the server's weights are not trained."""

    def release_memory(self) -> None:
        """Nothing to free here: the server manages its own memory."""

    def reset(self) -> None:
        """Nothing to drop: :meth:`generate` returns only when every request of its batch has an answer."""

    def generate(self, requests: list[GenRequest], on_progress: Callable[[int], None] | None = None) -> list[GenOutput]:
        """One HTTP request per call, ``concurrency`` at a time; outputs in request order."""
        for r in requests:
            if r.adapter is not None:
                raise ValueError(f"engine openai has no LoRA adapters (request for adapter {r.adapter!r}); "
                                 f"serve the adapter as its own model and point a model entry at it")
        seeds = torch.randint(0, 2**31 - 1, (len(requests),), generator=self.generator).tolist()
        bodies = [self._body(r, s) for r, s in zip(requests, seeds)]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, max(1, len(bodies)))) as pool:
            outs = []
            for out in pool.map(self._complete, bodies):
                outs.append(out)
                if on_progress is not None:
                    on_progress(1)
        return outs

    def score_tokens(self, rows: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        """The served model's log-probs of each ``(prompt_ids, response_ids)`` row's response tokens (a distillation
        teacher behind the server): one ``/completions`` request per row with the whole sequence as the prompt,
        ``echo: true``, ``logprobs: 0`` and ``max_tokens: 1``, whose ``logprobs.token_logprobs`` are the prompt's
        (the first None) then the one generated token's; ``concurrency`` at a time.

        Raises:
            OpenAIEngineError: the server returned no prompt log-probs, or (``token_ids: server``) the echoed tokens
                are not the row's.
        """
        with ThreadPoolExecutor(max_workers=min(self.concurrency, max(1, len(rows)))) as pool:
            return list(pool.map(self._score_row, rows))

    def _score_row(self, row: tuple[list[int], list[int]]) -> list[float]:
        prompt, response = row
        body: dict[str, Any] = {"model": self.model_name, "prompt": list(prompt) + list(response), "max_tokens": 1,
                                "echo": True, "logprobs": 0, "temperature": 1.0}
        if self.token_ids == "server":
            body["return_tokens_as_token_ids"] = True
        lp = self._post(body)["choices"][0].get("logprobs") or {}
        values, tokens = lp.get("token_logprobs") or [], lp.get("tokens") or []
        span = slice(len(prompt), len(prompt) + len(response))
        got = values[span]
        if len(got) != len(response) or any(v is None for v in got):
            raise OpenAIEngineError(f"{self.url} returned no log-probs of the prompt's tokens (echo with logprobs); "
                                    f"a teacher behind a server needs one that echoes them (vLLM serve does)")
        if self.token_ids == "server" and [_token_id(t, self.url) for t in tokens[span]] != list(response):
            raise OpenAIEngineError(f"{self.url} echoed other tokens than the reply's: the server's tokenizer is not "
                                    f"the student's")
        return [float(v) for v in got]

    def _body(self, r: GenRequest, seed: int) -> dict[str, Any]:
        s = r.sampling
        body: dict[str, Any] = {
            "model": self.model_name, "prompt": list(r.prompt_ids), "max_tokens": s.max_new_tokens,
            "temperature": s.temperature, "top_p": s.top_p, "logprobs": 1, "seed": seed, "n": 1,
            "skip_special_tokens": True,
        }
        if s.top_k > 0:
            body["top_k"] = s.top_k
        if s.stop:
            body["stop"] = list(s.stop)
        if s.ignore_eos:
            body["ignore_eos"] = True
        if self.token_ids == "server":
            body["return_tokens_as_token_ids"] = True
        return body

    def _complete(self, body: dict[str, Any]) -> GenOutput:
        choice = self._post(body)["choices"][0]
        text = choice.get("text", "")
        lp = choice.get("logprobs") or {}
        tokens, values = lp.get("tokens") or [], lp.get("token_logprobs") or []
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        if self.token_ids == "server":
            ids = [_token_id(t, self.url) for t in tokens]
            return GenOutput(ids, [float(v) for v in values], text, finish)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        logprobs = [float(v) for v in values] if len(values) == len(ids) else [math.nan] * len(ids)
        return GenOutput(ids, logprobs, text, finish)

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(8.0, 0.25 * 2 ** (attempt - 1)))
            req = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return json.loads(resp.read())
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode(errors="replace")[:500]
                if exc.code not in _RETRY_STATUS:
                    raise OpenAIEngineError(f"{self.url} answered HTTP {exc.code}: {detail}") from exc
                last = f"HTTP {exc.code}: {detail}"
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                last = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
        raise OpenAIEngineError(f"{self.url} failed after {self.retries + 1} attempts (timeout {self.timeout_s} s "
                                f"each); last error: {last}. Check that the server is up and models.<name>.openai.base_url")


def _token_id(token: str, url: str) -> int:
    """``'token_id:42'`` → 42 (vLLM's ``return_tokens_as_token_ids`` format)."""
    if not token.startswith("token_id:"):
        raise OpenAIEngineError(f"{url} returned token {token!r} instead of 'token_id:N': the server ignores "
                                f"return_tokens_as_token_ids (a non-vLLM server?); set models.<name>.openai.token_ids: "
                                f"retokenize")
    return int(token.split(":", 1)[1])


def api_key_from_env(var: str) -> str | None:
    """The API key in environment variable ``var`` (None when unset or empty)."""
    return os.environ.get(var) or None
