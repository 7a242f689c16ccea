"""Your own data and reward in one file: capitals of countries, scored by a reward function.

The rows are ``train.jsonl`` and ``test.jsonl`` beside this file (a question, its answer and one more column,
``country``, which the reward gets by name). Train a solver on them (docs/own-task.md)::

    teamrl train examples/own_task/capitals.yaml --import examples/own_task/capitals.py

The same, from Python::

    import runpy, teamrl
    runpy.run_path("examples/own_task/capitals.py")        # registers the task
    cfg = teamrl.load_config("examples/own_task/capitals.yaml", ["train.steps=1"])
    teamrl.Trainer(cfg).train()
"""

from __future__ import annotations

from pathlib import Path

import teamrl

HERE = Path(__file__).parent


def reward(*, completion: str, answer: str, country: str, **columns) -> float:
    """1.0 when the reply's last line names the capital, 0.5 when it names it elsewhere, else 0.0.

    >>> reward(completion="Its capital is\\nParis", answer="Paris", country="France")
    1.0
    >>> reward(completion="Paris, I think. Or Lyon.", answer="Paris", country="France")
    0.5
    """
    lines = [line.strip() for line in completion.lower().splitlines() if line.strip()]
    if lines and answer.lower() in lines[-1]:
        return 1.0
    return 0.5 if answer.lower() in completion.lower() else 0.0


teamrl.register_data_task("capitals", reward, train=HERE / "train.jsonl", test=HERE / "test.jsonl",
                          answer_format="Give the name of the capital on the last line.")
