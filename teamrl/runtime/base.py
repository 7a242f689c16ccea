"""The :class:`Runtime` record: every physical model's engine and learner, as :func:`teamrl.runtime.build` returns it
(the backends, :mod:`teamrl.runtime.local` and :mod:`teamrl.runtime.distributed`, import it from here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from teamrl.engines.base import Engine
from teamrl.learner.base import Learner
from teamrl.metrics.perf import ModelPerf


@dataclass
class Runtime:
    """Engines and learners by model name; ``modules`` holds the in-process modules (empty with Ray)."""

    engines: dict[str, Engine]
    learners: dict[str, Learner]
    modules: dict[str, torch.nn.Module] = field(default_factory=dict)
    perf: dict[str, ModelPerf] = field(default_factory=dict)
    """Sizes and devices of the models that live in actors, as they reported them (for MFU)."""
    teachers: dict[str, Any] = field(default_factory=dict)
    """Distillation teachers (``algo.distill.teachers``) no local agent's module holds: a frozen module loaded for
    its log-probs alone, or the ``openai`` engine of a served one (``score_tokens``)."""
