"""A multi-turn verifiers environment built in code: guess a hidden number from 1 to ``high``, told higher or lower.

``vf.MultiTurnEnv`` with ``env_response`` answering each guess; the rollout ends when the guess is right or after
``max_turns`` guesses. The rubric: 1.0 for finding the number, plus 0.5 times the share of guesses left unused.
"""

from __future__ import annotations

import random

import verifiers as vf
from datasets import Dataset

from examples.hubs.vf_arith import last_number

SYSTEM = "Guess the hidden number. Reply with one number per turn."


class GuessEnv(vf.MultiTurnEnv):
    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs) -> vf.Messages:
        guess, target = last_number(str(messages[-1].content or "")), int(state["answer"])
        if guess is None:
            return [vf.UserMessage(content="No number found. Reply with one number.")]
        if int(guess) == target:
            state["found"] = True
            state["final_env_response"] = [vf.UserMessage(content="Correct!")]
            return state["final_env_response"]
        return [vf.UserMessage(content="Higher." if int(guess) < target else "Lower.")]


def load_environment(n: int = 400, n_eval: int = 50, high: int = 8, max_turns: int = 4,
                     seed: int = 0) -> vf.Environment:
    rng = random.Random(seed)
    rows = [{"question": f"I picked a whole number from 1 to {high}. Guess it.", "answer": str(rng.randint(1, high))}
            for _ in range(n + n_eval)]

    def found(state, **kwargs) -> float:
        return float(bool(state.get("found")))

    def unused_turns(state, **kwargs) -> float:
        return (max_turns - len(state["trajectory"])) / max_turns if state.get("found") else 0.0

    rubric = vf.Rubric(funcs=[found, unused_turns], weights=[1.0, 0.5])
    return GuessEnv(dataset=Dataset.from_list(rows[:n]), eval_dataset=Dataset.from_list(rows[n:]),
                    system_prompt=SYSTEM, rubric=rubric, max_turns=max_turns)
