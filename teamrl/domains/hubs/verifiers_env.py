"""verifiers environments as a task and a workflow: ``task.name: verifiers`` with ``workflow.name: verifiers``.

``task.verifiers.env_id`` names a module that exports ``load_environment(**kwargs)`` (an environment package, or a
module of your own on the path); ``env_args`` are passed to it. What maps to what:

* **problems**: the environment's dataset (``get_dataset()``) is the train split; its eval dataset
  (``get_eval_dataset()``) the test split, or, when it has none, ``n_test`` rows held out of the dataset (drawn with
  ``seed``, never trained on). A problem's question is the last user message of the row's prompt; the row itself
  (prompt, answer, info, task) is what the rollout starts from.
* **rollout**: the workflow calls the environment's own ``rollout`` with an OpenAI client on this episode's session
  of teamrl's endpoint (:mod:`teamrl.serve`), so every model call the environment makes, single-turn, multi-turn or
  with tools (the environment runs its tools and sends their results back), is a Step of the agent its ``model`` name
  maps to (``workflow.verifiers.models``). An environment that asks several model names (one per seat) trains one
  agent per seat.
* **reward**: the rubric's weighted score (``score_group`` on the rollout's state); each reward function's value is
  logged per episode (``verifiers/<function>`` in the metrics, ``eval/metrics/<function>`` in evaluations).
  verifiers scores a reward function that raises as 0 with one error line; a non-finite score fails its episode.
* **format**: with ``workflow.verifiers.format_threshold`` set, a reply whose parser format reward
  (``parser.get_format_reward_func()`` on that reply alone) is below it is an invalid Step, so
  ``algo.format_penalty`` applies to it.

The episode's final text is a record of the rollout's scores (:func:`record_text`); the task reads its reward from
it. ``pip install 'teamrl[verifiers]'`` (verifiers 0.3.x: its classic ``Environment`` stack, which 0.4 removed).

Left out: verifiers' v1 stack (0.4; :mod:`.verifiers_v1` adapts it); group reward functions see one rollout at a
time (``score_group`` of one state); an environment's own ``sampling_args`` (the agent's config samples, as on the endpoint).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import math
import os
import random
import sys
from dataclasses import dataclass, field
from typing import Any

from teamrl.serve import Session, endpoint
from teamrl.tasks.base import Problem, Task, check_split, config_from, register_task, require
from teamrl.team.agents import AGENTS, register_agent
from teamrl.team.registry import load_builtin_workflows, register_workflow
from teamrl.team.team import Team

__all__ = ["VerifiersConfig", "VerifiersTask", "VerifiersWorkflowConfig", "record_text", "read_record"]

log = logging.getLogger(__name__)

_RECORD = "verifiers: "


def record_text(reward: float, metrics: dict[str, float], answer: str | None) -> str:
    """The final text of a verifiers episode: its rubric's reward, each function's score, the parsed answer.

    >>> record_text(1.0, {"correct": 1.0}, "7")
    'verifiers: {"reward": 1.0, "metrics": {"correct": 1.0}, "answer": "7"}'
    """
    return _RECORD + json.dumps({"reward": reward, "metrics": metrics, "answer": answer})


def read_record(text: str) -> dict[str, Any] | None:
    """The record of :func:`record_text`, or None when ``text`` is not one.

    >>> read_record('verifiers: {"reward": 0.5, "metrics": {}, "answer": null}')["reward"]
    0.5
    >>> read_record("7") is None
    True
    """
    if not text.startswith(_RECORD):
        return None
    try:
        out = json.loads(text[len(_RECORD):])
    except json.JSONDecodeError:
        return None
    return out if isinstance(out, dict) and isinstance(out.get("reward"), (int, float)) else None


@dataclass(kw_only=True)
class VerifiersConfig:
    env_id: str = ""
    """Module exporting load_environment(**env_args): an installed environment package (dashes read as underscores) or a module on the path, e.g. examples.hubs.vf_arith."""
    env_args: dict[str, Any] = field(default_factory=dict)
    """Keywords passed to load_environment."""
    n_test: int = 50
    """Rows held out of the dataset as the test split when the environment has no eval dataset (never trained on)."""
    limit_train: int = 0
    """Use at most this many training rows (0: all)."""
    limit_test: int = 0
    """Use at most this many test rows (0: all)."""
    seed: int = 0
    """Seed of the held-out draw (the training order is the sampler's)."""

    def __post_init__(self) -> None:
        if not self.env_id:
            raise ValueError("task.verifiers.env_id is empty; name the module that exports load_environment, "
                             "e.g. examples.hubs.vf_arith")
        for key in ("n_test", "limit_train", "limit_test"):
            if getattr(self, key) < 0:
                raise ValueError(f"task.verifiers.{key} {getattr(self, key)} must be >= 0")


def load_environment(env_id: str, env_args: dict[str, Any]) -> Any:
    """``load_environment(**env_args)`` of module ``env_id`` (the current directory importable), or one line saying why not."""
    require("verifiers", "verifiers")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    name = env_id.replace("-", "_")
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 (the user's module: any failure is one line naming it)
        raise ValueError(f"task.verifiers.env_id {env_id!r} does not import ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}); install the environment package or run "
                         f"from the folder that holds the module") from None
    fn = getattr(module, "load_environment", None)
    if not callable(fn):
        raise ValueError(f"task.verifiers.env_id {env_id!r} imports but exports no load_environment function")
    try:
        env = fn(**env_args)
    except TypeError as exc:
        raise ValueError(f"task.verifiers.env_args {env_args} do not fit {name}.load_environment: {exc}") from None
    import verifiers as vf

    if not isinstance(env, vf.Environment):
        raise ValueError(f"{name}.load_environment returned {type(env).__name__}, not a verifiers Environment")
    return env


def _text(content: Any) -> str:
    """A message's content as text (a list of parts: their text joined)."""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _question(prompt: Any) -> str:
    """The last user message of a chat prompt (or the prompt itself when it is text)."""
    if isinstance(prompt, str):
        return prompt
    users = [m for m in prompt or [] if isinstance(m, dict) and m.get("role") == "user"]
    return _text(users[-1].get("content")) if users else ""


@register_task("verifiers", config=VerifiersConfig)
class VerifiersTask:
    """A verifiers environment's dataset as problems; scored by its rubric during the rollout (the workflow)."""

    name = "verifiers"

    def __init__(self, cfg: Any = None) -> None:
        self.cfg = config_from(VerifiersConfig, cfg)
        self.env = load_environment(self.cfg.env_id, self.cfg.env_args)
        self.answer_format = ""  # the environment's own prompts say how to answer
        self.rows: dict[str, dict[str, Any]] = {}
        self._problems: dict[str, list[Problem]] = {}
        train = [dict(r) for r in self.env.get_dataset()] if self.env.dataset_source is not None else []
        if self.env.eval_dataset_source is not None:
            test = [dict(r) for r in self.env.get_eval_dataset()]
        else:
            order = list(range(len(train)))
            random.Random(f"verifiers:{self.cfg.seed}").shuffle(order)
            held = set(order[: self.cfg.n_test])
            test = [train[i] for i in sorted(held)]
            train = [r for i, r in enumerate(train) if i not in held]
        for split, rows, limit in (("train", train, self.cfg.limit_train), ("test", test, self.cfg.limit_test)):
            rows = rows[:limit] if limit else rows
            out = []
            for i, row in enumerate(rows):
                pid = f"vf-{split}-{i}"
                self.rows[pid] = row
                out.append(Problem(id=pid, question=_question(row.get("prompt")), answer=str(row.get("answer") or ""),
                                   meta={"split": split}))
            self._problems[split] = out
        if not self._problems["train"] and not self._problems["test"]:
            raise ValueError(f"environment {self.cfg.env_id!r} has no rows in its dataset or eval dataset")

    def problems(self, split: str) -> list[Problem]:
        return self._problems[check_split(split)]

    def extract_answer(self, response: str) -> str | None:
        """The answer the environment's parser read from the last reply, as recorded."""
        record = read_record(response)
        return None if record is None or record.get("answer") is None else str(record["answer"])

    def score(self, problem: Problem, response: str) -> float:
        """The rubric's weighted reward of the episode's rollout (0 for a text that is not a rollout's record)."""
        record = read_record(response)
        return 0.0 if record is None else float(record["reward"])

    def passed(self, problem: Problem, response: str) -> bool:
        """Reward at or above the environment's ``pass_threshold`` (verifiers' own pass@k rule)."""
        return self.score(problem, response) >= float(getattr(self.env, "pass_threshold", 0.5))

    def all_scores(self, problem: Problem, response: str) -> dict[str, float]:
        """The reward and each reward function's score of the rollout."""
        record = read_record(response) or {"reward": 0.0, "metrics": {}}
        return {"reward": float(record["reward"]), **{k: float(v) for k, v in (record.get("metrics") or {}).items()}}


@dataclass(kw_only=True)
class VerifiersWorkflowConfig:
    models: dict[str, str] = field(default_factory=lambda: {"policy": "policy"})
    """Model name the environment asks for -> the teamrl agent that answers it; one entry per seat of a multi-seat environment."""
    model: str = "policy"
    """The model name the rollout is started with (state['model']; an environment with seats may ask others)."""
    format_threshold: float | None = None
    """A reply whose parser format reward is below this is an invalid step (algo.format_penalty applies); null: every reply is valid."""
    timeout_s: float = 600.0
    """Most wall time of one rollout, generation included; past it the episode fails."""
    host: str = "127.0.0.1"
    """Address of the endpoint the environment's client calls (loopback)."""

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("workflow.verifiers.models is empty; map each model name the environment asks for to an "
                             "agent, e.g. {policy: policy}")
        if self.model not in self.models:
            raise ValueError(f"workflow.verifiers.model {self.model!r} is not in models ({', '.join(self.models)})")
        if self.timeout_s <= 0:
            raise ValueError(f"workflow.verifiers.timeout_s {self.timeout_s} must be > 0")
        load_builtin_workflows()
        from teamrl.serve.agent_program import _any_reply

        for name in self.agents:
            if name not in AGENTS:
                register_agent(name, system_prompt="")(_any_reply)

    @property
    def agents(self) -> list[str]:
        """The agents the environment's calls reach."""
        return sorted(set(self.models.values()))


def _format_scores(parser: Any, texts: list[str]) -> list[float]:
    """The parser's format reward of each reply alone."""
    fn = parser.get_format_reward_func()
    return [float(fn(completion=[{"role": "assistant", "content": t}])) for t in texts]


@register_workflow("verifiers", config=VerifiersWorkflowConfig, agents=())
async def verifiers_rollout(team: Team, problem: Problem, task: Task, cfg: VerifiersWorkflowConfig) -> str:
    """Run the environment's rollout on ``problem`` against the endpoint and score it with its rubric."""
    if not isinstance(task, VerifiersTask):
        raise ValueError(f"workflow verifiers runs a verifiers environment; task {task.name!r} is not one "
                         f"(set task.name: verifiers)")
    from openai import AsyncOpenAI
    from verifiers.legacy.clients import OpenAIChatCompletionsClient

    server = endpoint(cfg.host)
    session = Session(team, asyncio.get_running_loop(), cfg.models)
    name = server.open(session)
    team.episode.info["endpoint_episode"] = name
    env, row = task.env, dict(task.rows[problem.id])
    client = AsyncOpenAI(base_url=server.base_url(name), api_key=server.token, max_retries=0)
    try:
        with team.dispatcher.outside(id(session)):
            state = await asyncio.wait_for(env.rollout(row, OpenAIChatCompletionsClient(client), cfg.model, {}),
                                           cfg.timeout_s)
            if state.get("error") is not None:
                raise RuntimeError(f"the environment's rollout failed: {state['error']!r}"[:300])
            await env.rubric.score_group([state])
    except asyncio.TimeoutError:
        raise TimeoutError(f"the rollout ran past workflow.verifiers.timeout_s={cfg.timeout_s:g}") from None
    finally:
        server.close(name)
        await client.close()
        team.episode.info["calls"] = {a: sum(s.agent == a for s in team.episode.steps) for a in cfg.agents}
    reward = float(state["reward"])
    metrics = {str(k): float(v) for k, v in (state.get("metrics") or {}).items()}
    bad = [k for k, v in {"reward": reward, **metrics}.items() if not math.isfinite(v)]
    if bad:
        raise ValueError(f"the rubric scored {', '.join(bad)} as a non-finite number; the episode is not trained on")
    if cfg.format_threshold is not None and team.episode.steps:
        scores = _format_scores(env.parser, [s.text for s in team.episode.steps])
        for step, score in zip(team.episode.steps, scores):
            step.valid = step.valid and score >= cfg.format_threshold
    team.episode.info["means"] = {f"verifiers/{k}": v for k, v in metrics.items()}
    completion = state.get("completion") or []
    try:
        answer = env.parser.parse_answer(completion)
    except Exception:  # noqa: BLE001 (a parser that cannot read the reply: no answer)
        answer = None
    return record_text(reward, metrics, None if answer is None else str(answer))
