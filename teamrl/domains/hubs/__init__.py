"""Environment hubs: verifiers environments and OpenEnv environments, each behind an extra (docs/hubs.md).

* :mod:`.verifiers_env`: ``task.name: verifiers`` (an environment from ``load_environment(**env_args)``: its dataset
  as the problems, its rubric as the reward) and the ``verifiers`` workflow that runs the environment's own rollout
  with teamrl's OpenAI-compatible endpoint as the model, so every call is a Step of the agent its model name maps to.
* :mod:`.verifiers_v1`: ``task.name: verifiers_v1`` and its workflow: verifiers' v1 stack (0.4), a taskset's tasks
  played by an Env's seats (``Env.run(task, agents)``), each seat's calls Steps of its own agent.
* :mod:`.openenv_env`: ``task.name: openenv``, an OpenEnv environment (in-process, or a server already running at a
  URL) under teamrl's environment contract (:mod:`teamrl.tasks.env`), driven by the environment workflows.

Neither package is imported until its task is chosen.
"""

TASKS: tuple[str, ...] = ("verifiers_env", "verifiers_v1", "openenv_env")
"""Modules that register this domain's tasks (imported on first lookup)."""
WORKFLOWS: tuple[str, ...] = ("verifiers_env", "verifiers_v1")
"""Modules that register this domain's workflows."""
