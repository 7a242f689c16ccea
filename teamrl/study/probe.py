"""``teamrl probe``: paired gradient probes of advantage presets on identical rollout batches.

At one model state and one rollout batch, the estimator presets differ only in the advantages they
give the same rows. So each preset's gradient can be computed on identical data, and differences
between presets carry no sampling noise from different rollouts (the Dr. MAS 2×2: ``grpo``,
``grpo_step``, ``agent_episode``, ``drmas``).

Per seed (``train.seed``) and batch: the configured workflow samples ``rollout.batch_size`` ×
``rollout.group_size`` episodes exactly as a training step does (same sampler, credit, rewards);
then, for every preset, the learner's own gradient (:meth:`TorchLearner.compute_gradients`, the
training update's gradient before clipping; no optimizer step, so the model state never moves)
gives each agent's gradient. One row per (seed, batch, preset, agent) goes to ``probe_rows.jsonl``:
the agent's squared gradient norm, its advantage and reward statistics, the Lemma 4.2 factor
``F_k`` of the batch's rewards (:func:`teamrl.metrics.diagnostics.amplification_factors`) and the
cosine between its gradient under this preset and under every other.

With ``sweep`` (an agent name) the same batches also trace Proposition 4.3: that agent's rewards are
transformed within each prompt group, ``r' = m + scale · (r − m) + shift`` (``m`` its group mean),
and its squared gradient norm under each sweep preset (default ``grpo_step`` and ``drmas``) is
divided by the one under ``drmas`` on the untransformed batch (``sweep_rows.jsonl``); predicted:
``F_k`` of the transformed rewards under ``grpo_step``, 1 under ``drmas``.

:mod:`teamrl.study.probe_report` turns the rows into the report (paired intervals, 2×2 effects,
measured vs predicted amplification).

Left out: the Ray backend (its learners are remote actors; run the probe in-process), and several
updates per batch (the probe takes the gradient the first update of a batch computes, over all rows,
which is the training gradient when ``loss.updates_per_batch`` is 1).
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from teamrl.algos.advantages import get_estimator
from teamrl.metrics.diagnostics import amplification_factors
from teamrl.team.records import Step

log = logging.getLogger(__name__)

GRID_PRESETS = ("grpo", "grpo_step", "agent_episode", "drmas")


@dataclass(frozen=True)
class ProbeSpec:
    """What one ``teamrl probe`` measures."""

    presets: Sequence[str] = GRID_PRESETS
    """Estimator presets whose gradients are compared on every batch."""
    batches: int = 4
    """Rollout batches per seed."""
    seeds: Sequence[int] = (0,)
    """Values of ``train.seed``: each one samples its own batches."""
    checkpoint: str | None = None
    """Model state: a run directory or ``checkpoints/step_N`` folder; None = the untrained models."""
    sweep: str | None = None
    """Agent whose rewards the heterogeneity sweep transforms; None = no sweep."""
    shifts: Sequence[float] = (0.0, 0.5, 1.0, 2.0)
    """Sweep: added to the agent's rewards (raw reward units)."""
    scales: Sequence[float] = (1.0,)
    """Sweep: multiply the agent's rewards' spread around their group mean (> 0)."""
    sweep_presets: Sequence[str] = ("grpo_step", "drmas")
    """Presets traced by the sweep."""
    cosines: bool = True
    """Keep each (preset, agent) gradient of a batch to compute cosines between presets (memory: one
    bfloat16 copy of the trainable parameters per preset and agent)."""

    def __post_init__(self) -> None:
        for name in (*self.presets, *self.sweep_presets):
            get_estimator(name)  # an unknown name lists the valid ones
        if len(set(self.presets)) != len(self.presets) or not self.presets:
            raise ValueError(f"--presets {','.join(self.presets)}: give each preset once, at least one")
        if self.batches < 1:
            raise ValueError(f"--batches {self.batches} must be >= 1")
        if not self.seeds:
            raise ValueError("--seeds names no seed")
        if any(not s > 0 for s in self.scales):
            raise ValueError(f"--scales {list(self.scales)}: every scale must be > 0 (it multiplies a spread)")
        if self.sweep is not None and "drmas" not in self.sweep_presets:
            raise ValueError("the sweep divides by the drmas gradient: keep drmas in --sweep-presets")


@dataclass
class BatchGradients:
    """Per-agent gradients of one preset on one batch."""

    sq: dict[str, float] = field(default_factory=dict)
    vectors: dict[str, torch.Tensor] = field(default_factory=dict)  # agent -> [P] float32, when kept


