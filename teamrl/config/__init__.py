"""teamrl's configuration, in one package, bottom to top:

* :mod:`teamrl.config.tools`: generic typed-dataclass tools (validation, YAML, overrides, docs); knows nothing of teamrl.
* :mod:`teamrl.config.model`: the ``models.<name>`` and ``ray`` sections (with :func:`~teamrl.config.model.check_device`;
  :mod:`teamrl.hardware` resolves devices on top of it).
* :mod:`teamrl.config.rules`: rules across sections.
* :mod:`teamrl.config.schema`: the whole schema (:class:`Config`) and :func:`load_config`; what ``models.<m>.engine``
  means (its options and rules) is :mod:`teamrl.engines.registry`'s, imported one way (the registry names the
  config's classes in annotations only).
* :mod:`teamrl.config.files`: the config files shipped inside the package.

``from teamrl.config import Config, load_config`` keeps working: the names of :mod:`teamrl.config.schema` are
exported here lazily (importing a submodule such as :mod:`teamrl.config.tools` does not load the schema).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    if importlib.util.find_spec(f"{__name__}.{name}") is not None:  # a submodule (``from teamrl.config import tools``)
        return importlib.import_module(f"{__name__}.{name}")
    schema = importlib.import_module("teamrl.config.schema")
    try:
        value = getattr(schema, name)
    except AttributeError:
        raise AttributeError(f"module 'teamrl.config' has no attribute {name!r}") from None
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from teamrl.config.schema import (
        AgentConfig,
        AlgoConfig,
        Config,
        EvalConfig,
        LoraConfig,
        LossConfig,
        ModelConfig,
        OptimConfig,
        PlacementConfig,
        RayConfig,
        RewardAllocConfig,
        RolloutConfig,
        ShapleyConfig,
        TaskConfig,
        TrainConfig,
        WorkflowConfig,
        load_config,
        task_options,
        workflow_options,
    )

    __all__ = ["AgentConfig", "AlgoConfig", "Config", "EvalConfig", "LoraConfig", "LossConfig", "ModelConfig",
               "OptimConfig", "PlacementConfig", "RayConfig", "RewardAllocConfig", "RolloutConfig", "ShapleyConfig",
               "TaskConfig", "TrainConfig", "WorkflowConfig", "load_config", "task_options", "workflow_options"]
