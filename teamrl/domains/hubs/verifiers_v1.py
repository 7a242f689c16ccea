"""verifiers' v1 stack as a task and a workflow: ``task.name: verifiers_v1`` with ``workflow.name: verifiers_v1``.

verifiers 0.4 keeps only its v1 stack: a **taskset** yields typed tasks (each with its ``@vf.reward`` functions), an
**Env** plays one task with its agents (``Env.run(task, agents)``, one ``vf.AgentConfig`` field per seat; a plain
taskset plays on ``SingleAgentEnv``), and each agent runs a **harness** program in a **runtime** whose model calls
go through verifiers' own interception server to a client. What maps to what:

* **problems**: the taskset's tasks (``task.verifiers_v1.taskset`` and ``taskset_args``); ``n_test`` of them, drawn
  with ``seed``, are the test split, never trained on. A problem's question is the task's prompt text.
* **rollout**: ``env.run_episode(task, ctx)`` once per episode, its client (``vf.EvalClientConfig``) pointed at this
  episode's session of teamrl's endpoint (:mod:`teamrl.serve`); each seat asks for its own name as the model, so
  every model call of a seat is a Step of the agent ``workflow.verifiers_v1.models`` maps it to. Every seat runs in
  verifiers' ``subprocess`` runtime on this machine (hosted sandboxes and containers are never used); a seat the
  Env marks untrainable (``agents.x.trainable = False``) still answers through its agent, whose Steps train unless
  that agent is frozen in the config.
* **reward**: each seat's trace reward (the weighted sum of its task's rewards) is given to the Steps that made its
  replies; the episode's reward is the mean over its traces. Each reward function is logged per episode
  (``verifiers/<function>``, ``eval/metrics/<function>``). A trace that fails, or an episode whose Env raises, fails
  the episode (kept in ``failed_episodes.jsonl``, not trained on).
* **harness programs**: verifiers prepares each program as a PEP 723 script with ``uv sync``, which resolves packages
  from an index. Here the program runs on this interpreter instead, and only when every package its script declares
  is installed (one line naming what is missing otherwise): nothing is downloaded at run time. A seat with no harness
  of its own plays ``task.verifiers_v1.harness`` (default ``null``: verifiers' tool-less chat program); a harness
  that executes model-written code (``bash``, coding agents) is refused, since it would run on the host outside
  teamrl's sandbox.

``pip install 'teamrl[verifiers1]'`` (verifiers >= 0.4, < 0.5). The classic stack (0.3) is :mod:`.verifiers_env`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from teamrl.serve import Session, endpoint
from teamrl.tasks.base import Problem, Task, check_split, config_from, register_task, require
from teamrl.team.agents import AGENTS, register_agent
from teamrl.team.registry import load_builtin_workflows, register_workflow
from teamrl.team.team import Team

from .verifiers_env import read_record, record_text

__all__ = ["VerifiersV1Config", "VerifiersV1Task", "VerifiersV1WorkflowConfig", "missing_packages",
           "script_requirements"]

log = logging.getLogger(__name__)

_KEY_VAR = "TEAMRL_VERIFIERS_V1_KEY"
_SCRIPT = re.compile(r"^# /// script\s*$(.*?)^# ///\s*$", re.M | re.S)


def script_requirements(source: str) -> list[str]:
    """The ``dependencies`` a PEP 723 script declares (its ``# /// script`` block).

    >>> script_requirements('# /// script\\n# dependencies = ["openai", "mcp==2.0.0"]\\n# ///\\nprint(1)\\n')
    ['openai', 'mcp==2.0.0']
    >>> script_requirements("print(1)")
    []
    """
    import tomllib

    block = _SCRIPT.search(source)
    if block is None:
        return []
    text = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in block.group(1).splitlines())
    return [str(r) for r in tomllib.loads(text).get("dependencies", [])]


def missing_packages(requirements: list[str]) -> list[str]:
    """The requirements this interpreter does not satisfy (not installed, or at a version outside the specifier).

    >>> missing_packages(["pip"])
    []
    >>> missing_packages(["surely-not-an-installed-package-x"])
    ['surely-not-an-installed-package-x (not installed)']
    """
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement

    out = []
    for text in requirements:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            have = version(req.name)
        except PackageNotFoundError:
            out.append(f"{text} (not installed)")
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            out.append(f"{text} (installed: {have})")
    return out


def _run_scripts_here() -> None:
    """Make verifiers' subprocess runtime run PEP 723 programs on this interpreter, never resolving packages."""
    from verifiers.v1.runtimes import SubprocessRuntime

    if getattr(SubprocessRuntime, "_teamrl_local", False):
        return

    async def prepare_uv_script(self: Any, script: str | bytes, env: dict[str, str] | None = None, *,
                                activate: bool = True) -> list[str]:
        data = script.encode() if isinstance(script, str) else script
        missing = missing_packages(script_requirements(data.decode(errors="replace")))
        if missing:
            raise RuntimeError(f"the harness program needs {', '.join(missing)}; install them into this environment "
                               f"(teamrl resolves no packages at run time)")
        import hashlib

        path = f"{self.workdir}/.vf-program-{hashlib.sha256(data).hexdigest()[:16]}.py"
        await self.write(os.path.basename(path), data)
        return [sys.executable, path]

    SubprocessRuntime.prepare_uv_script = prepare_uv_script
    SubprocessRuntime._teamrl_local = True


@dataclass(kw_only=True)
class VerifiersV1Config:
    taskset: str = ""
    """Taskset id: an installed taskset package, or a module path such as examples.hubs.vf1_sum (its folder is put on the path)."""
    taskset_args: dict[str, Any] = field(default_factory=dict)
    """The taskset config's fields (verifiers' --env.taskset.*)."""
    env: str = ""
    """Env id (a multi-agent Env package or module); empty: the taskset's own Env, else SingleAgentEnv."""
    env_args: dict[str, Any] = field(default_factory=dict)
    """The Env config's fields (verifiers' --env.*), seats included, e.g. {checker: {max_turns: 2}}."""
    harness: str = "null"
    """Harness of a seat that pins none (verifiers' own default is bash, which runs the model's commands on the host)."""
    n_test: int = 50
    """Tasks held out as the test split (drawn with seed, never trained on)."""
    limit_train: int = 0
    """Use at most this many training tasks (0: all)."""
    seed: int = 0
    """Seed of the held-out draw."""

    def __post_init__(self) -> None:
        if not self.taskset:
            raise ValueError("task.verifiers_v1.taskset is empty; name a taskset, e.g. examples.hubs.vf1_sum")
        for key in ("n_test", "limit_train"):
            if getattr(self, key) < 0:
                raise ValueError(f"task.verifiers_v1.{key} {getattr(self, key)} must be >= 0")


def _plugin_id(ident: str, what: str) -> str:
    """A v1 plugin id verifiers can import: a dotted module path becomes its last part, its folder on the path."""
    if not ident or "." not in ident or "/" in ident:
        return ident
    import importlib.util

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(ident)
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        raise ValueError(f"task.verifiers_v1.{what} {ident!r} does not import; install its package or run from the "
                         f"folder that holds the module")
    folder, base = os.path.split(spec.origin)
    name = os.path.splitext(base)[0] if base != "__init__.py" else os.path.basename(folder)
    parent = folder if base != "__init__.py" else os.path.dirname(folder)
    if parent not in sys.path:
        sys.path.insert(0, parent)
    return name


def load_env(cfg: VerifiersV1Config) -> tuple[Any, list[str]]:
    """The v1 Env of ``cfg`` with every seat in the subprocess runtime, asking its own name as the model; its seats."""
    require("verifiers.v1", "verifiers1")
    import verifiers
    import verifiers.v1 as vf
    from verifiers.v1.utils.loaders import env_config_type, harness_class, load_environment

    major_minor = tuple(int(p) for p in re.findall(r"\d+", verifiers.__version__)[:2])
    if major_minor < (0, 4):
        raise ValueError(f"task verifiers_v1 needs verifiers >= 0.4 (installed: {verifiers.__version__}); "
                         f"pip install 'teamrl[verifiers1]', or use task verifiers for the classic stack")
    library = logging.getLogger("verifiers.v1")  # a line per rollout at INFO: warnings only, unless set already
    if library.level == logging.NOTSET:
        library.setLevel(logging.WARNING)
    taskset, env_id = _plugin_id(cfg.taskset, "taskset"), _plugin_id(cfg.env, "env")
    try:
        cls = env_config_type(taskset, env_id)
        seats = [n for n, f in cls.model_fields.items() if isinstance(f.default, vf.AgentConfig)]
        data: dict[str, Any] = {**cfg.env_args, "id": env_id, "taskset": {**cfg.taskset_args, "id": taskset}}
        for seat in seats:
            pinned = cls.model_fields[seat].default.harness is not None or "harness" in (cfg.env_args.get(seat) or {})
            data[seat] = {**(cfg.env_args.get(seat) or {}), "runtime": {"type": "subprocess"}, "model": seat,
                          **({} if pinned else {"harness": {"id": cfg.harness}})}
        config = cls.model_validate(data)
        env = load_environment(config)
    except Exception as exc:  # noqa: BLE001 (the user's taskset / env: any failure is one line naming it)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ValueError(f"verifiers v1 taskset {cfg.taskset!r}"
                         f"{f' with env {cfg.env!r}' if cfg.env else ''} does not load ({type(exc).__name__}: "
                         f"{first[:300]})") from None
    for seat, harness in env._harnesses.items():
        if harness.EXECUTES_CODE:
            raise ValueError(f"seat {seat!r} plays harness {harness.config.id!r}, which runs model-written code on "
                             f"this machine outside teamrl's sandbox; pin a tool-less harness (harness: null)")
    harness_class("null")  # the chat program's module must import
    _run_scripts_here()
    return env, seats


