"""Built-in workflows (``single``, ``math_team``) and the agents they call.

A workflow runs one episode: ``async def wf(team, problem, task, cfg) -> str | None`` returns the
team's final answer text, which the task scores. Control flow is plain Python: sequential,
conditional, looping and parallel (``asyncio.gather``) teams need no special support.

Built in:
  * ``single``: one agent answers once (the single-agent GRPO baseline).
  * ``math_team``: Dr. MAS's solver-verifier loop (arXiv 2602.08847, math orchestra).
  * ``math_tree``: agents take turns expanding a search tree (MARS2, arXiv 2602.07848; ``tree.py``).
  * ``agent_program``: an existing program written against the OpenAI API (``agent_program.py``).

The registry (``register_workflow``, ``get_workflow``, ``WORKFLOWS``) lives in :mod:`teamrl.team.registry`
and is re-exported here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from teamrl.tasks.base import Problem, Task, safe_score
from teamrl.team.agents import Parsed, register_agent
from teamrl.team.records import Episode
from teamrl.team.registry import (  # noqa: F401  (re-exported: workflow modules and user files import them from here)
    WORKFLOWS,
    Counterfactual,
    Workflow,
    WorkflowSpec,
    get_workflow,
    register_workflow,
)
from teamrl.team.team import Team

# ----------------------------------------------------------------------------- agents


@register_agent("solver", system_prompt="You are a careful math solver. Solve the problem and state the final answer.")
def parse_solution(text: str) -> Parsed:
    """Default solver parser: any non-empty reply is valid (workflows pass a task-aware parser)."""
    return Parsed(text.strip(), valid=bool(text.strip()))


@register_agent(
    "verifier",
    system_prompt="You are a strict verifier. You check a proposed solution and reply yes if it is correct or no if it is wrong.",
)
def parse_verdict_default(text: str) -> Parsed:
    """Default verifier parser: the lenient yes/no rule of :func:`parse_verdict`."""
    return parse_verdict(text, mode="lenient")


_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


def parse_verdict(text: str, *, mode: str) -> Parsed:
    """Read a verifier's yes/no verdict.

    ``strict``: the first word must be yes or no. ``lenient``: the last yes/no word anywhere.
    Returns ``Parsed("approve" | "reject" | None, valid)``.

    >>> parse_verdict("Yes, 3 + 4 = 7.", mode="strict")
    Parsed(value='approve', valid=True)
    >>> parse_verdict("I think the answer is no.", mode="strict")
    Parsed(value=None, valid=False)
    >>> parse_verdict("I think the answer is no.", mode="lenient")
    Parsed(value='reject', valid=True)
    """
    if mode == "strict":
        words = re.findall(r"[a-z]+", text.lower())
        word = words[0] if words and words[0] in ("yes", "no") else None
    elif mode == "lenient":
        found = _YES_NO.findall(text)
        word = found[-1].lower() if found else None
    else:
        raise ValueError(f"verdict mode {mode!r} is not one of 'strict', 'lenient'")
    if word is None:
        return Parsed(None, valid=False)
    return Parsed("approve" if word == "yes" else "reject", valid=True)


# ----------------------------------------------------------------------------- workflows


@dataclass(kw_only=True)
class SingleConfig:
    agent: str = "solver"
    """The agent that answers."""
    answer_prefix: str = ""
    """Text the answering agent's reply starts with, e.g. '<answer>' (its tokens join the prompt and are not
    trained; the parsed reply is this text + what the model wrote). Lets a small model that never writes the
    task's answer format on its own give answers (as env_single.action_prefix does for actions); empty: the
    model writes the whole reply."""
    answer_close: str = ""
    """Text that ends the answering agent's reply, e.g. '</answer>': generation stops at it, and a reply the
    model ends without it gets it appended (a reply cut by max_new_tokens stays unclosed); empty: none."""

    @property
    def agents(self) -> tuple[str, ...]:
        """The agents the workflow calls: the one that answers."""
        return (self.agent,)


@register_workflow("single", config=SingleConfig, agents=("solver",), calls=lambda o, t: 1)
async def single(team: Team, problem: Problem, task: Task, cfg: SingleConfig) -> str | None:
    """One agent answers once."""
    reply = await team.ask(cfg.agent, [{"role": "user", "content": f"{problem.question}\n{task.answer_format}"}],
                           parse=_answer_parser(task), prefix=cfg.answer_prefix, close=cfg.answer_close)
    return reply.text


@dataclass(kw_only=True)
class MathTeamConfig:
    max_loops: int = 2
    """Most solver->verifier rounds. The solver answers, the verifier judges; on a reject the
    solver answers again, until the verifier approves or max_loops rounds have run. The team's
    answer is the solver's last answer, approved or not."""
    verdict_parse: Literal["strict", "lenient"] = "lenient"
    """How the verifier's reply is read. strict: the first word must be yes or no. lenient: the
    last yes/no word anywhere in the reply. A reply with no verdict is an invalid step (it gets
    the format penalty)."""
    on_invalid_verdict: Literal["approve", "reject"] = "approve"
    """What an unparseable verdict does: approve ends the episode with the current answer;
    reject sends the solver to another round (if one is left)."""
    answer_prefix: str = ""
    """Text the solver's replies start with, e.g. '<answer>' (see single.answer_prefix); empty: none."""
    answer_close: str = ""
    """Text that ends the solver's replies, e.g. '</answer>' (see single.answer_close); empty: none."""
    verify_last: bool = True
    """Whether the verifier judges the solver's answer of the last round. false: the last round is the solver's
    alone, so max_loops 2 runs solver, verifier, and on a reject solver again (Dr. MAS's math orchestra)."""
    reward: Literal["joint", "per_agent"] = "joint"
    """Who is rewarded for what. joint: every step gets the team's reward (the final answer is
    correct). per_agent: the solver's steps get the team's reward; each verifier step gets 1 when
    its verdict was right about the answer it judged (approved a correct one or rejected a wrong
    one), else 0 (an unparseable verdict is never right)."""

    def __post_init__(self) -> None:
        if self.max_loops < 1:
            raise ValueError(f"max_loops {self.max_loops} must be >= 1")
        if self.reward not in ("joint", "per_agent"):
            raise ValueError(f"reward {self.reward!r} must be 'joint' or 'per_agent'")

    @property
    def per_step_rewards(self) -> bool:
        """Whether episodes carry per-step rewards (which Shapley credit would not override)."""
        return self.reward == "per_agent"


