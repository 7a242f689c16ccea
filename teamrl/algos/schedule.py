"""The learning-rate schedule: a factor of the base rate at a position counted in training steps.

The schedule's length is ``train.steps`` training steps, whatever the number of optimizer steps in each
(``loss.mini_batch_rows``, ``loss.updates_per_batch``). ``models.<m>.optim.schedule_style`` says how the
originals lay it out:

* ``teamrl`` (default) and ``verl``: one position per training step; every optimizer step of training step t runs
  at the rate of position t (verl steps its scheduler once per ``update_actor`` call, after all mini-batches).
* ``openrlhf``: one position per optimizer step over the run's optimizer steps (OpenRLHF and MARTI step the
  scheduler after every optimizer step, the schedule sized in optimizer steps); optimizer step j of n in training
  step t runs at position t + j / n, the same point of the run when every training step has n optimizer steps.

The schedule's length T is ``train.steps``, or ``optim.schedule_steps`` training steps where an original sizes its
schedule otherwise (MARTI sizes it in one sample per prompt, about a quarter of the optimizer steps it takes).
Warm-up over ``W`` positions (``warmup_steps``, or ``warmup_ratio`` x T):

* ``teamrl``: (p + 1) / (W + 1), never 0;
* ``verl``: linear from ``min_lr_ratio`` (cosine) or 0 (constant) at p = 0 to 1 at p = W
  (``verl.utils.torch_functional``'s schedules), W = int(warmup_ratio x T) when given as a ratio;
* ``openrlhf``: p / W from 0 (transformers' ``cosine_with_min_lr``), W = warmup_ratio x T positions (OpenRLHF's
  ceil(ratio x optimizer steps) optimizer steps, to within one optimizer step).

After it, ``cosine`` falls from 1 to ``min_lr_ratio``: m + (1 - m) x (1 + cos(pi x progress)) / 2, progress =
(p - W) / max(1, T - W). ``teamrl`` holds the floor past T; ``verl`` and ``openrlhf`` compute the cosine on past T as
their originals do (it rises back to 1 at progress 2 and repeats; verl keeps at least the floor). ``constant``
stays at 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

STYLES = ("teamrl", "verl", "openrlhf")


@dataclass(frozen=True)
class Schedule:
    """A resolved schedule: its shape, style, length in training steps and warm-up in positions."""

    shape: str = "constant"  # constant | cosine
    style: str = "teamrl"
    total: int = 1
    warmup: float = 0.0
    min_lr_ratio: float = 0.0

    @property
    def per_optimizer_step(self) -> bool:
        """Whether each optimizer step has its own position (``openrlhf``), not each training step."""
        return self.style == "openrlhf"


def warmup_positions(style: str, total: int, *, steps: int = 0, ratio: float = 0.0) -> float:
    """The warm-up length: ``steps`` when set, else ``ratio`` x ``total`` (rounded down under ``verl``, as verl
    rounds it; in optimizer steps under ``openrlhf``, whose ceil of optimizer steps this is to within one).

    >>> warmup_positions("verl", 200, ratio=0.03), round(warmup_positions("openrlhf", 200, ratio=0.03), 9)
    (6, 6.0)
    >>> warmup_positions("verl", 50, ratio=0.03), warmup_positions("openrlhf", 50, ratio=0.03)
    (1, 1.5)
    """
    if steps:
        return steps
    if not ratio:
        return 0
    return ratio * total if style == "openrlhf" else int(ratio * total)


def lr_factor(s: Schedule, position: float) -> float:
    """The learning rate's factor of its base value at ``position`` (module docstring).

    >>> round(lr_factor(Schedule("cosine", total=4), 2), 6)   # half-way through a cosine without floor
    0.5
    >>> lr_factor(Schedule("cosine", "verl", total=10, warmup=2, min_lr_ratio=0.3), 0)   # verl's warm-up from the floor
    0.3
    >>> lr_factor(Schedule("constant", "teamrl", total=10, warmup=3), 0)   # (0 + 1) / (3 + 1)
    0.25
    """
    w = s.warmup
    if position < w:
        if s.style == "teamrl":
            return (position + 1) / (w + 1)
        start = s.min_lr_ratio if s.style == "verl" and s.shape == "cosine" else 0.0
        return start + (1.0 - start) * position / w
    if s.shape != "cosine":
        return 1.0
    progress = (position - w) / max(1.0, s.total - w)
    m = s.min_lr_ratio
    if s.style == "teamrl":
        progress = min(1.0, progress)
    factor = m + (1.0 - m) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return max(m, factor) if s.style == "verl" else max(0.0, factor)


def positions(s: Schedule, step: int, optimizer_steps: int) -> list[float]:
    """The position of each of the ``optimizer_steps`` optimizer steps of training step ``step``.

    >>> positions(Schedule(style="verl"), 3, 4), positions(Schedule(style="openrlhf"), 3, 4)
    ([3, 3, 3, 3], [3.0, 3.25, 3.5, 3.75])
    """
    if not s.per_optimizer_step:
        return [step] * optimizer_steps
    return [step + j / optimizer_steps for j in range(optimizer_steps)]


def curve(s: Schedule, fractions: tuple[float, ...] = (0.0, 0.1, 0.5, 0.9, 1.0),
          steps: int | None = None) -> list[tuple[float, float]]:
    """(fraction of training, factor) at each fraction: the position of training step round(fraction x (steps - 1)),
    its first optimizer step (``--dry-run``'s schedule line; 100% is the last training step). ``steps``: the run's
    training steps (default: the schedule's length).

    >>> [(f, round(x, 3)) for f, x in curve(Schedule("cosine", total=11))]
    [(0.0, 1.0), (0.1, 0.98), (0.5, 0.571), (0.9, 0.079), (1.0, 0.02)]
    """
    n = s.total if steps is None else steps
    return [(f, lr_factor(s, round(f * (n - 1)))) for f in fractions]
