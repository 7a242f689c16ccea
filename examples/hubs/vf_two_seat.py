"""A two-seat verifiers environment: a solver answers, a checker reads that answer and gives the final one.

Written in verifiers' own API (a ``vf.MultiTurnEnv`` whose turns alternate between two model names), because the
classic stack has no multi-agent environment: turn 0 asks model ``solver``, turn 1 asks model ``checker`` with the
question and the solver's reply; teamrl maps the two names to two agents (``workflow.verifiers.models``). The
rubric scores the checker's final number (weight 1.0) and the solver's own (weight 0.5), both logged as metrics.
"""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset

from examples.hubs.vf_arith import last_number, make_rows

SOLVER = "Solve the problem. End with the final number."
CHECKER = "Check the proposed answer to the problem. Reply with the correct final number only."


class TwoSeatEnv(vf.MultiTurnEnv):
    """Turns alternate between the models named in ``seats``; each seat sees its own messages."""

    def __init__(self, seats: tuple[str, str] = ("solver", "checker"), **kwargs):
        super().__init__(max_turns=2, **kwargs)
        self.seats = seats

    async def get_prompt_messages(self, state: vf.State) -> vf.Messages:
        if not state["trajectory"]:
            return state["prompt"]
        question = state["prompt"][-1].content
        proposed = state["trajectory"][0]["completion"][-1].content
        return [vf.SystemMessage(content=CHECKER),
                vf.UserMessage(content=f"Problem: {question}\nProposed answer: {proposed}")]

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs) -> vf.Messages:
        return []  # get_prompt_messages builds each seat's view

    async def render_completion(self, state: vf.State) -> None:
        state["completion"] = [m for step in state["trajectory"] for m in step["completion"]]

    async def get_model_response(self, state: vf.State, prompt: vf.Messages, **kwargs):
        seat = self.seats[len(state["trajectory"]) % len(self.seats)]
        return await super().get_model_response(state, prompt, model=seat, **kwargs)


def load_environment(n: int = 600, n_eval: int = 100, seed: int = 0, max_value: int = 10) -> vf.Environment:
    rows = make_rows(n + n_eval, seed, max_value)
    parser = vf.Parser()

    def checker_correct(completion, answer, **kwargs) -> float:
        replies = parser.get_assistant_messages(completion)
        return float(len(replies) == 2 and last_number(str(replies[1].content or "")) == answer)

    def solver_correct(completion, answer, **kwargs) -> float:
        replies = parser.get_assistant_messages(completion)
        return float(bool(replies) and last_number(str(replies[0].content or "")) == answer)

    rubric = vf.Rubric(funcs=[checker_correct, solver_correct], weights=[1.0, 0.5], parser=parser)
    return TwoSeatEnv(dataset=Dataset.from_list(rows[:n]), eval_dataset=Dataset.from_list(rows[n:]),
                      system_prompt=SOLVER, parser=parser, rubric=rubric)
