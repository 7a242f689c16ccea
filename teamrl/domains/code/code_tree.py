"""The ``code_tree`` workflow: MARS2's search tree (``tree.py``) on code, refined from execution feedback.

MARS2 (arXiv 2602.07848) reports its headline result on code generation: agents expand one
search tree per problem, a node is a program, and a node that fails is refined by a child that
is shown its parent's program and what happened when it ran. Here the tree machinery is
``math_tree``'s (:func:`teamrl.team.tree.grow_tree`: breadth-first expansion, ``branching``
children per failed node, round-robin or Thompson-sampling choice of the agent, node budget,
depth limit, ``reward: node | tree``); what is code-specific:

  * a node's program is its reply's last ```python block; it runs against the problem's own
    tests in the sandbox (all siblings at once, through the task, so the trainer's final scoring
    reuses the verdicts);
  * a node is **solved** when every test passes; its **score** is the task's reward (1/0, or the
    pass fraction with the task's ``reward: fraction``);
  * a failed node's children see its program and then its execution feedback
    (:func:`teamrl.domains.code.code.feedback`): the failing test's input, expected and actual output,
    or the exception type and trimmed traceback, or the limit that stopped it; a reply without a
    code block is told so.

As in ``math_tree``, every node's Step carries ``tree``, ``parent`` and ``depth`` for the ``tree``
advantage scope; the episode's answer is the first solved node's program (else the last node's).

Left out: MARS2's path-level reward shaping (as in ``math_tree``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from teamrl.domains.code.code import Verdict, extract_code, feedback
from teamrl.domains.code.code_exec import CodeTask, code_task_of, run_round
from teamrl.tasks.base import Problem, Task
from teamrl.team.agents import Parsed, register_agent
from teamrl.team.registry import register_workflow
from teamrl.team.team import Reply, Team
from teamrl.team.tree import TreeConfig, best_node, grow_tree, tree_calls

__all__ = ["CodeTreeConfig", "code_tree", "refine_prompt"]


@register_agent("code_refiner", system_prompt="You are a careful Python programmer. When a program fails its tests, "
                "find the bug from what the run shows and write the corrected program in one ```python code block.")
def parse_refined_program(text: str) -> Parsed:
    """Default code refiner parser: the reply's last ```python block (valid when there is one)."""
    code = extract_code(text)
    return Parsed(code, valid=code is not None)


@dataclass(kw_only=True)
class CodeTreeConfig(TreeConfig):
    """Options of ``code_tree``: the tree's (:class:`~teamrl.team.tree.TreeConfig`), agents writing programs."""

    agents: list[str] = field(default_factory=lambda: ["coder", "code_refiner"])
    """Agents that expand the tree (each must be in the team's agents); the order is the round-robin order."""


def refine_prompt(verdict: Verdict | None, answer_format: str) -> str:
    """What a child is told about its failed parent's program (the user turn after the parent's reply).

    >>> print(refine_prompt(Verdict("failed", 1, 2, 1, "assert add(2, 2) == 4", "4", "5"), "Use a code block."))
    This program fails its tests. Failed test 2 of 2 (1 passed).
    Input: assert add(2, 2) == 4
    Expected: 4
    Got: 5
    Find the bug and write the corrected program. Use a code block.
    """
    said = "The reply has no ```python code block, so there is no program to run." if verdict is None \
        else f"This program fails its tests. {feedback(verdict)}"
    return f"{said}\nFind the bug and write the corrected program. {answer_format}"


async def _judge(task: CodeTask, problem: Problem, replies: list[Reply]) -> list[tuple[float, bool, str]]:
    """(score, solved, feedback) of sibling replies, their programs run together (with other episodes' runs)."""
    verdicts = await run_round().hidden(task, problem, [r.value if r.valid else None for r in replies])
    out = []
    for v in verdicts:
        score = 0.0 if v is None else v.fraction if task.cfg.reward == "fraction" else float(v.ok)
        out.append((score, v is not None and v.ok, refine_prompt(v, task.answer_format)))
    return out


@register_workflow("code_tree", config=CodeTreeConfig, agents=("coder", "code_refiner"), neutral={},
                   calls=tree_calls, calls_share_prompt=True)
async def code_tree(team: Team, problem: Problem, task: Task, cfg: CodeTreeConfig) -> str | None:
    """Expand a search tree of programs over ``problem``, each refinement shown its parent's run; returns the best."""
    ctask = code_task_of(task, "code_tree")
    nodes = await grow_tree(team, cfg, seed=f"{cfg.seed}:{problem.id}:{team.episode.index}",
                            ask=[{"role": "user", "content": f"{problem.question}\n{ctask.answer_format}"}],
                            parse=parse_refined_program, evaluate=lambda replies: _judge(ctask, problem, replies))
    return best_node(team, nodes, cfg.agents).reply.text
