"""A single-turn verifiers environment built in code: small additions and subtractions, no download.

``load_environment(n=..., seed=..., max_value=...)`` returns a ``vf.SingleTurnEnv`` whose dataset is made here (the
last ``n_eval`` rows are its eval dataset); its rubric gives 1.0 when the reply's last number is the answer and 0.2
times the parser's format reward (the answer inside ``<answer></answer>``). Written against verifiers' own API, so
it runs unchanged under ``vf-eval``; teamrl trains it with ``configs/verifiers_arith.yaml``.
"""

from __future__ import annotations

import random
import re

import verifiers as vf
from datasets import Dataset

SYSTEM = "Solve the problem. Give the final number inside <answer></answer>."


def make_rows(n: int, seed: int, max_value: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b, op = rng.randint(0, max_value), rng.randint(0, max_value), rng.choice("+-")
        rows.append({"question": f"What is {a} {op} {b}?", "answer": str(a + b if op == "+" else a - b)})
    return rows


def last_number(text: str) -> str | None:
    found = re.findall(r"-?\d+", text)
    return found[-1] if found else None


def load_environment(n: int = 600, n_eval: int = 100, seed: int = 0, max_value: int = 10) -> vf.Environment:
    rows = make_rows(n + n_eval, seed, max_value)
    parser = vf.XMLParser(["answer"], answer_field="answer")

    def correct(completion, answer, **kwargs) -> float:
        replies = parser.get_assistant_messages(completion)
        text = str(replies[-1].content or "") if replies else ""
        return 1.0 if last_number(text) == answer else 0.0

    rubric = vf.Rubric(funcs=[correct, parser.get_format_reward_func()], weights=[1.0, 0.2], parser=parser)
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows[:n]), eval_dataset=Dataset.from_list(rows[n:]),
                            system_prompt=SYSTEM, parser=parser, rubric=rubric)