def _answer_parser(task: Task) -> Callable[[str], Parsed]:
    def parse(text: str) -> Parsed:
        ans = task.extract_answer(text)
        return Parsed(ans, valid=ans is not None)

    return parse


async def math_team_counterfactual(team: Team, problem: Problem, task: Task, cfg: MathTeamConfig,
                                   episode: Episode, coalition: frozenset[str]) -> str | None:
    """The math team's answer with only ``coalition`` taking part, read off the recorded episode (no generation).

    Both agents: the episode's answer. Without the verifier nobody rejects, so the solver's first
    answer stands. Without the solver there is no answer (the neutral empty reply).
    """
    if "solver" not in coalition:
        return ""
    if "verifier" not in coalition:
        return next(s.text for s in episode.steps if s.agent == "solver")
    return episode.final


@register_workflow("math_team", config=MathTeamConfig, agents=("solver", "verifier"),
                   counterfactual=math_team_counterfactual, neutral={"solver": "", "verifier": "yes"},
                   calls=lambda o, t: o.max_loops)
async def math_team(team: Team, problem: Problem, task: Task, cfg: MathTeamConfig) -> str | None:
    """Solver proposes, verifier approves or rejects, solver retries on reject (Dr. MAS math team)."""
    ask_solver = [{"role": "user", "content": f"{problem.question}\n{task.answer_format}"}]
    prefix, close = cfg.answer_prefix, cfg.answer_close
    solution = await team.ask("solver", ask_solver, parse=_answer_parser(task), prefix=prefix, close=close)
    verdicts: list[tuple[int, str, str | None]] = []  # (step index, answer judged, verdict)
    for loop in range(cfg.max_loops):
        if loop == cfg.max_loops - 1 and not cfg.verify_last:
            break
        check = (
            f"Problem: {problem.question}\n\nProposed solution: {solution.text}\n\n"
            "Is the proposed solution correct? Reply yes or no."
        )
        verdict = await team.ask("verifier", [{"role": "user", "content": check}],
                                 parse=lambda t: parse_verdict(t, mode=cfg.verdict_parse))
        verdicts.append((len(team.episode.steps) - 1, solution.text, verdict.value if verdict.valid else None))
        decision = verdict.value if verdict.valid else cfg.on_invalid_verdict
        if decision == "approve" or loop == cfg.max_loops - 1:
            break
        retry = [
            *ask_solver,
            {"role": "assistant", "content": solution.text},
            {"role": "user", "content": f"A verifier judged this answer wrong. Solve the problem again carefully.\n{task.answer_format}"},
        ]
        solution = await team.ask("solver", retry, parse=_answer_parser(task), prefix=prefix, close=close)
    team.episode.info["loops"] = loop + 1
    if cfg.reward == "per_agent":
        team.episode.step_rewards.update(verdict_rewards(verdicts, lambda text: safe_score(task, problem, text)))
    return solution.text


def verdict_rewards(verdicts: list[tuple[int, str, str | None]], score: Callable[[str], float]) -> dict[int, float]:
    """Reward of each verdict step: 1 when it approved a correct answer or rejected a wrong one.

    ``verdicts`` holds (step index, answer text judged, "approve" | "reject" | None); an answer is
    correct when ``score`` gives it > 0; None (no verdict) earns 0.

    >>> verdict_rewards([(1, "4", "reject"), (3, "5", "approve"), (5, "5", None)], lambda t: float(t == "5"))
    {1: 1.0, 3: 1.0, 5: 0.0}
    """
    correct: dict[str, bool] = {}
    out = {}
    for index, answer, verdict in verdicts:
        if answer not in correct:
            correct[answer] = score(answer) > 0
        out[index] = float(verdict is not None and (verdict == "approve") == correct[answer])
    return out
