"""A scripted engine for the code workflows' tests: each reply is a function of the agent and its prompt."""

from __future__ import annotations

import random
from collections.abc import Callable

from teamrl.domains.code.pyfunc import TEMPLATES, make_problem
from teamrl.engines.base import GenOutput, GenRequest, SamplingParams
from teamrl.tasks.base import Problem, Task
from teamrl.team.agents import get_agent
from teamrl.team.team import AgentBinding, Dispatcher
from teamrl.team.workflows import get_workflow
from teamrl.train.rollout import Rollout
from tests.scripted import ScriptedEngineBase

Script = Callable[[str, str], str]
"""(agent, decoded prompt) -> reply text."""


class CodeEngine(ScriptedEngineBase):
    """Replies by agent (told apart by system prompt) and prompt; records every (agent, prompt)."""

    def __init__(self, tokenizer, agents: list[str], script: Script):
        super().__init__(tokenizer)
        self.agents, self.script, self.calls = agents, script, []

    def generate(self, requests: list[GenRequest], on_progress=None) -> list[GenOutput]:
        outs = []
        for r in requests:
            prompt = self.tokenizer.decode(r.prompt_ids)
            agent = next(a for a in self.agents if get_agent(a).system_prompt in prompt)
            self.calls.append((agent, prompt))
            text = self.script(agent, prompt)
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            outs.append(GenOutput(ids, [-0.5] * len(ids), text, "stop"))
        return outs


def code_rollout(tokenizer, workflow: str, cfg, task: Task, script: Script) -> tuple[Rollout, CodeEngine]:
    """A rollout of ``workflow`` whose agents all answer from ``script``."""
    spec = get_workflow(workflow)
    agents = list(spec.agents_for(cfg))
    eng = CodeEngine(tokenizer, agents, script)
    sp = SamplingParams(temperature=1.0, max_new_tokens=64)
    bindings = {a: AgentBinding(get_agent(a), "m", sp, get_agent(a).system_prompt) for a in agents}
    return Rollout(Dispatcher({"m": eng}), bindings, spec, cfg, task), eng


def add_7() -> Problem:
    """A pyfunc problem: ``add_7(x)`` returns x plus 7."""
    return make_problem(TEMPLATES[0], 7, random.Random(0), pid="add_7", n_tests=4, show_example=False)


def block(code: str) -> str:
    return f"```python\n{code}\n```"
