"""The ``code_pair`` workflow: MAGRPO's two coders, one writing a helper ``aux`` and one the main function.

MAGRPO (arXiv 2508.04652, its code: OpenMLRL/LLM_Collab_Code_Generation) trains two agents on
HumanEval-style problems: agent 1 writes a helper function named ``aux``, agent 2 writes the
problem's function (its ``entry_point``) and may call ``aux``. Both see only the problem (they
answer at the same time, in parallel), the two functions are joined (``aux``, then the main
function, after the problem's own prefix: its imports) and both agents get one joint reward,
built in levels, each level reached only when the previous one passed:

  1. structure: +0.4 when ``aux`` is defined with a ``return`` (optional: its absence does not
     stop the levels); +0.6 when the main function is defined with a ``return`` (else stop);
  2. syntax: +0.5 when the joined code parses (else stop);
  3. tests: + the fraction of the problem's tests the joined program passes (0 to 1, run in the
     sandbox); when at least one test passed and ``aux`` exists: +0.5 if the main function calls
     ``aux``, and then +1.0 if it is not a thin wrapper (its body one ``return`` that calls ``aux``,
     or ``x = aux(...)`` then ``return x``) and -0.5 if it calls ``aux`` and drops the result.

The maximum is 4.0. ``reward: pass`` replaces the levels by the task's own 1/0 (all tests pass),
a deliberate difference with its own name. The structural checks read the code with :mod:`ast`
(the paper's code uses regular expressions over lines; the rules are the same, the reading
does not stumble on comments or strings); nothing here runs the code: only the sandbox does.

Prompts follow the paper's code: the helper's asks for ``def aux(...)`` only, the main one names
the function and says ``aux`` is available and must not be redefined. Unlike the paper's prompts
(which forbid markdown), both ask for a ```python block, the way the code tasks read replies.

Left out: MAGRPO's multi-turn variant (later turns shown external feedback).
"""

from __future__ import annotations

import ast
import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from teamrl.domains.code.code_exec import code_task_of, run_round
from teamrl.tasks.base import Problem, Task
from teamrl.team.agents import Parsed, register_agent
from teamrl.team.registry import register_workflow
from teamrl.team.team import Team

__all__ = ["CodePairConfig", "extract_function", "is_wrapper", "pair_reward", "calls", "drops_result", "join_program", "code_pair"]

_FENCE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_DEF = re.compile(r"^(\s*)def\s+(\w+)\s*\(")


@dataclass(kw_only=True)
class CodePairConfig:
    reward: Literal["levels", "pass"] = "levels"
    """levels: MAGRPO's joint reward in levels (structure, syntax, tests, use of aux; at most 4.0).
    pass: the task's 1/0 (every test passes), for both agents."""
    aux_name: str = "aux"
    """Name of the helper function agent 1 writes and agent 2 may call."""

    def __post_init__(self) -> None:
        if self.reward not in ("levels", "pass"):
            raise ValueError(f"reward {self.reward!r} must be 'levels' or 'pass'")
        if not self.aux_name.isidentifier():
            raise ValueError(f"aux_name {self.aux_name!r} must be a Python identifier such as 'aux'")

    @property
    def per_step_rewards(self) -> bool:
        """Whether episodes carry their own rewards (which Shapley credit would not override)."""
        return self.reward == "levels"


def _code_of(text: str) -> str:
    """The code of a reply: its fenced blocks joined, or the whole text when it has none."""
    blocks = _FENCE.findall(text)
    return "\n\n".join(blocks) if blocks else text


def extract_function(text: str, name: str) -> ast.FunctionDef | None:
    """The top-level ``def name(...)`` of a reply, parsed, or None.

    The reply's code (its ```python blocks, or the whole text) is parsed whole when it parses;
    else the lines of each ``def name(`` and the indented lines under it are parsed alone (the
    reply may wrap the function in prose).

    >>> extract_function("Here:\\ndef aux(x):\\n    return x + 1\\nDone.", "aux").name
    'aux'
    >>> extract_function("def f(x):\\n    return x", "aux") is None
    True
    """
    code = _code_of(text)
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        tree = None
    if tree is not None:
        found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
        return found[-1] if found else None
    lines = code.splitlines()
    for i, line in enumerate(lines):
        m = _DEF.match(line)
        if not m or m.group(2) != name:
            continue
        indent, block = len(m.group(1)), [line[len(m.group(1)):]]
        for nxt in lines[i + 1:]:
            if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                break
            block.append(nxt[indent:] if len(nxt) >= indent else nxt)
        try:
            part = ast.parse("\n".join(block))
        except (SyntaxError, ValueError):
            continue
        if part.body and isinstance(part.body[0], ast.FunctionDef):
            return part.body[0]
    return None


