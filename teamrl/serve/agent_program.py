"""The ``agent_program`` workflow: an existing program, written against the OpenAI API, is the team.

Per episode the workflow opens a session on the process's OpenAI-compatible endpoint
(:mod:`teamrl.serve`), runs the program on the problem with that session's base URL and the run's
token, and returns its final answer for the task to score. Each HTTP call the program makes is
answered by the agent its ``model`` name maps to (``models: {planner: router, coder: solver}``)
and recorded as a Step of the episode, so the program's roles train as separate agents.

The program is either

* ``program: package.module:function``, an ``async def`` called as
  ``await function(question, base_url=..., api_key=...)`` (only the keywords it declares among
  ``base_url``, ``api_key``, ``result_url``, ``reward_url``, ``problem_id``), returning the answer; or
* ``command: [argv...]``, started once per episode with the question on stdin and in the
  environment (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``TEAMRL_QUESTION``, ``TEAMRL_PROBLEM_ID``,
  ``TEAMRL_RESULT_URL``, ``TEAMRL_REWARD_URL``); its stdout is the answer. ``{python}`` in the
  argv stands for this Python interpreter.

An answer POSTed to the result URL takes precedence over the return value or stdout. Rewards
POSTed per call (``{"id": <completion id>, "reward": x}``) become the steps' rewards (the others
get the task's reward). A program that raises, exits non-zero, spends more than ``timeout_s`` of
its own time or returns something other than a string fails its episode (kept with its steps and
error, not trained on); the run goes on. A program's own time leaves out its endpoint calls and
any time teamrl's event loop spends generating: a rollout of many episodes on a slow machine does
not time its programs out, a program that hangs is still stopped. A function runs in a context that
names its episode, so a call it makes through a client kept in process-global state (set by
another episode) is still recorded in its own episode (:mod:`teamrl.serve.caller`); such calls are
counted in ``info.misaddressed_calls`` and the ``agent_program/misaddressed_calls`` metric.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from teamrl.serve import MAX_BODY_BYTES, Session, caller, endpoint
from teamrl.tasks.base import Problem, Task
from teamrl.team.agents import AGENTS, Parsed, register_agent
from teamrl.team.registry import load_builtin_workflows, register_workflow
from teamrl.team.team import Team

KEYWORDS = ("base_url", "api_key", "result_url", "reward_url", "problem_id")
"""Keywords a program function may declare to receive."""


@dataclass(kw_only=True)
class AgentProgramConfig:
    program: str = ""
    """The program as an async Python function, 'package.module:function' (the current directory is importable). Set this or command."""
    command: list[str] = field(default_factory=list)
    """The program as a command started once per episode, e.g. ['{python}', 'examples/my_team.py'] ({python}: this interpreter). Set this or program."""
    models: dict[str, str] = field(default_factory=dict)
    """Model name the program sends -> the teamrl agent that answers it, e.g. {planner: router, coder: solver}. Each agent needs an entry under agents (names not registered by a workflow become program agents: no system prompt of their own, any reply valid)."""
    fallback_agent: str | None = None
    """Agent answering model names not in models (put it on a trainable: false model for a frozen pass-through); null: such names are an error (HTTP 404)."""
    timeout_s: float = 300.0
    """Most time the program may spend on one episode outside its endpoint calls (waiting for generation does not count); past it the episode fails (its calls so far are kept)."""
    host: str = "127.0.0.1"
    """Address the endpoint listens on. Loopback by default; anything else is reachable from other machines (requests still need the run's token)."""
    port: int = 0
    """Port of the endpoint (0: a free one)."""
    flush_window_ms: float = 50.0
    """Lockstep models: how long a batch waits for the calls of programs still running before it is generated without them (0: generate whatever is pending at once)."""
    max_body_bytes: int = MAX_BODY_BYTES
    """Largest request body the endpoint accepts (bytes; 413 past it, before the body is read whole)."""
    answer: Literal["auto", "post"] = "auto"
    """auto: the answer POSTed to the result URL, else the function's return value or the command's stdout. post: only a POSTed answer counts (a program that posts none fails)."""

    def __post_init__(self) -> None:
        if bool(self.program) == bool(self.command):
            raise ValueError("agent_program needs exactly one of program ('package.module:function') and command "
                             "(a list of arguments)")
        if self.program and (self.program.count(":") != 1 or not all(self.program.split(":"))):
            raise ValueError(f"agent_program.program {self.program!r} must look like 'package.module:function'")
        if not self.models:
            raise ValueError("agent_program.models is empty; map each model name the program sends to an agent, "
                             "e.g. {planner: router}")
        if self.timeout_s <= 0:
            raise ValueError(f"agent_program.timeout_s {self.timeout_s} must be > 0")
        if self.flush_window_ms < 0:
            raise ValueError(f"agent_program.flush_window_ms {self.flush_window_ms} must be >= 0")
        if self.max_body_bytes < 1024:
            raise ValueError(f"agent_program.max_body_bytes {self.max_body_bytes} must be >= 1024 (default "
                             f"{MAX_BODY_BYTES})")
        if not 0 <= self.port < 65536:
            raise ValueError(f"agent_program.port {self.port} must be in [0, 65535] (0: any free port)")
        load_builtin_workflows()  # a built-in agent of that name (e.g. code_team's coder) is used, not shadowed
        for name in self.agents:
            if name not in AGENTS:
                register_agent(name, system_prompt="")(_any_reply)

    @property
    def agents(self) -> list[str]:
        """The agents the program's calls reach."""
        return sorted(set(self.models.values()) | ({self.fallback_agent} if self.fallback_agent else set()))


def _any_reply(text: str) -> Parsed:
    """Parser of program agents: the program reads the reply; any reply is valid."""
    return Parsed(text, valid=True)


_FUNCTIONS: dict[str, Callable[..., Any]] = {}


def load_program(spec: str) -> Callable[..., Any]:
    """Import ``package.module:function`` (the current directory first on the path); must be ``async def``."""
    if spec not in _FUNCTIONS:
        module_name, _, attr = spec.partition(":")
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ImportError(f"agent_program.program {spec!r}: cannot import {module_name!r} ({exc}); run from the "
                              f"directory that holds it or add it to PYTHONPATH") from None
        fn = getattr(module, attr, None)
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"agent_program.program {spec!r} must name an 'async def' function in {module_name!r}")
        _FUNCTIONS[spec] = fn
    return _FUNCTIONS[spec]