@register_task("verifiers_v1", config=VerifiersV1Config)
class VerifiersV1Task:
    """A verifiers v1 taskset's tasks as problems; scored by their rewards during the rollout (the workflow)."""

    name = "verifiers_v1"

    def __init__(self, cfg: Any = None) -> None:
        self.cfg = config_from(VerifiersV1Config, cfg)
        self.env, self.seats = load_env(self.cfg)
        self.answer_format = ""
        self.tasks: dict[str, Any] = {}
        tasks = list(self.env.taskset)
        if not tasks:
            raise ValueError(f"taskset {self.cfg.taskset!r} yields no tasks")
        order = list(range(len(tasks)))
        random.Random(f"verifiers_v1:{self.cfg.seed}").shuffle(order)
        held = set(order[: min(self.cfg.n_test, len(tasks) - 1)])
        self._problems: dict[str, list[Problem]] = {"train": [], "test": []}
        for i, t in enumerate(tasks):
            split = "test" if i in held else "train"
            pid = f"vf1-{split}-{i}"
            self.tasks[pid] = t
            self._problems[split].append(Problem(id=pid, question=t.data.prompt_text,
                                                 answer=str(getattr(t.data, "answer", "") or ""), meta={"split": split}))
        if self.cfg.limit_train:
            self._problems["train"] = self._problems["train"][: self.cfg.limit_train]

    def problems(self, split: str) -> list[Problem]:
        return self._problems[check_split(split)]

    def extract_answer(self, response: str) -> str | None:
        record = read_record(response)
        return None if record is None or record.get("answer") is None else str(record["answer"])

    def score(self, problem: Problem, response: str) -> float:
        """The mean trace reward of the episode, as recorded (0 for a text that is not an episode's record)."""
        record = read_record(response)
        return 0.0 if record is None else float(record["reward"])

    def passed(self, problem: Problem, response: str) -> bool:
        return self.score(problem, response) >= 0.5

    def all_scores(self, problem: Problem, response: str) -> dict[str, float]:
        record = read_record(response) or {"reward": 0.0, "metrics": {}}
        return {"reward": float(record["reward"]), **{k: float(v) for k, v in (record.get("metrics") or {}).items()}}


