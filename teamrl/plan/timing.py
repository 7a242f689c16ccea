"""The time plan of a config: per phase and model, the FLOPs and bytes a step implies, the floor they set at this
machine's limits, and the time predicted per step and for the run, loading nothing.

``teamrl train CONFIG --dry-run`` prints one ``time plan`` line per phase and one total. The work is counted as
the run counts it (:mod:`teamrl.metrics.phases`, same formulas), from the config instead of from counters:

* rows per step of each agent: ``batch_size x calls x group_size`` (calls: :func:`teamrl.plan.calls_per_episode`),
  each prefilling :data:`PROMPT_TOKENS` and decoding :data:`REPLY_SHARE` of its agent's ``max_new_tokens``;
* decode steps: each call of an agent decodes its ``batch_size x group_size`` rows together, ``max_batch_size`` of them
  at a time, until the longest reply ends (:data:`LONGEST_SHARE` of ``max_new_tokens``), or, with more rows than fit,
  the call's tokens over ``max_batch_size``;
* the update: the tokens :func:`teamrl.plan.update_tokens` plans for the micro-batches, summed over the model's
  agents; optimizer steps from ``updates_per_batch`` / ``mini_batch_rows``; micro-batches at ``micro_batch_tokens``;
* the evaluations: ``eval.problems x eval.samples`` episodes, decoded as a rollout;
* MAD-OPD's debate (``algo.distill.debate_rounds``): each teacher's answer per distilled reply and round;
* a weight sync per step where the engine keeps copies of its own (a rollout copy in another dtype, the decode
  loop's copies).

Those counts are the caps' work. A run does less (replies end early, episodes end before their last call, groups
whose episodes score alike train nothing), so each count is scaled by the config's :class:`~teamrl.plan.prior.WorkPrior`
(the shipped one of its workflow, task and environment, or ``--plan-from RUN``'s), which also adds the host's
seconds per episode (rewards, sandboxes, environments) to the rollouts and evaluations.

The floor of each phase is the larger of its FLOPs at the matmul peak of its dtype and its bytes at the memory
bandwidth (:mod:`teamrl.plan.limits`: a CPU's measured once per machine, a GPU's from its data sheet). The predicted
time is each at the share of its limit the phase reaches in measured runs (:data:`REACHED`; docs/time.md holds the
table the shares come from), their sum for a CPU's decode phases (:data:`ADDITIVE`), else the larger.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from teamrl.plan import calls_per_episode, decode_copies, optimizer_step_share
from teamrl.plan.limits import Limits
from teamrl.plan.prior import COUNTS, NONE, WorkPrior, prior_for
from teamrl.plan.shapes import Shape, shape_of

if TYPE_CHECKING:
    from teamrl.config.schema import Config

ADAMW_BYTES = 28
"""Bytes AdamW moves per trained parameter and optimizer step (float32): weight, gradient and two moments read, the
weight and the moments written."""
PROMPT_TOKENS = 100
"""Prompt tokens planned per call (the shipped tasks' prompts take 60-210 tokens; later turns carry the history)."""
REPLY_SHARE = 0.75
"""Share of ``max_new_tokens`` a reply is planned to take (teamrl.plan.REPLY_SHARE: the memory plan's)."""
LONGEST_SHARE = 0.95
"""Share of ``max_new_tokens`` the longest reply of a call's rows takes (a sampled batch nearly always has one that
runs to the cap)."""
REACHED: dict[str, dict[str, dict[str, float]]] = {
    # fitted to the 27 shipped configs of docs/time.md (AMD EPYC family 25 model 17, one thread, 2026-12-04): the
    # decode phases by least squares over their engine seconds (benchmarks/time_vs_measured.py --fit), the others the
    # medians of their shares of the floor. Above 1: the phase's products ran faster than the calibration's
    # [1024, 1024] float32 product (teamrl.plan.limits).
    "cpu": {"rollout": {"float32": 1.03, "bfloat16": 0.71, "memory": 0.47},
            "debate": {"float32": 1.03, "bfloat16": 0.71, "memory": 0.47},
            "logprobs": {"float32": 1.03, "bfloat16": 0.59, "memory": 0.5},
            "update": {"float32": 0.91, "bfloat16": 0.63, "memory": 0.5},
            "sync": {"float32": 0.13, "bfloat16": 0.13, "memory": 0.13},
            "eval": {"float32": 1.03, "bfloat16": 0.71, "memory": 0.47}},
    "gpu": {"rollout": {"float32": 0.2, "bfloat16": 0.2, "memory": 0.2},
            "debate": {"float32": 0.2, "bfloat16": 0.2, "memory": 0.2},
            "logprobs": {"float32": 0.3, "bfloat16": 0.3, "memory": 0.3},
            "update": {"float32": 0.27, "bfloat16": 0.27, "memory": 0.27},
            "sync": {"float32": 0.5, "bfloat16": 0.5, "memory": 0.5},
            "eval": {"float32": 0.2, "bfloat16": 0.2, "memory": 0.2}},
}
"""Share of the matmul peak (per dtype) and of the memory bandwidth each phase reaches, per device kind. CPU: measured
on the shipped configs (docs/time.md). GPU: one H100's component figures (a 1.5B rollout at 20% of its memory
roofline at batch 128, a 7B update at 27% MFU); a whole team on a GPU is still to be measured, and a GPU plan counts
no host work between decode steps, so a small model's plan there is a floor more than a forecast."""
DEBATE_BATCH = 64
"""teamrl.scoring.debate.BATCH: prompts per ``generate`` call of a debate."""
ADDITIVE = {"cpu": {"rollout", "debate", "eval"}, "gpu": set()}
"""Phases whose products and bytes are planned one after the other (:func:`planned_seconds`)."""


@dataclass(frozen=True)
class PhaseWork:
    """The work one phase does in one step (or one evaluation) on one model."""

    flops: float = 0.0
    nbytes: float = 0.0
    dtype: str = "float32"
    decode_steps: float = 0.0
    tokens: float = 0.0  # decoded (rollout, eval) or computed (update, log-probs)
    prefill: float = 0.0  # prompt tokens prefilled (rollout, eval)
    recompute: float = 0.0  # of flops: checkpointing's recomputed forward (update)

    def floor(self, limits: Limits) -> float:
        return max(self.flops / (limits.peak(self.dtype) * 1e9), self.nbytes / (limits.bandwidth * 1e9))


@dataclass(frozen=True)
class PhasePlan:
    phase: str
    work: dict[str, PhaseWork]  # by model
    floor_s: float
    planned_s: float
    bound: str  # "compute" or "memory"
    count: float = 1.0  # times per step (1), or evaluations in the run
    host_s: float = 0.0  # of planned_s: the host's work outside the engine (the prior's, per episode)


def update_flops(params: float, trained: float, recompute: float, tokens: float) -> float:
    """FLOPs of an update over ``tokens``: the forward (checkpointing's ``recompute`` share of it again) and the input
    gradients through all ``params`` that multiply, the weight gradients of the ``trained`` ones alone.

    >>> update_flops(100, 100, 0.0, 10), update_flops(100, 0, 1.0, 10)  # 6 P; frozen, recomputed: 2 + 2 + 2 P
    (6000.0, 6000.0)
    """
    return float(((4 + 2 * recompute) * params + 2 * min(trained, params)) * tokens)


def _sizes(shape: Shape) -> tuple[int, int, int]:
    """(multiplying params, attention width, kv width) of ``shape``."""
    hd = shape.head_dim or shape.hidden // shape.heads
    return shape.params - (0 if shape.tied else shape.vocab * shape.hidden), shape.heads * hd, shape.kv_heads * hd


def _bytes(dtype: str) -> int:
    return 2 if dtype == "bfloat16" else 4


def decode_plan(shape: Shape, engine_bytes: int, calls: list[tuple[int, int]], max_batch: int,
                prior: WorkPrior = NONE) -> PhaseWork:
    """The :class:`PhaseWork` of decoding ``calls`` (rows, max_new_tokens), each call's rows together, ``max_batch``
    at a time; ``prior`` scales the decoded tokens, decode steps and prefilled tokens the caps imply
    (:mod:`teamrl.plan.prior`).

    >>> w = decode_plan(Shape(2, 8, 16, 2, 2, 32, True), 2, [(4, 100)], 8)
    >>> w.decode_steps, w.flops > 0
    (95.0, True)
    """
    params, attn, kv = _sizes(shape)
    decoded = prefill = keys = steps = 0.0
    for rows, max_new in calls:
        reply = REPLY_SHARE * max_new
        tokens = rows * reply
        steps += max(LONGEST_SHARE * max_new, tokens / max(1, max_batch))  # one batch to its longest, or a full queue
        # each decoded token attends its prompt and its reply so far
        keys += rows * reply * prior.decoded * (PROMPT_TOKENS * prior.prefill + reply * prior.decoded / 2)
        decoded += tokens
        prefill += rows * PROMPT_TOKENS
    decoded, prefill, steps = decoded * prior.decoded, prefill * prior.prefill, steps * prior.steps
    flops = 2 * params * (prefill + decoded) + 4 * shape.layers * attn * keys
    nbytes = steps * params * engine_bytes + keys * 2 * shape.layers * kv * engine_bytes
    return PhaseWork(flops, nbytes, "bfloat16" if engine_bytes == 2 else "float32", steps, decoded, prefill)


def _engine_bytes(cfg: Config, name: str, on_gpu: bool) -> int:
    mc = cfg.models[name]
    rollout = mc.rollout_dtype if mc.rollout_dtype not in ("auto", "same") else mc.dtype
    if rollout == "auto":
        rollout = "bfloat16" if on_gpu else "float32"
    return _bytes(rollout)


def _calls(cfg: Config, name: str, rows_per_problem: int, problems: int,
           workflow: str | None = None) -> list[tuple[int, int]]:
    """(rows, max_new_tokens) of each call wave of the agents on model ``name`` that ``workflow`` (else the config's)
    calls."""
    from teamrl.team.registry import get_workflow

    wf = workflow or cfg.workflow.name
    called = set(get_workflow(wf).agents_for(getattr(cfg.workflow, wf, None))) if workflow else set(cfg.agents)
    waves = []
    for n, a in cfg.agents.items():
        if a.model == name and n in called:
            waves += [(problems * rows_per_problem, a.max_new_tokens)] * calls_per_episode(cfg, wf)
    return waves


def _update_tokens(cfg: Config, name: str, agents: list[str] | None = None) -> float:
    """Tokens an update of ``name`` computes per step: every agent's groups (teamrl.plan.update_tokens' formula,
    summed over the agents instead of their largest); ``agents``: those agents' alone, whatever their model (the
    rows a distillation teacher scores)."""
    from teamrl.plan import UPDATE_PROMPT_TOKENS
    from teamrl.team.registry import get_workflow

    groups, calls, size = cfg.rollout.batch_size, calls_per_episode(cfg), cfg.rollout.group_size
    later = 0 if get_workflow(cfg.workflow.name).calls_share_prompt else UPDATE_PROMPT_TOKENS
    return float(sum(groups * (UPDATE_PROMPT_TOKENS + REPLY_SHARE * size * a.max_new_tokens)
                     + groups * (calls - 1) * size * (later + REPLY_SHARE * a.max_new_tokens)
                     for n, a in cfg.agents.items() if (a.model == name if agents is None else n in agents)))


def plan_time(cfg: Config, limits: Limits, *, on_gpu: bool, prior: WorkPrior | None = None) -> list[PhasePlan]:
    """The :class:`PhasePlan` of every phase of ``cfg`` (module docstring); models whose shape is unknown are left
    out. ``prior``: the share of the caps' work a run does (:mod:`teamrl.plan.prior`); None: the shipped one of the
    config's workflow and task, if any."""
    kind = "gpu" if on_gpu else "cpu"
    prior = prior_for(cfg) if prior is None else prior
    eval_prior = prior  # an evaluation under another workflow: that workflow's prior where one is shipped
    if cfg.eval.workflow and cfg.eval.workflow != cfg.workflow.name:
        shipped = prior_for(cfg, cfg.eval.workflow)
        eval_prior = shipped if shipped.source else prior
    used = sorted({a.model for a in cfg.agents.values()})
    work: dict[str, dict[str, PhaseWork]] = {p: {} for p in ("rollout", "debate", "logprobs", "update", "sync",
                                                              "eval")}
    for name in used:
        mc = cfg.models[name]
        shape = shape_of(mc.path)
        if shape is None:
            continue
        params, _, _ = _sizes(shape)
        eb = _engine_bytes(cfg, name, on_gpu)
        work["rollout"][name] = decode_plan(shape, eb, _calls(cfg, name, cfg.rollout.group_size,
                                                              cfg.rollout.batch_size), mc.max_batch_size, prior)
        problems = cfg.eval.problems or 0
        if problems and (cfg.eval.before or cfg.eval.after or cfg.eval.every):
            work["eval"][name] = decode_plan(shape, eb, _calls(cfg, name, cfg.eval.samples, problems,
                                                               cfg.eval.workflow), mc.max_batch_size, eval_prior)
        weight_dtype = mc.dtype if mc.dtype != "auto" else "float32"
        if mc.trainable:
            tokens = _update_tokens(cfg, name) * prior.trained
            autocast = mc.train_autocast == "bfloat16" or (mc.train_autocast == "auto" and on_gpu)
            dtype = "bfloat16" if autocast or weight_dtype == "bfloat16" else "float32"
            recompute = mc.checkpoint_layers if mc.gradient_checkpointing else 0.0
            opt_steps = math.ceil(1 / optimizer_step_share(cfg, name) - 1e-9)
            budget = 4096 if cfg.loss.micro_batch_tokens == "auto" else cfg.loss.micro_batch_tokens
            micro = max(opt_steps, math.ceil(tokens / max(1, budget)))
            trained = shape.params if not mc.lora.rank else 2 * mc.lora.rank * shape.hidden * len(mc.lora.targets) * shape.layers
            if not tokens:  # no row trains: no micro-batch, no optimizer step
                opt_steps = micro = 0
            work["update"][name] = PhaseWork(update_flops(params, trained, recompute, tokens),
                                             opt_steps * trained * ADAMW_BYTES + micro * 3 * params * _bytes(weight_dtype),
                                             dtype, tokens=tokens, recompute=2 * recompute * params * tokens)
            corrected = (mc.rollout_correction or cfg.loss.rollout_correction) != "none"
            if (cfg.loss.old_logprobs == "recompute" or corrected) and opt_steps > 1:  # the learner's anchor pass
                work["logprobs"][name] = PhaseWork(2 * params * tokens, 0.0, dtype, tokens=tokens)
            copies = (shape.params if _bytes(weight_dtype) != eb else 0) + (
                decode_copies(shape, packed=not on_gpu) if mc.engine == "hf" else 0)
            if copies:
                work["sync"][name] = PhaseWork(0.0, shape.params * _bytes(weight_dtype) + copies * eb)
    for name in sorted(set(cfg.algo.distill.models())):  # a teacher's forward over its agents' rows
        shape = shape_of(cfg.models[name].path)
        if shape is not None and cfg.models[name].engine != "openai":  # a served teacher computes on its server
            tokens = prior.trained * _update_tokens(
                cfg, name, [a for a, ms in cfg.algo.distill.teacher_models().items() if name in ms])
            dtype = cfg.models[name].dtype if cfg.models[name].dtype != "auto" else "float32"
            params = _sizes(shape)[0]
            # loss jsd: the teacher's forward runs in the learner's micro-batches, once per gradient pass
            phase = "update" if cfg.algo.distill.loss == "jsd" else "logprobs"
            work[phase][name] = PhaseWork(2 * params * tokens, params * _bytes(dtype), dtype, tokens=tokens)
    _debate(cfg, work["debate"])
    evals = (int(cfg.eval.before) + int(cfg.eval.after)
             + (cfg.train.steps // cfg.eval.every if cfg.eval.every else 0))
    episodes = {"rollout": cfg.rollout.batch_size * cfg.rollout.group_size,
                "eval": (cfg.eval.problems or 0) * cfg.eval.samples}
    plans = []
    for phase, by_model in work.items():
        if not by_model:
            continue
        flops_s = sum(w.flops / (limits.peak(w.dtype) * 1e9) for w in by_model.values())
        bytes_s = sum(w.nbytes for w in by_model.values()) / (limits.bandwidth * 1e9)
        host = (eval_prior if phase == "eval" else prior).host_s * episodes.get(phase, 0)  # whatever the device
        planned = planned_seconds(phase, kind, list(by_model.values()), limits) + host
        plans.append(PhasePlan(phase, by_model, max(flops_s, bytes_s), planned,
                               "compute" if flops_s >= bytes_s else "memory", float(evals) if phase == "eval" else 1.0,
                               host))
    return plans


def _debate(cfg: Config, out: dict[str, PhaseWork]) -> None:
    """MAD-OPD's debate (``algo.distill.debate_rounds``): per distilled reply each of the two teachers answers once
    a round, ``debate_max_tokens`` at most (transformers' ``generate``, :data:`DEBATE_BATCH` prompts a call), into
    ``out`` by teacher model. A reply is planned at :data:`REPLY_SHARE` of the cap: the debate's lengths are not in
    the prior."""
    o = cfg.algo.distill
    if o.loss != "jsd" or o.debate_rounds < 1:
        return
    replies = len(o.teacher_models()) * cfg.rollout.batch_size * calls_per_episode(cfg) * cfg.rollout.group_size
    bf16 = any(m.train_autocast == "bfloat16" or m.dtype == "bfloat16" for m in cfg.models.values() if m.trainable)
    for name in sorted(set(o.models())):
        shape = shape_of(cfg.models[name].path)
        if shape is not None:
            out[name] = decode_plan(shape, 2 if bf16 else 4, [(replies, o.debate_max_tokens)] * o.debate_rounds,
                                    DEBATE_BATCH)


def base_counts(cfg: Config, decode: str = "rollout") -> dict[str, float]:
    """Per step, the work :func:`teamrl.plan.timing.plan_time` counts from ``cfg``'s caps with no prior, summed over
    the models: ``decoded``, ``steps``, ``prefill`` (the rollout's, or with ``decode="eval"`` one evaluation's) and
    ``trained`` (the update's tokens)."""
    plans = {p.phase: p for p in plan_time(cfg, Limits("counts", 1.0, 1.0, 1.0, "counts"), on_gpu=False, prior=NONE)}
    out = dict.fromkeys(COUNTS, 0.0)
    if decode in plans:
        ws = plans[decode].work.values()
        out |= {"decoded": sum(w.tokens for w in ws), "steps": sum(w.decode_steps for w in ws),
                "prefill": sum(w.prefill for w in ws)}
    if "update" in plans:
        trained = [n for n, m in cfg.models.items() if m.trainable]
        out["trained"] = sum(w.tokens for n, w in plans["update"].work.items() if n in trained)
    return out


def measure(cfg: Config, rows: list[dict[str, Any]], source: str) -> WorkPrior:
    """The :class:`WorkPrior` of the training steps ``rows`` (metrics.jsonl rows) of a run of ``cfg``: each count's
    mean over the steps against :func:`base_counts`; ``host_s`` the rollouts' host seconds per episode."""
    steps = [r for r in rows if "perf/rollout/s" in r]
    if not steps:
        raise ValueError(f"{source}: no training step with a rollout's counts in its metrics")
    base = base_counts(cfg)
    shares = {}
    for name, key in COUNTS.items():
        seen = [float(r.get(key, 0.0)) for r in steps]
        shares[name] = round(statistics.fmean(seen) / base[name], 4) if base[name] else 1.0
    episodes = cfg.rollout.batch_size * cfg.rollout.group_size
    host = statistics.fmean(float(r.get("perf/rollout/host_s", 0.0)) for r in steps) / max(1, episodes)
    return WorkPrior(**shares, host_s=round(host, 5), source=source)


def planned_seconds(phase: str, kind: str, works: list[PhaseWork], limits: Limits) -> float:
    """The seconds ``works`` (one per model) are planned to take in ``phase`` on a ``kind`` device: their products at
    the share of the peak the phase reaches in their dtype and their bytes at the share of the bandwidth it reaches
    (:data:`REACHED`), the larger of the two, or their sum for the phases of :data:`ADDITIVE` (a CPU's decode steps,
    whose weight reads and products do not overlap at small batches).

    >>> w = PhaseWork(flops=1e12, nbytes=1e9, dtype="float32", decode_steps=100)
    >>> lim = Limits("cpu", 100.0, 400.0, 10.0, "by hand")
    >>> round(planned_seconds("update", "cpu", [w], lim) * REACHED["cpu"]["update"]["float32"], 3)  # 10 s at the peak
    10.0
    """
    reach = REACHED[kind][phase]
    compute = sum(w.flops / (limits.peak(w.dtype) * 1e9 * reach[w.dtype]) for w in works)
    memory = sum(w.nbytes for w in works) / (limits.bandwidth * 1e9 * reach["memory"])
    return compute + memory if phase in ADDITIVE[kind] else max(compute, memory)


def _t(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def format_time(cfg: Config, limits: Limits, *, on_gpu: bool, prior: WorkPrior | None = None) -> str:
    """The ``time plan`` lines of ``--dry-run``: one per phase, then the step's and the run's totals, then where the
    work's shares come from (:mod:`teamrl.plan.prior`)."""
    prior = prior_for(cfg) if prior is None else prior
    plans = plan_time(cfg, limits, on_gpu=on_gpu, prior=prior)
    kind = "gpu" if on_gpu else "cpu"
    lines = []
    for p in plans:
        flops = sum(w.flops for w in p.work.values())
        nbytes = sum(w.nbytes for w in p.work.values())
        per = "per evaluation" if p.phase == "eval" else "per step"
        tokens = sum(w.tokens for w in p.work.values())
        what = (f"{tokens:,.0f} tokens {'decoded' if p.phase in ('rollout', 'debate', 'eval') else 'computed'}, "
                if tokens else "")
        if p.host_s:
            what += f"host {_t(p.host_s)}, "
        redo = [PhaseWork(w.recompute, 0.0, w.dtype) for w in p.work.values() if w.recompute]
        if redo:
            what += f"checkpointing's recompute {_t(planned_seconds(p.phase, kind, redo, limits))}, "
        lines.append(f"time plan: {p.phase:<8} {flops / 1e12:8.2f} TFLOP {nbytes / 1e9:8.1f} GB {per}: floor "
                     f"{_t(p.floor_s)} ({p.bound}-bound), planned {_t(p.planned_s)} "
                     f"({what}{', '.join(p.work)})")
    lines.append(total_line(cfg, plans, limits))
    lines.append(f"time plan: {prior.describe()}")
    return "\n".join(lines)


def total_line(cfg: Config, plans: list[PhasePlan], limits: Limits, prefix: str = "") -> str:
    """The ``time plan: step ~..., run ~...`` line of ``plans``."""
    step = sum(p.planned_s for p in plans if p.phase != "eval")
    evals = sum(p.planned_s * p.count for p in plans if p.phase == "eval")
    run = step * cfg.train.steps + evals
    return (f"time plan: {prefix}step ~{_t(step)}, run ~{_t(run)} ({cfg.train.steps} steps"
            + (f" + evaluations {_t(evals)}" if evals else "") + f"; limits: {limits.describe()})")


def dry_run_plan(cfg: Config, gpu: str = "H100", prior: WorkPrior | None = None) -> str:
    """The ``time plan`` lines of ``--dry-run``: on the GPU torch sees, on ``gpu``'s data sheet when a config planned for
    GPUs runs where none is visible, else on this CPU's limits (measured once per machine, a few seconds). ``prior``:
    the work's shares (``--plan-from RUN``: :func:`teamrl._cli.run_prior`); None: the config's shipped prior."""
    from teamrl.plan.limits import GPU_SPECS, cpu_limits, gpu_limits
    from teamrl.plan.report import plans_gpu

    if plans_gpu(cfg):
        import torch

        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else gpu
        limits = gpu_limits(name)
        if limits is None:
            raise ValueError(f"--plan-gpu {gpu!r}: no data sheet for it; one of {', '.join(GPU_SPECS)}")
        return format_time(cfg, limits, on_gpu=True, prior=prior)
    cpu = format_time(cfg, cpu_limits(cfg.train.threads), on_gpu=False, prior=prior)
    sheet = gpu_limits(gpu)
    if sheet is None:
        raise ValueError(f"--plan-gpu {gpu!r}: no data sheet for it; one of {', '.join(GPU_SPECS)}")
    return cpu + "\n" + total_line(cfg, plan_time(cfg, sheet, on_gpu=True, prior=prior), sheet, prefix=f"on one {gpu}: ")
