"""The OpenAI-compatible endpoint: HTTP calls of outside programs become recorded ``team.ask`` calls.

One :class:`Endpoint` runs per training process (Starlette on uvicorn, in a thread of its own),
bound to 127.0.0.1 unless asked otherwise, and refuses every request without the run's bearer token
(a random one per process). Each episode of the ``agent_program`` workflow opens a
:class:`Session`; its URL names it::

    http://127.0.0.1:PORT/episodes/<episode>/v1/chat/completions   (and /v1/responses, /v1/completions, /v1/models)
    POST http://127.0.0.1:PORT/episodes/<episode>/result   {"answer": "..."}
    POST http://127.0.0.1:PORT/episodes/<episode>/reward   {"id": "<completion id>", "reward": 1.0}

(or ``/v1/...`` with an ``X-Teamrl-Episode: <episode>`` header). A request's ``model`` names the
agent through the session's map; its call runs as ``team.ask`` (chat) or ``team.complete`` (text)
on the episode's own event loop, so it is batched by the dispatcher with every other pending call
of that model and recorded as a Step of that episode; concurrent episodes never mix.

Streaming answers in OpenAI's server-sent-event chunks once the reply is generated (the engine
returns whole replies), one chunk per token. Every refused request is a 4xx in OpenAI's error
shape: the token is checked before the body is read, the body is read up to ``max_body_bytes``
(413 past it) and parsed with a nesting limit (:mod:`teamrl.serve.guard`). A call made by one
episode's program to another episode's URL is answered in the caller's episode
(:mod:`teamrl.serve.caller`).
"""

from __future__ import annotations

import hmac
import ipaddress
import itertools
import logging
import secrets
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from teamrl.serve import guard
from teamrl.serve import openai_api as api
from teamrl.serve import responses_api as rapi
from teamrl.serve.caller import CALLER_HEADER
from teamrl.serve.openai_api import ApiError
from teamrl.serve.session import Session
from teamrl.team.context import ContextLengthError
from teamrl.team.team import Reply

log = logging.getLogger(__name__)

EPISODE_HEADER = "x-teamrl-episode"