def agent_gradients(learners: dict[str, Any], steps: list[Step], *, keep: torch.dtype | None = None) -> BatchGradients:
    """Each agent's own gradient of the loss on ``steps`` (advantages already set) under its model's learner.

    Returns the squared norms (what ``agent/<name>/grad_norm`` squares in training) and, with ``keep``
    (a dtype), the flattened gradients in that dtype. Gradients are cleared afterwards; the models and
    optimizers do not change.
    """
    out = BatchGradients()

    def capture(agent: str, grads: list[torch.Tensor | None]) -> None:
        flat = [g.detach().float().reshape(-1) for g in grads if g is not None]
        out.sq[agent] = float(sum(f.pow(2).sum() for f in flat)) if flat else 0.0
        if keep is not None:
            out.vectors[agent] = torch.cat([f.to(keep) for f in flat]) if flat else torch.zeros(0)

    for model, learner in learners.items():
        mine = [s for s in steps if s.model == model]
        if not mine:
            continue
        if not hasattr(learner, "compute_gradients"):
            raise ValueError(f"model {model!r}: its learner runs elsewhere (backend ray); run teamrl probe with "
                             f"backend=local")
        learner.compute_gradients(mine, on_agent_grad=capture)
        learner.optimizer.zero_grad(set_to_none=True)
    for s in steps:  # an agent whose rows all had advantage 0 got no gradient: norm 0
        out.sq.setdefault(s.agent, 0.0)
    return out


def transform_rewards(rewards: torch.Tensor, prompts: torch.Tensor, mask: torch.Tensor, *, shift: float,
                      scale: float) -> torch.Tensor:
    """``r' = m + scale · (r − m) + shift`` on the rows in ``mask``, ``m`` their mean within each prompt group.

    Args:
        rewards: [N] rewards of every row.
        prompts: [N] prompt (group) index of each row.
        mask: [N] bool, the rows of the agent being transformed.

    >>> transform_rewards(torch.tensor([1., 0., 3., 5.]), torch.tensor([0, 0, 0, 0]),
    ...                   torch.tensor([True, False, True, False]), shift=0.5, scale=2.0).tolist()
    [0.5, 0.0, 4.5, 5.0]
    """
    out = rewards.clone()
    for g in prompts[mask].unique():
        rows = mask & (prompts == g)
        m = rewards[rows].mean()
        out[rows] = m + scale * (rewards[rows] - m) + shift
    return out


def cosine(a: torch.Tensor, b: torch.Tensor, chunk: int = 1 << 22) -> float:
    """Cosine of two flattened gradients (accumulated in float64 over chunks); nan when either is zero.

    >>> round(cosine(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0])), 6)
    0.707107
    """
    dot = na = nb = 0.0
    for i in range(0, a.numel(), chunk):
        x, y = a[i:i + chunk].double(), b[i:i + chunk].double()
        dot, na, nb = dot + float(x @ y), na + float(x @ x), nb + float(y @ y)
    return dot / math.sqrt(na * nb) if na > 0 and nb > 0 else math.nan


def agent_rows(steps: list[Step], rewards: torch.Tensor, adv: torch.Tensor) -> dict[str, dict[str, float]]:
    """Per agent: calls, reward mean/std, advantage mean and mean square (population statistics)."""
    out = {}
    for agent in sorted({s.agent for s in steps}):
        idx = torch.tensor([i for i, s in enumerate(steps) if s.agent == agent])
        r, a = rewards[idx].double(), adv[idx].double()
        out[agent] = {"calls": len(idx), "reward_mean": float(r.mean()), "reward_std": float(r.std(unbiased=False)),
                      "adv_mean": float(a.mean()), "adv_sq_mean": float(a.pow(2).mean())}
    return out


