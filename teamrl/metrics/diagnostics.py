"""Stability diagnostics computed from a training batch: amplification factors, gradient spikes, pass@k; win, draw
and loss rates of games with Wilson intervals.

Definitions (with worked examples) are in ``docs/diagnostics.md``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def amplification_factors(rewards: Sequence[float], groups: Sequence[int], agents: Sequence[str]) -> dict[str, float]:
    """Lemma 4.2 amplification factor of each agent, averaged over prompt groups.

    Within prompt group g (all rows, i.e. steps, of one problem), with population statistics
    μ, σ² over every row and μ_k, σ_k² over agent k's rows:
    ``F_k,g = (σ_k² + (μ_k − μ)²) / σ²``, the mean square of agent k's globally normalized
    advantages ((r − μ)/σ)². ``F_k`` is the mean of ``F_k,g`` over the groups with σ² > 0 in
    which agent k has rows; an agent with no such group is left out.

    ``F`` does not change when a group's rewards are all multiplied by one factor, so each group is
    divided by its largest ``|r|`` first: rewards up to the float maximum (1e308) give the same
    factors as small ones instead of overflowing. A group with a non-finite reward is left out.

    >>> amplification_factors([1, 0, 1, 1], [0, 0, 0, 0], ["a", "b", "a", "b"])
    {'a': 0.3333333333333333, 'b': 1.6666666666666667}
    >>> amplification_factors([1e308, -1e308, 1e308, 1e308], [0, 0, 0, 0], ["a", "b", "a", "b"])
    {'a': 0.3333333333333333, 'b': 1.6666666666666667}
    """
    if not len(rewards) == len(groups) == len(agents):
        raise ValueError(f"rewards, groups and agents must have one entry per row; got {len(rewards)}, "
                         f"{len(groups)}, {len(agents)}")
    per_group: dict[int, list[tuple[float, str]]] = {}
    for r, g, a in zip(rewards, groups, agents):
        per_group.setdefault(g, []).append((float(r), a))
    found: dict[str, list[float]] = {}
    for raw in per_group.values():
        scale = max(abs(r) for r, _ in raw)
        if not (math.isfinite(scale) and scale > 0):
            continue
        rows = [(r / scale, a) for r, a in raw]  # in [-1, 1]
        mu = statistics.fmean(r for r, _ in rows)
        var = statistics.fmean((r - mu) ** 2 for r, _ in rows)
        if var <= 0:
            continue
        for agent in sorted({a for _, a in rows}):
            mine = [r for r, a in rows if a == agent]
            found.setdefault(agent, []).append(statistics.fmean((r - mu) ** 2 for r in mine) / var)
    return {a: statistics.fmean(v) for a, v in sorted(found.items())}


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 − C(n−c, k) / C(n, k).

    >>> pass_at_k(4, 1, 2)
    0.5
    >>> pass_at_k(4, 0, 4), pass_at_k(4, 1, 4)
    (0.0, 1.0)
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}; "
                         f"draw at least k samples per problem")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def eval_scores(rewards_by_problem: Sequence[Sequence[float]]) -> dict[str, float]:
    """avg@n (mean reward of all samples) and pass@1..n (mean over problems), n samples per problem.

    A sample counts as correct when its reward is > 0.

    >>> eval_scores([[1.0, 0.0], [0.0, 0.0]])
    {'accuracy': 0.25, 'pass@1': 0.25, 'pass@2': 0.5}
    """
    if not rewards_by_problem:
        raise ValueError("no evaluation problems; check eval.problems and the task's test split")
    n = min(len(v) for v in rewards_by_problem)
    if n != max(len(v) for v in rewards_by_problem) or n == 0:
        raise ValueError("every problem needs the same number (>= 1) of samples for pass@k")
    correct = [sum(r > 0 for r in v) for v in rewards_by_problem]
    out = {"accuracy": statistics.fmean(r for v in rewards_by_problem for r in v)}
    out |= {f"pass@{k}": statistics.fmean(pass_at_k(n, c, k) for c in correct) for k in range(1, n + 1)}
    return out


@dataclass
class SpikeCounter:
    """Counts gradient-norm spikes: a value above ``factor`` × the median of the previous ``window`` values.

    Each metric name has its own history. Only finite values > 0 enter the history (a step with no
    trained rows has norm 0); a value is judged once at least ``min_history`` earlier values exist.

    >>> sc = SpikeCounter(factor=3.0, window=3, min_history=2)
    >>> [sc.observe("g", v) for v in (1.0, 2.0, 4.0, 4.9, 13.0)]
    [False, False, False, False, True]
    >>> sc.counts
    {'g': 1}
    """

    factor: float = 3.0
    window: int = 20
    min_history: int = 3
    history: dict[str, list[float]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.factor <= 1:
            raise ValueError(f"spike factor {self.factor} must be > 1 (a spike is a norm above factor x running median)")
        if self.window < 1:
            raise ValueError(f"spike window {self.window} must be >= 1 step")

    def observe(self, name: str, value: float) -> bool:
        """Record ``value`` of metric ``name``; returns whether it is a spike (and counts it)."""
        past = self.history.setdefault(name, [])
        self.counts.setdefault(name, 0)
        if not (math.isfinite(value) and value > 0):
            return False
        spike = len(past) >= min(self.min_history, self.window) and value > self.factor * statistics.median(past)
        self.counts[name] += spike
        past.append(value)
        del past[: -self.window]
        return spike

    def metrics(self, values: dict[str, float]) -> dict[str, float]:
        """Observe every ``*grad_norm`` entry of ``values``; returns ``<prefix>/grad_spike`` (0/1) and ``grad_spikes`` (total)."""
        out = {}
        for key in sorted(k for k in values if k.endswith("/grad_norm")):
            prefix = key[: -len("grad_norm")]
            out[prefix + "grad_spike"] = float(self.observe(key, values[key]))
            out[prefix + "grad_spikes"] = float(self.counts[key])
        return out

    def summary(self) -> dict[str, dict[str, int]]:
        """Spike counts per agent and per model, for summary.json."""
        out: dict[str, dict[str, int]] = {"agents": {}, "models": {}}
        for key, n in sorted(self.counts.items()):
            kind, name = key.split("/")[:2]
            out["agents" if kind == "agent" else "models"][name] = n
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"history": {k: list(v) for k, v in self.history.items()}, "counts": dict(self.counts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = {k: list(v) for k, v in state["history"].items()}
        self.counts = dict(state["counts"])


def wilson(successes: int, n: int, *, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a rate (95% with z = 1.96).

    >>> [round(x, 4) for x in wilson(5, 10)]
    [0.2366, 0.7634]
    >>> wilson(0, 0)
    (0.0, 1.0)
    """
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def outcome_rates(outcomes: list[str]) -> dict[str, Any]:
    """Win, draw and loss rates of ``outcomes`` with Wilson 95% intervals.

    >>> outcome_rates(["win", "loss", "win", "draw"])["win"]
    {'rate': 0.5, 'low': 0.15, 'high': 0.85, 'count': 2}
    """
    n = len(outcomes)
    out: dict[str, Any] = {"games": n}
    for key in ("win", "draw", "loss"):
        k = outcomes.count(key)
        low, high = wilson(k, n)
        out[key] = {"rate": k / n if n else 0.0, "low": round(low, 4), "high": round(high, 4), "count": k}
    return out
