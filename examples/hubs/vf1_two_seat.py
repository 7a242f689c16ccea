"""A two-seat verifiers v1 Env written in verifiers' own v1 API (``verifiers >= 0.4``): a solver, then a checker.

``Env.run(task, agents)`` is the control flow between the seats: the ``solver`` answers the task; the ``checker``
reads the task and the solver's answer and gives the final number. Each seat's run is its own trace, scored by the
task's ``correct`` on its own last reply, so both seats have a reward. Its taskset is ``vf1_sum``'s. teamrl trains
each seat as its own agent with ``configs/verifiers_v1_two_seat.yaml``.
"""

from __future__ import annotations

import verifiers.v1 as vf

try:
    from vf1_sum import SumTaskset
except ImportError:  # imported as examples.hubs.vf1_two_seat
    from examples.hubs.vf1_sum import SumTaskset

__all__ = ["SumTaskset", "TwoSeatEnv"]

CHECK = "{question}\nA student answered: {answer}\nCheck the student's answer. Give the correct final number."


class TwoSeatConfig(vf.EnvConfig):
    solver: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"}, max_turns=1)
    checker: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"}, max_turns=1)


class TwoSeatEnv(vf.Env[TwoSeatConfig]):
    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        first = await agents.solver.run(task)
        prompt = CHECK.format(question=task.data.prompt_text, answer=first.last_reply or "(none)")
        await agents.checker.run(task.with_data(prompt=prompt))