async def run_function(fn: Callable[..., Any], question: str, urls: dict[str, str]) -> Any:
    """Call the program function with the question and the keywords it declares."""
    params = inspect.signature(fn).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return await fn(question, **{k: v for k, v in urls.items() if takes_all or k in params})


async def run_command(argv: list[str], question: str, urls: dict[str, str], timeout_s: float | None = None) -> str:
    """Run the program command once; returns its stdout.

    Raises on a non-zero exit or past ``timeout_s`` of wall time (None: no limit). Cancelled or
    timed out, it kills the command's whole process group.
    """
    argv = [sys.executable if a == "{python}" else a for a in argv]
    env = {**os.environ, "OPENAI_BASE_URL": urls["base_url"], "OPENAI_API_KEY": urls["api_key"],
           "TEAMRL_QUESTION": question, "TEAMRL_PROBLEM_ID": urls["problem_id"],
           "TEAMRL_RESULT_URL": urls["result_url"], "TEAMRL_REWARD_URL": urls["reward_url"]}
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True)
    try:
        out, err = await asyncio.wait_for(proc.communicate(question.encode()), timeout_s)
    except (asyncio.TimeoutError, asyncio.CancelledError):
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the program and anything it started
        except ProcessLookupError:
            pass
        await proc.wait()
        raise
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"program {shlex.join(argv)} exited with status {proc.returncode}: {' | '.join(tail)}")
    return out.decode(errors="replace").strip()


async def run_bounded(program: Any, busy_s: Callable[[], float], timeout_s: float, tick_s: float = 0.25) -> Any:
    """Await ``program``, cancelling it once it has spent ``timeout_s`` of its own time.

    Its own time is wall time less the time it waits on calls (``busy_s()``: seconds spent in calls
    so far) and less the time the event loop was held by something else (a wake-up late by more
    than ``tick_s`` counts ``tick_s``), so a slow batch of generation never times a program out.

    Args:
        program: the program's coroutine.
        busy_s: seconds the program has spent waiting on its calls so far (growing while one is in flight).
        timeout_s: the program's own-time limit.
        tick_s: how often the limit is checked.

    Returns:
        What ``program`` returns.

    Raises:
        asyncio.TimeoutError: past the limit (the program is cancelled first).
    """
    task = asyncio.ensure_future(program)
    used = 0.0
    try:
        while True:
            t0, busy0 = time.monotonic(), busy_s()
            done, _ = await asyncio.wait({task}, timeout=min(tick_s, max(timeout_s - used, 0.0)))
            if done:
                return task.result()
            used += max(0.0, min(time.monotonic() - t0, tick_s) - (busy_s() - busy0))
            if used >= timeout_s:
                raise asyncio.TimeoutError
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # a command's process group is killed


@register_workflow("agent_program", config=AgentProgramConfig, agents=())
async def agent_program(team: Team, problem: Problem, task: Task, cfg: AgentProgramConfig) -> str | None:
    """Run the configured program on ``problem`` against the endpoint; returns its answer."""
    server = endpoint(cfg.host, cfg.port, cfg.max_body_bytes)
    team.dispatcher.flush_window_s = cfg.flush_window_ms / 1000
    session = Session(team, asyncio.get_running_loop(), cfg.models, cfg.fallback_agent)
    name = server.open(session)
    team.episode.info["endpoint_episode"] = name  # names the episode in the endpoint's URLs
    urls = {"base_url": server.base_url(name), "api_key": server.token, "problem_id": problem.id,
            "result_url": f"{server.url}/episodes/{name}/result", "reward_url": f"{server.url}/episodes/{name}/reward"}
    try:
        with team.dispatcher.outside(id(session)):
            program: Any
            if cfg.program:  # runs in a context naming its episode: its calls are answered there whatever URL they use
                caller.install(server.url)
                token = caller.CALLER.set(name)
                try:
                    program = asyncio.ensure_future(run_function(load_program(cfg.program), problem.question, urls))
                finally:
                    caller.CALLER.reset(token)
            else:
                program = run_command(cfg.command, problem.question, urls)
            answer = await run_bounded(program, session.busy_s, cfg.timeout_s)
    except asyncio.TimeoutError:
        raise TimeoutError(f"the program ran past timeout_s={cfg.timeout_s:g} of its own time") from None
    finally:
        server.close(name)
        team.episode.info["calls"] = {a: sum(s.agent == a for s in team.episode.steps) for a in cfg.agents}
        if session.misaddressed:
            team.episode.info["misaddressed_calls"] = session.misaddressed
        team.episode.info["counters"] = {"agent_program/misaddressed_calls": session.misaddressed}
        team.episode.step_rewards.update(session.rewards)
    if session.result is not None:
        return session.result
    if cfg.answer == "post":
        raise ValueError("the program posted no answer to its result URL (agent_program.answer: post)")
    if not isinstance(answer, str):
        raise TypeError(f"the program returned {type(answer).__name__}, not the answer text; return a string or "
                        f"POST {{\"answer\": ...}} to the result URL")
    return answer
