"""teamrl's configuration: one typed, documented, closed schema.

A run is configured by a YAML file plus ``key=value`` overrides (dotted keys). Every field is
documented below (``teamrl train --help-config`` prints them all); unknown keys are errors with
a suggestion, and all errors are reported together (see :mod:`teamrl.config.tools`).

Plug-ins bring their own options: ``task.<name>`` and ``workflow.<name>`` are validated against
the config class each task and workflow registered (built-in ones and those of an ``--import``
file alike), and ``models.<m>.engine`` is interpreted by :mod:`teamrl.engines.registry`, which
also holds the engines' options and rules. The per-model sections live in
:mod:`teamrl.config.model`; rules across sections (agents mapped to existing models, the workflow's
agents all present, a known advantage estimator) are checked in :meth:`Config.__post_init__`, most
of them by the functions of :mod:`teamrl.config.rules`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from teamrl.config import tools as configtools
from teamrl.config.model import LoraConfig, ModelConfig, OptimConfig, PlacementConfig, RayConfig
from teamrl.config.names import name_errors
from teamrl.config.rules import (
    apply_objective,
    assignment_errors,
    backend_errors,
    count_errors,
    fidelity_errors,
    hub_errors,
    prefix_tree_errors,
    schedule_errors,
    scoring_errors,
    selected_errors,
    tree_sampling_errors,
    workflow_errors,
)
from teamrl.config.sections import (
    AgentConfig,
    AlgoConfig,
    EvalConfig,
    LossConfig,
    RewardAllocConfig,
    RolloutConfig,
    ShapleyConfig,
    TaskConfig,
    TrainConfig,
    WorkflowConfig,
)
from teamrl.engines.registry import engine_errors
from teamrl.tasks.base import task_configs
from teamrl.team.registry import workflow_configs

__all__ = ["AgentConfig", "AlgoConfig", "Config", "EvalConfig", "LoraConfig", "LossConfig", "ModelConfig",
           "OptimConfig", "PlacementConfig", "RayConfig", "RewardAllocConfig", "RolloutConfig", "ShapleyConfig", "TaskConfig",
           "TrainConfig", "WorkflowConfig", "help_config", "load_config", "task_options", "workflow_options"]


@dataclass(kw_only=True)
class Config:
    run_dir: str = "runs/quickstart"
    """Where the run writes config, metrics, transcripts, TensorBoard events and checkpoints."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """The problems and their reward."""
    workflow: WorkflowConfig = field(default_factory=WorkflowConfig)
    """How the team works on one problem."""
    models: dict[str, ModelConfig] = field(default_factory=lambda: {"main": ModelConfig()})
    """Physical models by name."""
    agents: dict[str, AgentConfig] = field(default_factory=lambda: {"solver": AgentConfig(), "verifier": AgentConfig()})
    """Agents by name, each mapped to a model."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Credit assignment and advantage estimation."""
    loss: LossConfig = field(default_factory=LossConfig)
    """Policy loss."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Episodes per step."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Training loop."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation before, during (eval.every) and after training."""
    backend: Literal["local", "ray"] = "local"
    """Where models run. local: everything in this process (the embedded default). ray: each model's engine and learner are Ray actors placed by models.<name>.placement (docs/scale-out.md; pip install ray)."""
    ray: RayConfig = field(default_factory=RayConfig)
    """The Ray cluster of backend: ray."""

    def __post_init__(self) -> None:
        apply_objective(self)
        errors = []
        for name, a in self.agents.items():
            if a.model not in self.models:
                errors.append(f"agents.{name}.model: {a.model!r} is not in models ({', '.join(self.models)}); add it under models or pick one of those")
        errors += assignment_errors(self.models, self.agents) + name_errors(self, configtools.written(), configtools.sources())
        for name, mc in self.models.items():
            errors += engine_errors(name, mc)
        errors += backend_errors(self)
        errors += workflow_errors(self, self.workflow.name, "workflow.name")
        errors += scoring_errors(self)  # every scoring stage's own rules (teamrl.scoring)
        errors += schedule_errors(self) + count_errors(self) + fidelity_errors(self)
        errors += tree_sampling_errors(self) + hub_errors(self) + prefix_tree_errors(self)
        if self.eval.workflow is not None:
            errors += workflow_errors(self, self.eval.workflow, "eval.workflow")
        errors += selected_errors(self.task, "task.name")
        for key in ("batch_size", "group_size"):
            if getattr(self.rollout, key) < 1:
                errors.append(f"rollout.{key} must be >= 1, got {getattr(self.rollout, key)}")
        if self.eval.samples < 1:
            errors.append(f"eval.samples {self.eval.samples} must be >= 1")
        if self.eval.every < 0:
            errors.append(f"eval.every {self.eval.every} must be >= 0 (0 = off; N evaluates every N training steps)")
        elif self.eval.every > self.train.steps >= 0:  # negative steps: count_errors names train.steps
            errors.append(f"eval.every {self.eval.every} is more than train.steps {self.train.steps}, so no evaluation "
                          f"would run along the way; lower eval.every or set it to 0")
        if self.train.spike_factor <= 1:
            errors.append(f"train.spike_factor {self.train.spike_factor} must be > 1 (a spike is a gradient norm above "
                          f"this multiple of the running median); the usual value is 3")
        if self.train.spike_window < 1:
            errors.append(f"train.spike_window {self.train.spike_window} must be >= 1 step; the usual value is 20")
        if len(set(self.train.loggers)) != len(self.train.loggers) or self.train.log_samples_every < 0:
            errors.append(f"train.loggers {self.train.loggers} must name each tracker once and "
                          f"train.log_samples_every {self.train.log_samples_every} must be >= 0")
        if self.loss.logits_chunk_tokens < 0:
            errors.append(f"loss.logits_chunk_tokens {self.loss.logits_chunk_tokens} must be >= 0 (0: all at once)")
        if self.loss.micro_batch_tokens != "auto" and self.loss.micro_batch_tokens < 1:
            errors.append(f"loss.micro_batch_tokens {self.loss.micro_batch_tokens} must be >= 1")
        if errors:
            raise configtools.ConfigError(errors)


def task_options(cfg: TaskConfig) -> Any:
    """The selected task's options, as its factory takes them (its config object, or a mapping)."""
    return cfg.selected


def workflow_options(cfg: WorkflowConfig) -> Any:
    """The selected workflow's options (an instance of the config class it registered)."""
    return cfg.selected


def help_config() -> str:
    """``teamrl train --help-config``: every key with its type, default and documentation; the keys that name a
    registry entry (task, workflow, advantage estimator) list what is registered now, built-in or imported."""
    from teamrl.algos.estimators import PRESETS

    return configtools.describe(Config, registered={
        "task.name": task_configs(), "workflow.name": workflow_configs(), "eval.workflow": workflow_configs(),
        "algo.estimator": PRESETS})


def load_config(path: str | os.PathLike | None, overrides: Sequence[str] = ()) -> Config:
    """Load a YAML config file (or defaults when ``path`` is None) with ``key=value`` overrides."""
    return configtools.load(Config, path, overrides)
