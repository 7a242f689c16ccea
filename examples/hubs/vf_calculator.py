"""A tool verifiers environment built in code: arithmetic with a calculator tool the environment runs.

``vf.ToolEnv`` with one tool, ``calculate(a, op, b)``: the model's tool calls are executed by the environment, and
their results come back as tool messages in the next turn. The rubric: 1.0 when the final reply's last number is
the answer; the tool-call counts of verifiers' ToolMonitorRubric are logged with weight 0.
"""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset

from examples.hubs.vf_arith import last_number, make_rows

SYSTEM = "Use the calculate tool, then give the final number."


def calculate(a: int, op: str, b: int) -> int:
    """Apply op ('+' or '-') to a and b.

    Args:
        a: the first number.
        op: '+' or '-'.
        b: the second number.
    """
    if op not in ("+", "-"):
        raise ValueError(f"op must be '+' or '-', got {op!r}")
    return a + b if op == "+" else a - b


def load_environment(n: int = 400, n_eval: int = 50, seed: int = 0, max_value: int = 50,
                     max_turns: int = 3) -> vf.Environment:
    rows = make_rows(n + n_eval, seed, max_value)
    parser = vf.Parser()

    def correct(completion, answer, **kwargs) -> float:
        replies = parser.get_assistant_messages(completion)
        return float(bool(replies) and last_number(str(replies[-1].content or "")) == answer)

    rubric = vf.Rubric(funcs=[correct], parser=parser)
    return vf.ToolEnv(tools=[calculate], dataset=Dataset.from_list(rows[:n]), eval_dataset=Dataset.from_list(rows[n:]),
                      system_prompt=SYSTEM, parser=parser, rubric=rubric, max_turns=max_turns)