def _returns(fn: ast.FunctionDef) -> bool:
    return any(isinstance(n, ast.Return) and n.value is not None for n in ast.walk(fn))


def _is_call_of(node: ast.AST | None, name: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name


def calls(fn: ast.FunctionDef, name: str) -> bool:
    """Whether ``fn`` calls ``name(...)`` anywhere in its body.

    >>> calls(ast.parse("def f(x):\\n    return aux(x) + 1").body[0], "aux")
    True
    """
    return any(_is_call_of(n, name) for n in ast.walk(fn))


def _body(fn: ast.FunctionDef) -> list[ast.stmt]:
    """The statements of ``fn`` without its docstring."""
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return body


def is_wrapper(fn: ast.FunctionDef, name: str) -> bool:
    """Whether ``fn`` only hands its work to ``name``: one ``return`` calling it, or ``x = name(...)`` then ``return x``.

    An empty body counts as a wrapper (as in the paper's code).

    >>> is_wrapper(ast.parse("def f(x):\\n    '''Doc.'''\\n    r = aux(x)\\n    return r").body[0], "aux")
    True
    >>> is_wrapper(ast.parse("def f(x):\\n    return aux(x) * 2").body[0], "aux")  # one return that calls aux
    True
    >>> is_wrapper(ast.parse("def f(x):\\n    y = aux(x)\\n    return y * 2").body[0], "aux")
    False
    """
    body = _body(fn)
    if not body:
        return True
    if len(body) == 1:
        return isinstance(body[0], ast.Return) and body[0].value is not None and any(
            _is_call_of(n, name) for n in ast.walk(body[0].value))
    if len(body) == 2:
        first, second = body
        return (isinstance(first, ast.Assign) and len(first.targets) == 1 and isinstance(first.targets[0], ast.Name)
                and _is_call_of(first.value, name) and isinstance(second, ast.Return)
                and isinstance(second.value, ast.Name) and second.value.id == first.targets[0].id)
    return False


def drops_result(fn: ast.FunctionDef, name: str) -> bool:
    """Whether ``fn`` calls ``name(...)`` as a bare statement, dropping what it returns.

    >>> drops_result(ast.parse("def f(x):\\n    aux(x)\\n    return x").body[0], "aux")
    True
    """
    return any(isinstance(n, ast.Expr) and _is_call_of(n.value, name) for n in ast.walk(fn))


def join_program(aux: ast.FunctionDef | None, main: ast.FunctionDef) -> str:
    """The program both agents wrote: ``aux`` (when there is one), then the main function.

    The problem's imports come from its prefix (the code tasks place the prompt before the program).
    """
    return "\n\n\n".join(ast.unparse(f) for f in (aux, main) if f is not None) + "\n"


def pair_reward(aux: ast.FunctionDef | None, main: ast.FunctionDef | None, *, syntax_ok: bool, passed: int,
                total: int, aux_name: str = "aux") -> tuple[float, dict[str, float]]:
    """MAGRPO's joint reward of one aux + main pair (the levels of the module docstring).

    Args:
        aux: agent 1's helper (None: not defined).
        main: agent 2's main function (None: not defined).
        syntax_ok: whether the joined program parses.
        passed: tests the joined program passed.
        total: tests run (0 when the levels stopped before the tests).
        aux_name: the helper's name.

    Returns:
        (reward, its parts by level) with reward = sum of the parts.

    >>> main = ast.parse("def f(x):\\n    y = aux(x)\\n    return y + 1").body[0]
    >>> aux = ast.parse("def aux(x):\\n    return 2 * x").body[0]
    >>> pair_reward(aux, main, syntax_ok=True, passed=3, total=4)[0]  # .4 + .6 + .5 + .75 + .5 + 1
    3.75
    >>> pair_reward(None, None, syntax_ok=False, passed=0, total=0)[0]
    0.0
    """
    parts = {"aux_defined": 0.4 if aux is not None and _returns(aux) else 0.0}
    if main is None or not _returns(main):
        return sum(parts.values()), parts
    parts["main_defined"] = 0.6
    if not syntax_ok:
        return sum(parts.values()), parts
    parts["syntax"] = 0.5
    parts["tests"] = passed / total if total else 0.0
    if passed > 0 and aux is not None and calls(main, aux_name):
        parts["uses_aux"] = 0.5
        parts["not_wrapper"] = 0.0 if is_wrapper(main, aux_name) else 1.0
        parts["drops_aux_result"] = -0.5 if drops_result(main, aux_name) else 0.0
    return sum(parts.values()), parts


def defines(name: str) -> Callable[[str], Parsed]:
    """A parser whose value is the reply's function ``name`` (valid when the reply defines it)."""

    def parse(text: str) -> Parsed:
        fn = extract_function(text, name)
        return Parsed(fn, valid=fn is not None)

    return parse


@register_agent("aux_coder", system_prompt="You are a careful Python programmer. You write one helper function that "
                "another programmer's function will call.")
def parse_aux(text: str) -> Parsed:
    """Default helper parser: valid when the reply defines a function named ``aux``."""
    return defines("aux")(text)


@register_agent("main_coder", system_prompt="You are a careful Python programmer. You write the function a problem "
                "asks for; a helper function written by another programmer is available to call.")
def parse_main(text: str) -> Parsed:
    """Default main-function parser: any reply (the workflow checks it defines the problem's function)."""
    return Parsed(text, valid=bool(text.strip()))


def aux_prompt(question: str, name: str) -> str:
    """Agent 1's ask (the paper's helper prompt, with a ```python block)."""
    return (f"Create a helper function for this coding problem.\n\nProblem:\n{question}\n\n"
            f"Write only a helper function named '{name}' that can assist the main function and returns useful data "
            f"for solving the problem; no explanations, tests or example usage. Answer with one ```python code block:\n"
            f"```python\ndef {name}(...):\n    # your code here\n    return result\n```")


def main_prompt(question: str, entry_point: str, name: str) -> str:
    """Agent 2's ask (the paper's main-function prompt, with a ```python block)."""
    return (f"Solve this coding problem by implementing the required function.\n\nProblem:\n{question}\n\n"
            f"You have access to a helper function: {name}(...)\n"
            f"Implement only the '{entry_point}' function; do not redefine {name}(); you can call {name}() and assign "
            f"its result to a variable if helpful. No explanations, tests or example usage. Answer with one ```python "
            f"code block:\n```python\ndef {entry_point}(...):\n    # your code here\n    return result\n```")


@register_workflow("code_pair", config=CodePairConfig, agents=("aux_coder", "main_coder"), calls=lambda o, t: 1)
async def code_pair(team: Team, problem: Problem, task: Task, cfg: CodePairConfig) -> str | None:
    """Agent 1 writes ``aux``, agent 2 the problem's function (in parallel); both get the pair's joint reward."""
    ctask = code_task_of(task, "code_pair")
    entry = ctask.code_problem(problem).entry_point
    if not entry:
        raise ValueError(f"workflow 'code_pair' splits a function between two agents and needs function-call problems "
                         f"(an entry_point); problem {problem.id!r} has stdin/stdout tests")
    aux_reply, main_reply = await asyncio.gather(
        team.ask("aux_coder", [{"role": "user", "content": aux_prompt(problem.question, cfg.aux_name)}],
                 parse=defines(cfg.aux_name)),
        team.ask("main_coder", [{"role": "user", "content": main_prompt(problem.question, entry, cfg.aux_name)}],
                 parse=defines(entry)))
    aux, main = aux_reply.value, main_reply.value
    program = join_program(aux, main) if main is not None else None
    syntax_ok = False
    if program is not None:
        try:
            ast.parse(program)
            syntax_ok = True
        except SyntaxError:
            program = None
    [verdict] = await run_round().hidden(ctask, problem, [program])
    passed, total = (verdict.passed, verdict.total) if verdict is not None else (0, 0)
    reward, parts = pair_reward(aux, main, syntax_ok=syntax_ok, passed=passed, total=total, aux_name=cfg.aux_name)
    if cfg.reward == "pass":
        reward = float(verdict is not None and verdict.ok)
    for reply in (aux_reply, main_reply):
        if reply.step >= 0:  # -1: a masked agent (counterfactual rerun) made no Step
            team.episode.step_rewards[reply.step] = reward
    team.episode.info.update(pair_reward=reward, **{f"level/{k}": v for k, v in parts.items()})
    return f"```python\n{program}```" if program is not None else main_reply.text
