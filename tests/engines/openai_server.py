"""A small OpenAI-compatible completions server for tests: a tiny model served by the hf engine.

It speaks the subset of ``POST /v1/completions`` that :class:`teamrl.engines.openai.OpenAIEngine`
sends (token-id prompts, per-request sampling, ``logprobs``, ``stop``, ``seed``, vLLM's
``return_tokens_as_token_ids``, ``echo`` with the prompt's log-probs), over a real socket on 127.0.0.1.
``fail_next`` makes the next requests answer HTTP 503 (to exercise retries).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from teamrl.engines.base import GenRequest, SamplingParams
from teamrl.engines.hf import HFEngine


class CompletionsServer:
    """Serves ``engine`` at ``self.base_url`` (``http://127.0.0.1:PORT/v1``) until :meth:`close`."""

    def __init__(self, engine: HFEngine, model_name: str = "tiny") -> None:
        self.engine, self.model_name = engine, model_name
        self.lock = threading.Lock()
        self.requests: list[dict] = []
        self.fail_next = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, answer = server.answer(self.path, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, path: str, body: dict) -> tuple[int, dict]:
        with self.lock:
            self.requests.append(body)
            if self.fail_next > 0:
                self.fail_next -= 1
                return 503, {"error": {"message": "overloaded"}}
            if path != "/v1/completions":
                return 404, {"error": {"message": f"no route {path}"}}
            if body.get("model") != self.model_name:
                return 404, {"error": {"message": f"model {body.get('model')!r} does not exist"}}
            sampling = SamplingParams(temperature=body.get("temperature", 1.0), top_p=body.get("top_p", 1.0),
                                      top_k=body.get("top_k", 0), max_new_tokens=body.get("max_tokens", 16),
                                      stop=tuple(body.get("stop") or ()), ignore_eos=body.get("ignore_eos", False))
            if "seed" in body:
                self.engine.generator.manual_seed(int(body["seed"]))
            out = self.engine.generate([GenRequest(list(body["prompt"]), sampling)])[0]
            echoed = self._prompt_logprobs(list(body["prompt"])) if body.get("echo") else None
        tok = self.engine.tokenizer
        ids = (list(body["prompt"]) if echoed is not None else []) + list(out.response_ids)
        tokens = ([f"token_id:{t}" for t in ids] if body.get("return_tokens_as_token_ids")
                  else [tok.decode([t]) for t in ids])
        values = (echoed or []) + list(out.logprobs)
        choice = {"index": 0, "text": out.text, "finish_reason": out.finish_reason,
                  "logprobs": {"tokens": tokens, "token_logprobs": values} if body.get("logprobs") is not None
                  and body.get("logprobs") is not False else None}
        return 200, {"id": "cmpl-test", "object": "text_completion", "model": self.model_name, "choices": [choice]}

    def _prompt_logprobs(self, ids: list[int]) -> list[float | None]:
        """``echo``: the served model's log-prob of each prompt token given the ones before it (None for the first),
        from one forward of its weights, as vLLM computes prompt log-probs."""
        import torch

        model = self.engine.model
        with torch.no_grad():
            logp = model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)
        return [None] + [float(logp[t - 1, ids[t]]) for t in range(1, len(ids))]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
