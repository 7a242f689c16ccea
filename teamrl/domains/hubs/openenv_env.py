"""OpenEnv environments under teamrl's environment contract: ``task.name: openenv`` (``pip install 'teamrl[openenv]'``).

Two ways to reach one:

* ``env_id: package.module:Class``: an ``openenv.core.env_server.Environment`` subclass (or a function returning
  one), built in-process with ``env_args``, one instance per episode. Its action class is read from its
  ``Environment[Action, Observation, State]`` parameters (or named with ``action_class``).
* ``url: http://127.0.0.1:PORT``: a server already running (OpenEnv's own ``create_fastapi_app`` or
  ``openenv serve``), driven through OpenEnv's ``GenericEnvClient`` over its WebSocket, one session per episode.
  teamrl neither starts nor pulls containers; a server that does not answer is one line naming the URL.

What maps to what: ``reset(seed=problem's seed)`` gives the first observation; the model's reply fills the action's
``action_field`` (default: its only required text field) and ``step`` applies it; the observation's fields other
than ``done``, ``reward`` and ``metadata`` are the text the agent reads next (``observation_field`` picks one); the
observation's ``reward`` (set by the environment's rubric) is the turn's reward, ``done`` ends the episode, and the
episode succeeds when a turn's reward reaches ``success_reward``. An action the environment refuses (a validation
error, an exception in ``step``) is an invalid turn with ``invalid_reward``; a reward that is not a finite number
is one line naming it and fails the episode.

MCP tools: an ``MCPEnvironment`` (or a server with ``tools: on``) has its tools listed once per episode
(``ListToolsAction``) and shown after the first observation in the Hermes format teamrl writes for every model
(:func:`teamrl.team.tools.tools_block`); each ``<tool_call>`` of a reply is a ``CallToolAction``, and its result, or
its error, comes back wrapped in ``<tool_response>``. A tool's error or a malformed call is an invalid turn. A reply
without a call goes to the environment's own action class when it has one (an ``MCPEnvironment``'s ``_step_impl``),
else it is an invalid turn. Code mode (``execute_code``: Python run in the training process) is never used.

Left out: containers and hosted providers (``from_docker_image``, ``from_env``), tree sampling over a server (a WebSocket
session cannot be copied).
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import sys
import typing
from dataclasses import dataclass, field
from typing import Any

from teamrl.tasks.base import Problem, require
from teamrl.tasks.env import EnvConfig, Turn, register_env
from teamrl.team.tools import ToolCall, ToolCallError, parse_tool_calls, tools_block

__all__ = ["OpenEnvConfig", "OpenEnvEnv"]

_SKIP = ("done", "reward", "metadata")


@dataclass(kw_only=True)
class OpenEnvConfig(EnvConfig):
    env_id: str = ""
    """An OpenEnv Environment class (or a function returning one) as 'package.module:Class', built in-process. Set this or url."""
    env_args: dict[str, Any] = field(default_factory=dict)
    """Keywords of the environment's constructor (env_id only)."""
    url: str = ""
    """Base URL of an OpenEnv server already running (e.g. http://127.0.0.1:8765). Set this or env_id."""
    action_class: str = ""
    """The action class as 'package.module:Class' (env_id only; default: read from the environment's type parameters)."""
    action_field: str = ""
    """The action field the model's reply fills (default: the action class's only required text field; required with url)."""
    observation_field: str = ""
    """The observation field shown to the agent (default: every field but done, reward and metadata)."""
    success_reward: float = 1.0
    """An episode succeeds when one turn's reward reaches this."""
    invalid_reward: float = -1.0
    """Reward of a turn whose reply is empty or whose action the environment refuses."""
    action_format: str = "Reply with your action."
    """One sentence telling the model how to write an action (OpenEnv environments state their own rules)."""
    tools: str = "auto"
    """MCP tools offered to the agent as function tools: auto (when env_id is an MCPEnvironment), on (also a url server, through OpenEnv's MCPToolClient), off."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if bool(self.env_id) == bool(self.url):
            raise ValueError("task.openenv needs exactly one of env_id ('package.module:Class', in-process) and url "
                             "(a running OpenEnv server)")
        if self.env_id and (self.env_id.count(":") != 1 or not all(self.env_id.split(":"))):
            raise ValueError(f"task.openenv.env_id {self.env_id!r} must look like 'package.module:Class'")
        if self.url and not self.action_field and self.tools != "on":
            raise ValueError("task.openenv.url: a server's action class is not known here; set "
                             "task.openenv.action_field to the action field the reply fills")
        if self.tools not in ("auto", "on", "off"):
            raise ValueError(f"task.openenv.tools {self.tools!r} must be auto, on or off")
        if self.url and self.tools == "on" and self.action_field:
            raise ValueError("task.openenv.action_field: a server driven through its MCP tools (tools: on) takes tool "
                             "calls only; unset action_field, or set tools: off")
        if self.url and (self.env_args or self.action_class):
            raise ValueError("task.openenv.env_args and action_class apply to env_id (an in-process environment), "
                             "not to url")


def _import(spec: str, key: str) -> Any:
    """The object at 'package.module:attr' (the current directory importable), or one line saying why not."""
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 (the user's module: any failure is one line naming it)
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ValueError(f"task.openenv.{key} {spec!r} does not import ({type(exc).__name__}: {first})") from None
    if not hasattr(module, attr):
        raise ValueError(f"task.openenv.{key} {spec!r}: module {module_name!r} has no {attr!r}")
    return getattr(module, attr)


def _action_type(env: Any) -> Any:
    """The Action class of an ``Environment[Action, Observation, State]`` subclass, or None."""
    for klass in type(env).__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            args = typing.get_args(base)
            if args and isinstance(args[0], type):
                return args[0]
    return None


def _text_fields(action_cls: Any) -> list[str]:
    return [n for n, f in getattr(action_cls, "model_fields", {}).items() if f.is_required() and f.annotation is str]


def _text_field(action_cls: Any) -> str:
    """The only required ``str`` field of an action class."""
    fields = _text_fields(action_cls)
    if len(fields) != 1:
        raise ValueError(f"the action class {action_cls.__name__} has {len(fields)} required text fields "
                         f"({', '.join(fields) or 'none'}); set task.openenv.action_field")
    return fields[0]


def _result_text(obs: Any) -> tuple[str, str | None]:
    """A ``CallToolObservation``'s result as text, and its error message (or None)."""
    fields = obs if isinstance(obs, dict) else obs.model_dump() if hasattr(obs, "model_dump") else vars(obs)
    error = fields.get("error")
    if error:
        return "", str(error.get("message", error) if isinstance(error, dict) else error)
    result = getattr(obs, "result", None) if not isinstance(obs, dict) else obs.get("result")
    content = result.get("content") if isinstance(result, dict) else getattr(result, "content", None)
    if isinstance(content, list) and content:
        texts = [c.get("text", "") if isinstance(c, dict) else getattr(c, "text", "") for c in content]
        return "\n".join(str(t) for t in texts), None
    data = result.get("data") if isinstance(result, dict) else getattr(result, "data", result)
    return ("" if data is None else str(data)), None