class Endpoint:
    """The server and its open sessions.

    Args:
        host: address to listen on; loopback by default (anything else is reachable from other machines).
        port: port to listen on (0: a free one, see :attr:`port` after :meth:`start`).
        token: the bearer token requests must carry (None: a random one).
        max_body_bytes: largest request body accepted (413 past it).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 max_body_bytes: int = guard.MAX_BODY_BYTES) -> None:
        self.host, self.port, self.max_body_bytes = host, port, max_body_bytes
        self.token = token or secrets.token_urlsafe(24)
        self.sessions: dict[str, Session] = {}
        self._ids = itertools.count()
        self._warned: set[tuple[str, str]] = set()
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def base_url(self, episode: str) -> str:
        """The OpenAI base URL of an open session (what the program's client gets)."""
        return f"{self.url}/episodes/{episode}/v1"

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> Endpoint:
        """Bind and serve in a daemon thread; returns once the server accepts connections."""
        import uvicorn

        if not _loopback(self.host):
            log.warning("the agent endpoint listens on %s, reachable from other machines; every request still "
                        "needs the run's token", self.host)
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise OSError(f"the agent endpoint cannot listen on {self.host}:{self.port}: {exc.strerror}; "
                          f"pick another workflow.agent_program.port (0: any free one)") from None
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app(), log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True,
                                        name="teamrl-endpoint")
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the agent endpoint did not start on {self.url}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop serving (open sessions get no more answers)."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def open(self, session: Session) -> str:
        """Register a session; returns its episode name (unguessable, used in its URLs)."""
        name = f"{next(self._ids)}-{secrets.token_hex(6)}"
        session.name = name
        self.sessions[name] = session
        return name

    def close(self, episode: str) -> None:
        """Forget a session: later requests naming it get 404."""
        self.sessions.pop(episode, None)

    # ---- HTTP -----------------------------------------------------------------------------

    def app(self) -> Any:
        """The Starlette application."""
        from starlette.applications import Starlette
        from starlette.routing import Route

        routes = []
        for prefix in ("/episodes/{episode}/v1", "/v1"):
            routes += [Route(f"{prefix}/chat/completions", self._wrap(self._chat), methods=["POST"]),
                       Route(f"{prefix}/completions", self._wrap(self._completion), methods=["POST"]),
                       Route(f"{prefix}/responses", self._wrap(self._responses), methods=["POST"]),
                       Route(f"{prefix}/models", self._wrap(self._models), methods=["GET"])]
        routes += [Route("/health", _health, methods=["GET"]),
                   Route("/episodes/{episode}/result", self._wrap(self._result), methods=["POST"]),
                   Route("/episodes/{episode}/reward", self._wrap(self._reward), methods=["POST"])]
        return Starlette(routes=routes)

    def _wrap(self, handler: Callable[[Any, Session], Awaitable[Any]]) -> Callable[[Any], Awaitable[Any]]:
        from starlette.responses import JSONResponse

        async def endpoint(request: Any) -> Any:
            try:
                self._authorize(request)
                return await handler(request, self._session(request))
            except ApiError as exc:
                return JSONResponse(exc.body(), status_code=exc.status)
            except ContextLengthError as exc:  # as OpenAI answers a prompt over the model's context length
                err = ApiError(400, str(exc), code="context_length_exceeded", param="messages")
                return JSONResponse(err.body(), status_code=400)
            except Exception as exc:  # an engine error: the program sees a 500, the run goes on
                log.warning("agent endpoint: %s failed: %s: %s", request.url.path, type(exc).__name__, exc)
                err = ApiError(500, f"{type(exc).__name__}: {exc}", kind="server_error")
                return JSONResponse(err.body(), status_code=500)

        return endpoint

    def _authorize(self, request: Any) -> None:
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.token.encode()):
            raise ApiError(401, "missing or wrong API key: send the run's token as 'Authorization: Bearer <token>' "
                           "(the OPENAI_API_KEY the program was given)", kind="authentication_error",
                           code="invalid_api_key")

    def _session(self, request: Any) -> Session:
        episode = request.path_params.get("episode") or request.headers.get(EPISODE_HEADER)
        caller = request.headers.get(CALLER_HEADER)
        if caller and caller != episode:  # a program's call to another episode's URL belongs to its own episode
            if caller not in self.sessions:
                raise ApiError(404, f"episode {caller!r} is over or unknown", code="episode_not_found")
            session = self.sessions[caller]
            session.misaddressed += 1
            if session.misaddressed == 1:
                log.warning("agent endpoint: episode %s's program called episode %s's URL (a client kept in "
                            "process-global state?); its calls are recorded in its own episode", caller, episode)
            return session
        if not episode:
            raise ApiError(400, f"no episode named: use the base URL the program was given (.../episodes/<episode>/v1) "
                           f"or send an '{EPISODE_HEADER}' header")
        if episode not in self.sessions:
            raise ApiError(404, f"episode {episode!r} is over or unknown", code="episode_not_found")
        return self.sessions[episode]

    async def _json(self, request: Any) -> Any:
        body = await guard.read_body(request.stream(), request.headers.get("content-length"), self.max_body_bytes)
        return guard.parse_json(body)

    def _warn_sampling(self, agent: str, session: Session, body: dict[str, Any]) -> None:
        s = session.team.bindings[agent].sampling
        for diff in api.sampling_differences(body, {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k}):
            if (agent, diff) not in self._warned:
                self._warned.add((agent, diff))
                log.warning("agent %r: the client asked for %s; the config's sampling settings are used, so the "
                            "recorded log-probs are the ones trained (warned once)", agent, diff)

    async def _chat(self, request: Any, session: Session) -> Any:
        body = await self._json(request)
        args = api.call_args(body)
        messages, tools = api.chat_args(body)
        agent = session.agent(args.model)
        self._warn_sampling(agent, session, body)
        reply, step = await session.call(lambda: session.team.ask(
            agent, messages, tools=tools, stop=args.stop, max_new_tokens=args.max_tokens, trim_stop=True))
        rid = self._record(session, reply, "chatcmpl")
        tok = session.team.dispatcher.tokenizer(step.model)
        if args.stream:
            text = reply.content if reply.content is not None else reply.text
            pieces = api.text_pieces(tok, step.response_ids, text) if not reply.tool_calls else [text]
            return _stream(api.chat_chunks(rid, args.model, reply, pieces, include_usage=args.include_usage))
        tokens = [tok.decode([t]) for t in step.response_ids] if args.logprobs else None
        return _json(api.chat_response(rid, args.model, reply, prompt_ids=step.prompt_ids,
                                       response_ids=step.response_ids, tokens=tokens,
                                       logprobs=step.logprobs if args.logprobs else None))

    async def _completion(self, request: Any, session: Session) -> Any:
        body = await self._json(request)
        args = api.call_args(body)
        if args.logprobs:
            raise ApiError(400, "logprobs is not supported on /v1/completions; use /v1/chat/completions", param="logprobs")
        agent = session.agent(args.model)
        self._warn_sampling(agent, session, body)
        tok = session.team.dispatcher.tokenizer(session.team.bindings[agent].model)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = list(tok(prompt)["input_ids"])
        elif isinstance(prompt, list) and prompt and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
            ids = prompt
            bad = [i for i in ids if not 0 <= i < len(tok)]
            if bad:
                raise ApiError(400, f"prompt token id {bad[0]} is outside the vocabulary [0, {len(tok)})", param="prompt")
        else:
            raise ApiError(400, "'prompt' must be one string or one list of token ids (send several prompts as "
                           "several calls)", param="prompt")
        reply, step = await session.call(lambda: session.team.complete(agent, ids, stop=args.stop,
                                                                       max_new_tokens=args.max_tokens, trim_stop=True))
        rid = self._record(session, reply, "cmpl")
        if args.stream:
            pieces = api.text_pieces(tok, step.response_ids, reply.text)
            return _stream(api.completion_chunks(rid, args.model, reply, pieces, include_usage=args.include_usage))
        return _json(api.completion_response(rid, args.model, reply, prompt_ids=step.prompt_ids,
                                             response_ids=step.response_ids))

    async def _responses(self, request: Any, session: Session) -> Any:
        body = await self._json(request)
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        args = api.call_args({k: body.get(k) for k in ("model", "stream") if k in body})
        messages, tools, limit = rapi.responses_args(body)
        agent = session.agent(args.model)
        self._warn_sampling(agent, session, body)
        reply, step = await session.call(lambda: session.team.ask(agent, messages, tools=tools, max_new_tokens=limit))
        rid = self._record(session, reply, "resp")
        final = rapi.response_body(rid, args.model, reply, body,
                                   api.extra(reply, step.prompt_ids, step.response_ids))
        if not args.stream:
            return _json(final)
        text = reply.content if reply.content is not None else reply.text
        tok = session.team.dispatcher.tokenizer(step.model)
        pieces = api.text_pieces(tok, step.response_ids, text) if not reply.tool_calls else [text]
        return _stream(rapi.response_events(final, pieces))

    async def _models(self, request: Any, session: Session) -> Any:
        return _json({"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "teamrl"}
                                                 for m in sorted(session.models)]})

    async def _result(self, request: Any, session: Session) -> Any:
        body = await self._json(request)
        answer = body.get("answer") if isinstance(body, dict) else None
        if not isinstance(answer, str):
            raise ApiError(400, "the result must be {\"answer\": \"<the final answer text>\"}", param="answer")
        session.result = answer
        return _json({"ok": True})

    async def _reward(self, request: Any, session: Session) -> Any:
        body = await self._json(request)
        if not isinstance(body, dict) or not isinstance(body.get("id"), str) or body["id"] not in session.ids:
            raise ApiError(400, f"a reward is {{\"id\": \"<completion id>\", \"reward\": <number>}} for a call of this "
                           f"episode; known ids: {', '.join(session.ids) or 'none yet'}", param="id")
        session.rewards[session.ids[body["id"]]] = guard.check_reward(body.get("reward"))
        return _json({"ok": True})

    def _record(self, session: Session, reply: Reply, kind: str) -> str:
        rid = f"{kind}-{session.name}-{reply.step}"
        session.ids[rid] = reply.step
        return rid


async def _health(request: Any) -> Any:
    """``GET /health``: 200 while the server answers (no token needed; it says nothing about the run)."""
    return _json({"ok": True})


def _json(obj: Any) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse(obj)


def _stream(events: Any) -> Any:
    from starlette.responses import StreamingResponse

    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address or ``localhost``.

    >>> _loopback("127.0.0.1"), _loopback("::1"), _loopback("localhost"), _loopback("0.0.0.0")
    (True, True, True, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
