"""The ``code_team`` workflow: AT-GRPO's coder and tester (arXiv 2510.11062, its code: PettingLLMs).

One episode is up to ``max_turns`` turns; in each turn:

  1. the **coder** writes a program (turn 0: from the problem; later turns: the problem and the
     history of every earlier program with the cases where it disagreed with the tester's tests:
     input, the tester's expected output, the program's actual output or its error);
  2. the **tester** writes unit tests, input and expected output each (turn 0: from the problem;
     later turns: the problem and the same mismatch history, judged from the tester's side);
  3. the tester's tests run against the coder's program in the sandbox; the cases that fail are
     the turn's mismatches and go back to both agents in the next turn. When every test passes
     the episode ends (PettingLLMs' ``done``: coder and tester agree).

Rewards, per step, as PettingLLMs' code environment gives them (local + ``team_weight`` x team,
AT-GRPO's mixed reward with alpha = ``team_weight``; PettingLLMs adds them with weight 1):

  * team reward of a turn: the fraction of the problem's own (hidden) tests the coder's program
    of that turn passes;
  * coder's local reward: the same fraction (so the coder gets (1 + team_weight) x it);
  * tester's local reward (``tester_reward: golden``): the fraction of its tests the problem's
    reference solution passes (are the tests right?); a problem whose answer does not pass its own
    tests has no reference and is refused with an error naming the other mode. ``tester_reward:
    generated`` (PettingLLMs' other mode, for tasks without reference programs such as ``pyfunc``):
    the fraction of its tests the coder's program of the same turn passes.

The episode's answer is the coder's last program (scored by the task as usual). The turn of a
step (``Step.agent_call``) is what AT-GRPO groups by: the ``at_grpo`` estimator preset groups by
prompt + agent + turn. ``code_team_tree`` adds AT-GRPO's tree-structured sampling, which PettingLLMs' trainer runs by
default (``rollout_mode: tree``): each turn ``branch`` coder and ``branch`` tester candidates are
sampled from the same state, candidate i's program is run against candidate i's tests, each pair
is rewarded as above, and the pair whose coder scores best (the first on ties) continues; its
Steps carry ``tree``, ``parent`` and the turn, so the ``at_grpo`` estimator groups each agent's
candidates of one turn. Without it (``code_team``) episodes are sampled independently,
``group_size`` per problem, and grouped by the estimator.

Differences from PettingLLMs, deliberate: the coder answers in a ```python block for both test
layouts (function-call tasks: the tester's input is a call such as ``add(1, 2)`` and its output a
Python value; stdin/stdout tasks: text in and out as in PettingLLMs); every run goes through
:mod:`teamrl.sandbox` with the task's limits (PettingLLMs runs programs in Ray workers).

Left out: PettingLLMs' other code roles; of its tree engine, that the tester's candidates all get the reward of
the selected copy and that copies after the first turn are not stepped again (docs/fidelity.md).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import ClassVar, Literal

from teamrl.domains.code.code import CodeProblem, IOTests, Verdict, extract_code
from teamrl.domains.code.code_exec import CodeTask, code_task_of, reference_of, run_round
from teamrl.tasks.base import Problem, Task
from teamrl.team.agents import Parsed, register_agent
from teamrl.team.registry import register_workflow
from teamrl.team.team import Reply, Team
from teamrl.team.tree import mark_candidates

__all__ = ["CodeTeamConfig", "Mismatch", "Case", "code_team", "history_text", "parse_tests", "turn_rewards"]

_CASE = re.compile(
    r"\*\*Test Input:?\*\*:?\s*```[^\n`]*\n?(.*?)```\s*\*\*Test Output:?\*\*:?\s*```[^\n`]*\n?(.*?)```",
    re.DOTALL | re.IGNORECASE)


@dataclass(kw_only=True)
class CodeTeamConfig:
    max_turns: int = 4
    """Most coder -> tester turns (PettingLLMs' code configs: 4); the episode also ends when every test of the tester
    passes the coder's program."""
    team_weight: float = 1.0
    """alpha of AT-GRPO's mixed reward: each step gets its local reward + team_weight x the team reward
    (PettingLLMs: 1). 0 gives the local rewards alone."""
    max_tests: int = 5
    """Most of the tester's cases run per turn (the first ones); more are ignored."""
    tester_reward: Literal["golden", "generated", "none"] = "golden"
    """The tester's local reward (PettingLLMs' modes). golden: the fraction of its tests the problem's reference
    solution passes (needs one: HumanEval has it, pyfunc does not). generated: the fraction of its tests the coder's
    program of the same turn passes (agreement with the coder; for tasks without a reference solution). none: no
    local term, the tester gets team_weight x the team reward (PettingLLMs' code environment on data without golden
    programs: its golden ratio stays 0, code_env.py:112-119)."""
    max_feedback_chars: int = 300
    """Longest input, expected or actual text of one mismatch shown to the agents (longer ones are trimmed in the
    middle)."""

    def __post_init__(self) -> None:
        for key in ("max_turns", "max_tests", "max_feedback_chars"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} {getattr(self, key)} must be >= 1")
        if self.tester_reward not in ("golden", "generated", "none"):
            raise ValueError(f"tester_reward {self.tester_reward!r} must be 'golden', 'generated' or 'none'")
        if self.team_weight < 0:
            raise ValueError(f"team_weight {self.team_weight} must be >= 0 (AT-GRPO's alpha; 0: local rewards only)")

    @property
    def per_step_rewards(self) -> bool:
        """Episodes carry per-step rewards (which Shapley credit would not override)."""
        return True

    branch: ClassVar[int] = 1
    tree_sampling: ClassVar[bool] = False


@dataclass(kw_only=True)
class CodeTeamTreeConfig(CodeTeamConfig):
    """``code_team_tree``: each turn, ``branch`` coder and ``branch`` tester candidates from the same state."""

    branch: int = 8  # type: ignore[misc]
    """Candidates per agent per turn (PettingLLMs' train_sample_num); candidate i's program meets candidate i's
    tests, and the pair whose coder scores best continues."""
    tree_sampling: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.branch < 2:
            raise ValueError(f"branch {self.branch} must be >= 2 (candidates per agent per turn); use code_team for "
                             f"one sample per turn")


@dataclass(frozen=True)
class Case:
    """One unit test the tester wrote: an input and the output it expects."""

    input: str
    output: str


def parse_tests(text: str) -> list[Case]:
    """The tester's cases: each ``**Test Input:**`` block followed by a ``**Test Output:**`` block.

    >>> parse_tests("**Test Input:**\\n```\\nadd(1, 2)\\n```\\n**Test Output:**\\n```\\n3\\n```")
    [Case(input='add(1, 2)', output='3')]
    >>> parse_tests("no tests here")
    []
    """
    return [Case(i.strip(), o.strip()) for i, o in _CASE.findall(text) if i.strip() and o.strip()]


def turn_rewards(code_pass: float, tests_right: float, team_weight: float) -> tuple[float, float]:
    """(coder's, tester's) reward of one turn: local + team_weight x team, the team reward being ``code_pass``.

    Args:
        code_pass: fraction of the problem's own tests the coder's program of the turn passes.
        tests_right: fraction of the tester's cases the reference solution passes (0 when it wrote none).
        team_weight: AT-GRPO's alpha.

    Returns:
        (coder reward, tester reward).

    >>> turn_rewards(0.5, 1.0, 1.0)  # coder .5 + .5; tester 1 + .5
    (1.0, 1.5)
    >>> turn_rewards(0.25, 0.0, 0.0)
    (0.25, 0.0)
    """
    return code_pass + team_weight * code_pass, tests_right + team_weight * code_pass


@register_agent("coder", system_prompt="You are a careful Python programmer. Write a correct, complete solution in "
                "one ```python code block.")
def parse_program(text: str) -> Parsed:
    """Default coder parser: the reply's last ```python block (valid when there is one)."""
    code = extract_code(text)
    return Parsed(code, valid=code is not None)


@register_agent("tester", system_prompt="You write unit tests for programming problems. For each test give its input "
                "and the output a correct program must produce.")
def parse_tester(text: str) -> Parsed:
    """Default tester parser: the reply's test cases (valid when there is at least one)."""
    cases = parse_tests(text)
    return Parsed(cases, valid=bool(cases))


@dataclass(frozen=True)
class Mismatch:
    """A test of the tester's that the coder's program did not pass."""

    case: Case
    actual: str
    """The program's output, or its error."""


def _trim(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n // 2] + " ... " + text[-(n - n // 2):]


def _case_format(code: CodeProblem) -> str:
    if isinstance(code.tests, IOTests):
        return "The input is what the program reads from standard input; the output is what it must print."
    return (f"The input is a call of {code.entry_point or 'the function'} with its arguments, e.g. "
            f"{code.entry_point or 'f'}(1, 2); the output is the Python value it must return.")


def _actual(verdict: Verdict, n: int) -> str:
    if verdict.status == "failed" and verdict.actual is not None:
        return _trim(verdict.actual.strip(), n)
    return _trim(f"{verdict.error or verdict.status}" + (f": {verdict.traceback.strip().splitlines()[-1]}"
                                                         if verdict.traceback else ""), n)


def history_text(history: list[tuple[str | None, list[Mismatch]]], n: int, *, side: str) -> str:
    """The earlier programs and where each disagreed with the tests, as ``side`` ("coder" | "tester") is told.

    >>> h = [("def f(x):\\n    return x", [Mismatch(Case("f(2)", "4"), "2")])]
    >>> print(history_text(h, 50, side="coder"))
    Program 1:
    ```python
    def f(x):
        return x
    ```
    Input: f(2)
    Expected by the tests: 4
    Your program's output: 2
    """
    who = ("Expected by the tests", "Your program's output") if side == "coder" else \
        ("Your test's expected output", "The program's output")
    lines = []
    for k, (program, mismatches) in enumerate(history, start=1):
        lines += [f"Program {k}:", f"```python\n{_trim((program or '(no code block)').strip(), 4 * n)}\n```"]
        for m in mismatches:
            lines += [f"Input: {_trim(m.case.input, n)}", f"{who[0]}: {_trim(m.case.output, n)}", f"{who[1]}: {m.actual}"]
        if not mismatches:
            lines.append("(no test ran against it)")
    return "\n".join(lines)


def messages_for_coder(problem: Problem, answer_format: str, history: list[tuple[str | None, list[Mismatch]]],
                   n: int) -> list[dict[str, str]]:
    """The coder's turn: the problem, then (after turn 0) its earlier programs and their disagreements with the tests."""
    ask = f"{problem.question}\n{answer_format}"
    if history:
        ask += ("\n\nYour earlier programs disagreed with another agent's tests:\n" + history_text(history, n, side="coder")
                + "\n\nIf a test is right, fix the program; if the program is right, keep it. Give the final program.")
    return [{"role": "user", "content": ask}]


def messages_for_tester(problem: Problem, code: CodeProblem, history: list[tuple[str | None, list[Mismatch]]],
                    cfg: CodeTeamConfig) -> list[dict[str, str]]:
    """The tester's turn: the problem and the test format, then (after turn 0) the disagreements so far."""
    ask = (f"{problem.question}\n\nWrite up to {cfg.max_tests} tests for this problem. {_case_format(code)} "
           "Write each test as:\n**Test Input:**\n```\ninput here\n```\n**Test Output:**\n```\noutput here\n```")
    if history:
        ask += ("\n\nYour earlier tests disagreed with another agent's programs:\n"
                + history_text(history, cfg.max_feedback_chars, side="tester")
                + "\n\nIf a test of yours was wrong, correct it; write tests you are sure of.")
    return [{"role": "user", "content": ask}]


async def code_team(team: Team, problem: Problem, task: Task, cfg: CodeTeamConfig) -> str | None:
    """Coder and tester take turns until the coder's program passes the tester's tests (AT-GRPO's code MAS); under
    ``code_team_tree`` each turn samples ``branch`` candidates of each and continues from the best pair."""
    ctask = code_task_of(task, "code_team")
    code = ctask.code_problem(problem)
    reference = reference_of(ctask, problem, "code_team", "set workflow.code_team.tester_reward: generated") \
        if cfg.tester_reward == "golden" else None
    history: list[tuple[str | None, list[Mismatch]]] = []
    parent = -1
    for turn in range(cfg.max_turns):
        asks = [team.ask("coder", messages_for_coder(problem, ctask.answer_format, history, cfg.max_feedback_chars),
                         parse=parse_program) for _ in range(cfg.branch)]
        asks += [team.ask("tester", messages_for_tester(problem, code, history, cfg), parse=parse_tester)
                 for _ in range(cfg.branch)]
        replies = await asyncio.gather(*asks)
        coders, testers = replies[:cfg.branch], replies[cfg.branch:]
        if cfg.tree_sampling:
            mark_candidates(team, replies, turn, [parent] * len(replies))
        outcomes = await asyncio.gather(*(_pair(ctask, problem, code, c, t, reference, cfg)
                                          for c, t in zip(coders, testers)))
        for c, t, (rewards, *_rest) in zip(coders, testers, outcomes):
            for reply, reward in zip((c, t), rewards):
                if reply.step >= 0:  # -1: a masked agent (counterfactual rerun) made no Step
                    team.episode.step_rewards[reply.step] = reward
        best = max(range(cfg.branch), key=lambda i: (outcomes[i][0][0], -i))  # the coder's reward, first on ties
        coder, (_, program, cases, mismatches, info) = coders[best], outcomes[best]
        parent = coder.step
        history.append((program, mismatches))
        team.episode.info.setdefault("turns", []).append(info)
        if cases and not mismatches:
            break
    team.episode.info["agreed"] = bool(cases) and not mismatches
    return coder.text


async def _pair(ctask: CodeTask, problem: Problem, code: CodeProblem, coder: Reply, tester: Reply,
                reference: str | None, cfg: CodeTeamConfig
                ) -> tuple[tuple[float, float], str | None, list[Case], list[Mismatch], dict[str, float]]:
    """One coder reply against one tester reply: (their rewards, the program, the cases, the mismatches, info)."""
    program = coder.value if coder.valid else None
    cases = parse_tests(tester.text)[:cfg.max_tests]
    pairs = [(c.input, c.output) for c in cases]
    rnd = run_round()
    [hidden], runs = await asyncio.gather(
        rnd.hidden(ctask, problem, [program]),
        rnd.cases(ctask, code, [p for p in (program, reference) if p is not None], pairs))
    on_program = runs[0] if program is not None else []
    judged = runs[-1] if reference is not None else on_program  # golden: the reference's runs
    code_pass = hidden.fraction if hidden is not None else 0.0
    right = (sum(v.ok for v in judged) / len(cases) if cases else 0.0) if cfg.tester_reward != "none" else 0.0
    absent = "no program (the reply had no ```python block)"
    mismatches = [Mismatch(c, absent) for c in cases] if program is None else \
        [Mismatch(c, _actual(v, cfg.max_feedback_chars)) for c, v in zip(cases, on_program) if not v.ok]
    info = {"code_pass": code_pass, "tests": len(cases), "tests_right": right, "mismatches": len(mismatches)}
    return turn_rewards(code_pass, right, cfg.team_weight), program, cases, mismatches, info


_CALLS = (lambda o, t: o.max_turns * o.branch)  # noqa: E731  (per agent: a call per turn, ``branch`` in a tree)
register_workflow("code_team", config=CodeTeamConfig, agents=("coder", "tester"), calls=_CALLS)(code_team)
register_workflow("code_team_tree", config=CodeTeamTreeConfig, agents=("coder", "tester"), calls=_CALLS)(code_team)
