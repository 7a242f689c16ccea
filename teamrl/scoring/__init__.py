"""Everything between rollout and update: credit, reward terms, advantages, per-token advantage terms
and selection, as registered stages.

:class:`~teamrl.scoring.scorer.Scorer` is built once from ``cfg.algo`` and the run's
:class:`~teamrl.scoring.stages.Context`; ``Scorer.score(episodes, problems, step)`` returns the scored
steps, the steps to train on and the metrics. A new method is a stage class registered with
:func:`~teamrl.scoring.stages.register_stage` (docs/scoring.md).

This package imports the built-in stages' modules so that they register.
"""

from __future__ import annotations

from teamrl.scoring import advantages, c3, credit, distill, distill_jsd, rewards, selection  # noqa: F401  (they register their stages)
from teamrl.scoring.scorer import Scored, Scorer, assign, score_steps
from teamrl.scoring.stages import STAGES, Context, Stage, register_stage, stage_errors

__all__ = ["STAGES", "Context", "Scored", "Scorer", "Stage", "assign", "register_stage", "score_steps", "stage_errors"]