def probe_batch(learners: dict[str, Any], steps: list[Step], rewards: torch.Tensor, spec: ProbeSpec, *,
                eps: float, tag: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows of one batch: one per (preset, agent), and the sweep's rows (empty without a sweep)."""
    from teamrl.scoring.advantages import advantages_for

    prompts = torch.tensor([s.prompt_index for s in steps])
    agents = [s.agent for s in steps]
    f_pred = amplification_factors(rewards.tolist(), prompts.tolist(), agents)
    grads: dict[str, BatchGradients] = {}
    rows = []
    for preset in spec.presets:
        adv = advantages_for(steps, rewards, get_estimator(preset), eps=eps)
        for s, a in zip(steps, adv.tolist()):
            s.advantage = a
        # bfloat16 copies for the cosines: half the memory of float32, cosines to about 1e-3
        grads[preset] = agent_gradients(learners, steps, keep=torch.bfloat16 if spec.cosines else None)
        for agent, st in agent_rows(steps, rewards, adv).items():
            sq = grads[preset].sq[agent]
            rows.append({**tag, "preset": preset, "agent": agent, **st, "grad_sq": sq, "grad_norm": math.sqrt(sq),
                         "F_pred": f_pred.get(agent, math.nan)})
    if spec.cosines:
        for row in rows:
            mine = grads[row["preset"]].vectors.get(row["agent"])
            row["cos"] = {p: cosine(mine, grads[p].vectors[row["agent"]]) for p in spec.presets
                          if p != row["preset"] and mine is not None and row["agent"] in grads[p].vectors}
        for g in grads.values():
            g.vectors.clear()
    return rows, sweep_batch(learners, steps, rewards, spec, eps=eps, tag=tag, prompts=prompts)


def sweep_batch(learners: dict[str, Any], steps: list[Step], rewards: torch.Tensor, spec: ProbeSpec, *,
                eps: float, tag: dict[str, Any], prompts: torch.Tensor) -> list[dict[str, Any]]:
    """Proposition 4.3's trace on one batch: the sweep agent's squared gradient norm under each sweep preset
    and reward transform, relative to ``drmas`` on the untransformed rewards."""
    from teamrl.scoring.advantages import advantages_for

    agent = spec.sweep
    if agent is None:
        return []
    mask = torch.tensor([s.agent == agent for s in steps])
    if not bool(mask.any()):
        raise ValueError(f"--sweep {agent}: that agent made no call in this batch; agents here: "
                         f"{', '.join(sorted({s.agent for s in steps}))}")
    base = None
    out = []
    transforms = [(0.0, 1.0)] + [(sh, sc) for sc in spec.scales for sh in spec.shifts if (sh, sc) != (0.0, 1.0)]
    for shift, scale in transforms:
        r2 = transform_rewards(rewards, prompts, mask, shift=shift, scale=scale)
        f_k = amplification_factors(r2.tolist(), prompts.tolist(), [s.agent for s in steps]).get(agent, math.nan)
        for preset in spec.sweep_presets:
            adv = advantages_for(steps, r2, get_estimator(preset), eps=eps)
            for s, a in zip(steps, adv.tolist()):
                s.advantage = a
            sq = agent_gradients(learners, steps).sq[agent]
            if base is None and preset == "drmas":
                base = sq
            out.append({**tag, "agent": agent, "shift": shift, "scale": scale, "preset": preset, "grad_sq": sq,
                        "F_pred": f_k, "predicted": f_k if preset != "drmas" else 1.0})
    for row in out:
        row["measured"] = row["grad_sq"] / base if base else math.nan
    return out


def run_probe(config: str | None, overrides: Sequence[str], spec: ProbeSpec, out: str | Path, *,
              progress: bool = True) -> Path:
    """Sample ``spec.batches`` batches per seed and write ``probe_rows.jsonl`` (and ``sweep_rows.jsonl``) into
    ``out``, then the report (:func:`teamrl.study.probe_report.write_probe_report`); returns the report's path."""
    from teamrl.config.schema import load_config
    from teamrl.scoring.rewards import step_rewards
    from teamrl.study.probe_report import write_probe_report
    from teamrl.train.trainer import Trainer

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows_path, sweep_path = out / "probe_rows.jsonl", out / "sweep_rows.jsonl"
    rows_path.write_text("")
    sweep_path.write_text("")
    started = time.perf_counter()
    for seed in spec.seeds:
        scratch = tempfile.TemporaryDirectory(prefix="teamrl-probe-")  # the trainer's run folder: nothing kept
        cfg = load_config(config, [*overrides, f"train.seed={seed}", f"run_dir={scratch.name}",
                                   "eval.before=false", "eval.after=false", "eval.every=0", "train.loggers=[]"])
        if cfg.backend != "local":
            raise ValueError(f"teamrl probe runs in-process; backend is {cfg.backend!r}: add backend=local")
        trainer = Trainer(cfg, progress=progress)
        if spec.checkpoint is not None:
            trainer.load_weights(Path(spec.checkpoint))
        for b in range(spec.batches):
            t0 = time.perf_counter()
            problems = trainer.sampler.next(cfg.rollout.batch_size)
            episodes = trainer.rollout.collect(problems, cfg.rollout.group_size, progress=progress)
            trainer.scorer.credit.assign(episodes, problems, step=b)
            steps, rewards = step_rewards(episodes, trainer.scorer.terms)
            if not steps:
                log.warning("seed %d batch %d: every episode failed; nothing to probe", seed, b)
                continue
            models = {s.agent: s.model for s in steps}
            rows, sweep = probe_batch(trainer.learners, steps, rewards, spec, eps=cfg.algo.eps,
                                      tag={"seed": seed, "batch": b})
            for r in (*rows, *sweep):
                r["model"] = models[r["agent"]]
            _append(rows_path, rows)
            _append(sweep_path, sweep)
            log.info("probe seed %d batch %d/%d: %d rows, %.1f s", seed, b + 1, spec.batches, len(steps),
                     time.perf_counter() - t0)
        trainer.sink.close({})
        del trainer
        scratch.cleanup()
    meta = {"config": config, "overrides": list(overrides), "presets": list(spec.presets), "batches": spec.batches,
            "seeds": list(spec.seeds), "checkpoint": spec.checkpoint, "sweep": spec.sweep,
            "shifts": list(spec.shifts), "scales": list(spec.scales), "sweep_presets": list(spec.sweep_presets),
            "seconds": time.perf_counter() - started}
    (out / "probe.json").write_text(json.dumps(meta, indent=2))
    return write_probe_report(out)


def _append(path: Path, rows: list[dict[str, Any]]) -> None:
    if rows:
        with path.open("a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
