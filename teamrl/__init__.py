"""teamrl: reinforcement-learning post-training of multi-agent LLM teams.

What a user imports to write a team, a task or a workflow, to run training from Python, or to
plug in an engine, a learner or an advantage estimator is exported here; everything else is
internal and may move. ``import teamrl`` is cheap: each name is imported on first use.

Write a team (see docs/custom-teams.md)::

    from teamrl import Parsed, register_agent, register_workflow

Write a task::

    from teamrl import Problem, register_task

Your own data and reward in one call (see docs/own-task.md)::

    teamrl.register_data_task("capitals", reward, train="train.jsonl", test="test.jsonl")

Train from Python::

    import teamrl
    cfg = teamrl.load_config("configs/quickstart.yaml", ["train.steps=2"])
    teamrl.Trainer(cfg).train()
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from typing import TYPE_CHECKING, Any

# oneDNN, which runs PyTorch's bf16 products on x86 CPUs, keeps the kernel it compiles for each input shape in two
# least-recently-used caches of 1024 entries each (its own primitive cache and PyTorch's ideep cache), read once, at
# the first such product. Rollouts and updates see a new row count at nearly every call, so both fill up: about
# 0.6 MB per entry for SmolLM2-135M's shapes, over 1 GB in all, which a long run holds to its end (docs/memory.md).
# KERNEL_CACHE_ENTRIES keeps a decode step's working set; a variable set in the environment wins.
KERNEL_CACHE_ENTRIES = 64
for _var in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
    os.environ.setdefault(_var, str(KERNEL_CACHE_ENTRIES))

try:
    __version__ = importlib.metadata.version("teamrl")
except importlib.metadata.PackageNotFoundError:  # a source tree that was not installed
    __version__ = "0+unknown"

_EXPORTS: dict[str, str] = {
    # configuration
    "Config": "teamrl.config.schema",
    "load_config": "teamrl.config.schema",
    "ConfigError": "teamrl.config.tools",
    # a team: agents and workflows
    "register_agent": "teamrl.team.agents",
    "Parsed": "teamrl.team.agents",
    "register_workflow": "teamrl.team.registry",
    "Team": "teamrl.team.team",
    "Reply": "teamrl.team.team",
    "Step": "teamrl.team.records",
    "Episode": "teamrl.team.records",
    # tasks
    "register_task": "teamrl.tasks.base",
    "register_data_task": "teamrl.tasks.data",
    "Task": "teamrl.tasks.base",
    "Problem": "teamrl.tasks.base",
    # advantage estimators
    "Estimator": "teamrl.algos.advantages",
    "register_estimator": "teamrl.algos.advantages",
    "compute_advantages": "teamrl.algos.advantages",
    # the contracts of engines and learners, and where they run
    "Engine": "teamrl.engines.base",
    "SteppedEngine": "teamrl.engines.base",
    "GenRequest": "teamrl.engines.base",
    "GenOutput": "teamrl.engines.base",
    "SamplingParams": "teamrl.engines.base",
    "Learner": "teamrl.learner.base",
    "Runtime": "teamrl.runtime",
    # training
    "Trainer": "teamrl.train.trainer",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'teamrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # the same names, for type checkers and editors
    from teamrl.algos.advantages import Estimator, compute_advantages, register_estimator
    from teamrl.config.schema import Config, load_config
    from teamrl.config.tools import ConfigError
    from teamrl.engines.base import Engine, GenOutput, GenRequest, SamplingParams, SteppedEngine
    from teamrl.learner.base import Learner
    from teamrl.runtime import Runtime
    from teamrl.tasks.base import Problem, Task, register_task
    from teamrl.tasks.data import register_data_task
    from teamrl.team.agents import Parsed, register_agent
    from teamrl.team.records import Episode, Step
    from teamrl.team.registry import register_workflow
    from teamrl.team.team import Reply, Team
    from teamrl.train.trainer import Trainer