@dataclass(kw_only=True)
class VerifiersV1WorkflowConfig:
    models: dict[str, str] = field(default_factory=lambda: {"agent": "policy"})
    """Seat of the Env (its AgentConfig field: agent for a plain taskset) -> the teamrl agent that plays it."""
    timeout_s: float = 600.0
    """Most wall time of one episode; past it the episode fails."""
    host: str = "127.0.0.1"
    """Address of the endpoint the seats' client calls (loopback)."""

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("workflow.verifiers_v1.models is empty; map each seat to an agent, e.g. {agent: policy}")
        if self.timeout_s <= 0:
            raise ValueError(f"workflow.verifiers_v1.timeout_s {self.timeout_s} must be > 0")
        load_builtin_workflows()
        from teamrl.serve.agent_program import _any_reply

        for name in self.agents:
            if name not in AGENTS:
                register_agent(name, system_prompt="")(_any_reply)

    @property
    def agents(self) -> list[str]:
        return sorted(set(self.models.values()))


class _Serving:
    """verifiers' serving resources (interception server, shared tools) per event loop, held while episodes run."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.users = 0
        self.cm: Any = None
        self.lock: asyncio.Lock | None = None

    async def enter(self, env: Any) -> None:
        loop = asyncio.get_running_loop()
        if self.loop is not loop:
            self.loop, self.users, self.cm, self.lock = loop, 0, None, asyncio.Lock()
        assert self.lock is not None
        async with self.lock:
            if self.users == 0:
                self.cm = env.serving()
                await self.cm.__aenter__()
            self.users += 1

    async def leave(self) -> None:
        assert self.lock is not None
        async with self.lock:
            self.users -= 1
            if self.users == 0 and self.cm is not None:
                cm, self.cm = self.cm, None
                await cm.__aexit__(None, None, None)


_SERVING: dict[int, _Serving] = {}


def assign_rewards(traces: list[tuple[str, float, list[str]]], steps: list[tuple[str, str]]) -> dict[int, float]:
    """Each trace's reward for the Steps that made its replies: ``traces`` are (agent, reward, replies) in completion
    order, ``steps`` (agent, text) in call order; a reply matches the first unclaimed Step of its agent with its text.

    >>> assign_rewards([("a", 1.0, ["x"]), ("a", 0.0, ["y"])], [("a", "y"), ("a", "x"), ("b", "z")])
    {1: 1.0, 0: 0.0}
    """
    out: dict[int, float] = {}
    for agent, reward, replies in traces:
        for reply in replies:
            for i, (a, text) in enumerate(steps):
                if i not in out and a == agent and text.strip() == reply.strip():
                    out[i] = reward
                    break
    return out


@register_workflow("verifiers_v1", config=VerifiersV1WorkflowConfig, agents=())
async def verifiers_v1_rollout(team: Team, problem: Problem, task: Task, cfg: VerifiersV1WorkflowConfig) -> str:
    """Play ``problem``'s task with the Env, every seat's calls answered by its agent on teamrl's endpoint."""
    if not isinstance(task, VerifiersV1Task):
        raise ValueError(f"workflow verifiers_v1 plays a verifiers v1 taskset; task {task.name!r} is not one "
                         f"(set task.name: verifiers_v1)")
    unmapped = [s for s in task.seats if s not in cfg.models]
    if unmapped:
        raise ValueError(f"seat(s) {', '.join(unmapped)} of the Env have no agent; add them to workflow.verifiers_v1."
                         f"models (seats: {', '.join(task.seats)})")
    import verifiers.v1 as vf

    server = endpoint(cfg.host)
    os.environ.setdefault(_KEY_VAR, server.token)
    session = Session(team, asyncio.get_running_loop(), cfg.models)
    name = server.open(session)
    team.episode.info["endpoint_episode"] = name
    ctx = vf.ModelContext(model=task.seats[0], client=vf.EvalClientConfig(base_url=server.base_url(name),
                                                                          api_key_var=_KEY_VAR))
    serving = _SERVING.setdefault(id(task.env), _Serving())
    try:
        with team.dispatcher.outside(id(session)):
            await serving.enter(task.env)
            try:
                episode = await asyncio.wait_for(task.env.run_episode(task.tasks[problem.id], ctx), cfg.timeout_s)
            finally:
                await serving.leave()
    except asyncio.TimeoutError:
        raise TimeoutError(f"the episode ran past workflow.verifiers_v1.timeout_s={cfg.timeout_s:g}") from None
    finally:
        server.close(name)
        team.episode.info["calls"] = {a: sum(s.agent == a for s in team.episode.steps) for a in cfg.agents}
    failed = [e for t in episode.traces for e in t.errors] + list(episode.errors)
    if not episode.ok or failed:
        why = failed[-1] if failed else None
        raise RuntimeError(f"the episode failed: {why.type + ': ' + why.message if why else 'no trace completed'}"[:300])
    metrics: dict[str, list[float]] = {}
    traces = []
    for trace in episode.traces:
        seat = trace.agent.name
        for key, rew in trace.rewards.items():
            if rew is not None:
                metrics.setdefault(f"{seat}_{key}" if len(task.seats) > 1 else key, []).append(rew.score)
        traces.append((cfg.models[seat], float(trace.reward), [m.content or "" for m in trace.assistant_messages]))
    means = {k: sum(v) / len(v) for k, v in metrics.items()}
    reward = sum(r for _, r, _ in traces) / len(traces)
    bad = [k for k, v in {"reward": reward, **means}.items() if not math.isfinite(v)]
    if bad:
        raise ValueError(f"the task scored {', '.join(bad)} as a non-finite number; the episode is not trained on")
    team.episode.step_rewards.update(assign_rewards(traces, [(s.agent, s.text) for s in team.episode.steps]))
    for agent in cfg.agents:
        own = [r for a, r, _ in traces if a == agent]
        if own:
            team.episode.agent_rewards[agent] = sum(own) / len(own)
    team.episode.info["means"] = {f"verifiers/{k}": v for k, v in means.items()}
    last = episode.traces[-1].last_reply if episode.traces else ""
    return record_text(reward, means, last or None)