def _fields(obs: Any) -> dict[str, Any]:
    return obs.model_dump() if hasattr(obs, "model_dump") else dict(obs)


def _function(tool: Any) -> dict[str, Any]:
    """An OpenEnv ``Tool`` as an OpenAI function tool."""
    get = tool.get if isinstance(tool, dict) else lambda k, d=None: getattr(tool, k, d)
    return {"type": "function", "function": {"name": get("name"), "description": get("description") or "",
                                             "parameters": get("input_schema") or {"type": "object"}}}


def _render(fields: dict[str, Any], only: str) -> str:
    """An observation's fields as the text an agent reads."""
    if only:
        if only not in fields:
            raise ValueError(f"task.openenv.observation_field {only!r} is not in the observation "
                             f"({', '.join(fields)})")
        return str(fields[only])
    shown = {k: v for k, v in fields.items() if k not in _SKIP}
    if len(shown) == 1:
        return str(next(iter(shown.values())))
    return "\n".join(f"{k}: {v}" for k, v in shown.items())


@register_env("openenv", config=OpenEnvConfig)
class OpenEnvEnv:
    """One OpenEnv environment (an in-process instance or a server session) for one episode."""

    def __init__(self, cfg: OpenEnvConfig) -> None:
        require("openenv", "openenv")
        self.cfg, self.max_turns, self.action_format = cfg, cfg.max_turns, cfg.action_format
        self.seed, self.won = -1, False
        self.replies: list[Any] = []  # the replies stepped since reset (an MCP environment is copied by replaying them)
        self.head = ""  # with MCP tools: the first observation and the tools, shown again every turn
        self.client: Any = None
        self.env: Any = None
        self.field = cfg.action_field
        self.mcp = cfg.tools == "on"
        if cfg.env_id:
            factory = _import(cfg.env_id, "env_id")
            try:
                self.env = factory(**cfg.env_args)
            except TypeError as exc:
                raise ValueError(f"task.openenv.env_args {cfg.env_args} do not fit {cfg.env_id}: {exc}") from None
            self.action_cls = _import(cfg.action_class, "action_class") if cfg.action_class else _action_type(self.env)
            from openenv.core.env_server.mcp_environment import MCPEnvironment
            from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction

            if cfg.tools == "on" and not isinstance(self.env, MCPEnvironment):
                raise ValueError(f"task.openenv.tools: on, but {cfg.env_id} is not an MCPEnvironment (it has no MCP "
                                 f"tools); set tools: off or auto")
            self.mcp = cfg.tools == "on" or (cfg.tools == "auto" and isinstance(self.env, MCPEnvironment))
            if isinstance(self.action_cls, type) and issubclass(self.action_cls, (CallToolAction, ListToolsAction)):
                self.action_cls = None  # typed Environment[CallToolAction, ...]: its replies are tool calls
            if self.mcp:  # the MCP server logs every request, and each refused call the turn reports anyway
                logging.getLogger("mcp.server.lowlevel.server").setLevel(logging.WARNING)
                logging.getLogger("fastmcp").setLevel(logging.ERROR)
            if self.mcp and (self.action_cls is None or not cfg.action_field and len(_text_fields(self.action_cls)) != 1):
                self.action_cls, self.field = None, ""  # tool calls only
                return
            if self.action_cls is None:
                raise ValueError(f"the action class of {cfg.env_id} cannot be read from its type parameters; set "
                                 f"task.openenv.action_class")
            self.field = cfg.action_field or _text_field(self.action_cls)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        if self.cfg.url:
            raise TypeError("an OpenEnv server session cannot be copied (tree sampling needs env_id, in-process)")
        if self.mcp:  # a FastMCP server does not copy, and its tools hold their environment: built anew and replayed
            out = type(self)(self.cfg)
            memo[id(self)] = out
            if self.seed >= 0:
                out.reset(Problem(id="", question="", answer="", meta={"seed": self.seed}))
                for action in self.replies:
                    out.step(action)
            return out
        import copy

        out = object.__new__(type(self))
        memo[id(self)] = out
        out.__dict__.update({k: copy.deepcopy(v, memo) for k, v in self.__dict__.items()})
        return out

    def _connect(self) -> Any:
        from openenv.core.generic_client import GenericEnvClient

        if self.client is None:
            try:
                if self.mcp:
                    from openenv.core.mcp_client import MCPToolClient

                    self.client = MCPToolClient(base_url=self.cfg.url, connect_timeout_s=5.0).sync()
                else:
                    self.client = GenericEnvClient(base_url=self.cfg.url, connect_timeout_s=5.0).sync()
                self.client.connect()
            except Exception as exc:  # noqa: BLE001 (refused, timed out, not an OpenEnv server: one line)
                self.client = None
                raise ValueError(f"the OpenEnv server at {self.cfg.url} does not answer ({type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else ''}); start it or fix task.openenv.url") \
                    from None
        return self.client

    def reset(self, problem: Problem) -> str:
        self.seed, self.won, self.replies = int(problem.meta["seed"]), False, []
        if self.env is not None:
            text = _render(self.env.reset(seed=self.seed).model_dump(), self.cfg.observation_field)
        else:
            result = self._connect().reset(seed=self.seed)
            text = _render(_fields(result.observation), self.cfg.observation_field)
        if self.mcp:
            self.head = f"{text}\n\n{tools_block(self._tools())}"
            return self.head
        return text

    def _tools(self) -> list[dict[str, Any]]:
        """The environment's MCP tools as OpenAI function tools (``ListToolsAction``)."""
        if self.env is not None:
            from openenv.core.env_server.mcp_types import ListToolsAction

            obs = self.env.step(ListToolsAction())
            error = (obs.metadata or {}).get("error")
            tools = obs.tools
        else:
            tools, error = self._connect().list_tools(), None
        if error or not tools:
            raise ValueError(f"the OpenEnv environment lists no MCP tools ({error or 'none'}); set "
                             f"task.openenv.tools=off")
        return [_function(t) for t in tools]

    def _call(self, call: ToolCall) -> tuple[str, Any, bool, str | None]:
        """One tool call: its result text, reward, done and error (or None)."""
        from openenv.core.env_server.mcp_types import CallToolAction

        action = CallToolAction(tool_name=call.name, arguments=json.loads(call.arguments))
        if self.env is not None:
            obs = self.env.step(action)
            reward, done = obs.reward, bool(obs.done)
        else:
            result = self._connect().step(action)
            obs, reward, done = result.observation, result.reward, bool(result.done)
        text, error = _result_text(obs)
        return text, reward, done, error

    def instance(self) -> str:
        """Instances are told apart by their seed (an environment may hide what it drew)."""
        return f"seed {self.seed}"

    def parse_action(self, text: str) -> str | None:
        return text.strip() or None

    def step(self, action: Any | None) -> Turn:
        if action is None:
            return self._invalid("empty reply")
        if self.mcp:
            self.replies.append(action)
            try:
                _, calls = parse_tool_calls(str(action), "hermes")
            except ToolCallError as exc:
                return self._invalid(str(exc))
            if calls:
                return self._tool_turn(calls)
            if (self.action_cls is None) if self.env is not None else not self.field:
                return self._invalid("no <tool_call> in the reply")
        try:
            if self.env is not None:
                obs = self.env.step(self.action_cls(**{self.field: str(action)}))
                fields, reward, done = obs.model_dump(), obs.reward, bool(obs.done)
            else:
                result = self._connect().step({self.field: str(action)})
                fields, reward, done = _fields(result.observation), result.reward, bool(result.done)
        except Exception as exc:  # noqa: BLE001 (a refused action is an invalid turn, not the end of the run)
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return Turn("", self.cfg.invalid_reward, False, {"message": f"the environment refused the action: "
                                                                        f"{first[:200]}", "invalid": True})
        value = self._reward(reward)
        return Turn(_render(fields, self.cfg.observation_field), value, done, {"message": ""})

    def _reward(self, reward: Any) -> float:
        value = 0.0 if reward is None else float(reward)
        if not math.isfinite(value):
            raise ValueError(f"the OpenEnv environment returned reward {reward!r}, not a finite number")
        self.won = self.won or value >= self.cfg.success_reward
        return value

    def _invalid(self, why: str, shown: str = "", done: bool = False) -> Turn:
        """An invalid turn; with MCP tools the agent reads the question and the tools again (and any results)."""
        text = "\n\n".join(t for t in (self.head, shown) if t) if self.mcp else ""
        return Turn(text, self.cfg.invalid_reward, done, {"message": why[:200], "invalid": True})

    def _tool_turn(self, calls: list[ToolCall]) -> Turn:
        """Each call in order, until one ends the episode or fails; the question and the tools again, then the
        results as ``<tool_response>`` blocks. The turn's reward is the sum of its calls'; a call that fails makes
        the turn invalid (the results before it are still shown)."""
        shown: list[str] = []
        total, done = 0.0, False
        for call in calls:
            try:
                text, reward, done, error = self._call(call)
            except Exception as exc:  # noqa: BLE001 (arguments the tool refuses: an invalid turn)
                error, reward, done, text = (str(exc).splitlines()[0] if str(exc) else type(exc).__name__), None, \
                    False, ""
            if error:
                return self._invalid(f"tool {call.name!r}: {error}", "\n".join(shown), done)
            value = 0.0 if reward is None else float(reward)
            if not math.isfinite(value):
                raise ValueError(f"the OpenEnv environment returned reward {reward!r}, not a finite number")
            total += value
            shown.append(f"<tool_response>\n{text}\n</tool_response>")
            if done:
                break
        self.won = self.won or total >= self.cfg.success_reward
        return Turn(f"{self.head}\n\n" + "\n".join(shown), total, done, {"message": ""})

    @property
    def success(self) -> bool:
        return self.won

    def close(self) -> None:
        """End the server session, if any (also when the episode drops this instance)."""
        client, self.client = getattr(self, "client", None), None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001,S110 (a session the server already dropped)
                pass

    __del__ = close
