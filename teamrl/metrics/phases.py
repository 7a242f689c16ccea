"""Each phase's time against its floor: the least time the work it did takes at the device's limits.

A phase's **floor** is the larger of its FLOPs at the matmul peak of the dtype it computes in and its bytes at the
memory bandwidth (:mod:`teamrl.plan.limits`); ``limit_frac`` = floor / measured seconds, the share of the machine's
limit the phase reached (1.0: at the limit). Per model, with P the parameters that multiply (an untied embedding
apart), L layers, and the work counted in the run (the engine's and the learner's counters):

    rollout, eval  FLOPs = 2 P (prefilled + decoded tokens) + 4 L x heads x head_dim x keys attended
                   bytes = decode steps x P x engine bytes (the weights, read once per step)
                           + keys attended x 2 L x kv_heads x head_dim x engine bytes (the KV cache)
    update         FLOPs = (4 + 2 r) P x tokens + 2 min(T, P) x tokens computed   (the forward and the backward's
                           input gradients, r: share of layers checkpointed, their forward again; the weight gradients
                           of the T trained parameters only: a LoRA's frozen weights have none)
                   bytes = optimizer steps x T x 28 B (AdamW reads the weight, gradient and two moments in float32,
                           writes three) + micro-batches x 3 P x the weights' bytes (read by the forward and twice by
                           the backward)
    log-probs      FLOPs = 2 P x tokens scored (the recomputed old log-probs of loss.old_logprobs: recompute)
    weight sync    bytes = the learner's weights read + the engine's copies written (a rollout copy in another dtype,
                           the decode loop's fused and packed copies)

Left out: attention's FLOPs in the update, elementwise work (norms, SiLU, rotation, sampling), the logits' softmax,
Python between the kernels. A floor is a lower bound of the phase's time; the time plan
(:mod:`teamrl.plan.timing`) predicts the time from it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from teamrl.plan.limits import Limits, cpu_limits, gpu_limits
from teamrl.plan.timing import ADAMW_BYTES, update_flops

log = logging.getLogger(__name__)

PHASES = ("rollout", "logprobs", "update", "sync", "eval")


@dataclass(frozen=True)
class ModelCost:
    """What a model's floors need of it."""

    params: int  # parameters that multiply (an untied input embedding apart)
    trained: int  # parameters the optimizer updates
    layers: int
    attn_width: int  # heads x head_dim
    kv_width: int  # kv_heads x head_dim
    engine_bytes: int  # bytes per value the engine decodes in (2: bf16, 4: float32)
    weight_bytes: int  # bytes per value of the learner's weights
    train_dtype: str  # the dtype the update's products run in (bfloat16 under autocast)
    recompute: float = 0.0  # share of layers gradient checkpointing recomputes
    copy_values: int = 0  # values of the engine's own copies, remade at a weight sync

    @property
    def engine_dtype(self) -> str:
        return "bfloat16" if self.engine_bytes == 2 else "float32"


def floor_s(flops: float, nbytes: float, peak_gflops: float, bandwidth_gbs: float) -> float:
    """The larger of ``flops`` at the peak and ``nbytes`` at the bandwidth, in seconds.

    >>> floor_s(2e9, 1e9, 100.0, 10.0)  # 0.02 s of products, 0.1 s of reads
    0.1
    """
    return max(flops / (peak_gflops * 1e9), nbytes / (bandwidth_gbs * 1e9))


def decode_work(m: ModelCost, w: dict[str, float]) -> tuple[float, float]:
    """(FLOPs, bytes) of a rollout or evaluation from the engine's counters ``w`` (prefill_tokens, decode_steps,
    decode_rows, decode_context).

    >>> m = ModelCost(100, 100, 2, 8, 4, 2, 4, "float32")
    >>> decode_work(m, {"prefill_tokens": 10, "decode_steps": 5, "decode_rows": 20, "decode_context": 300})
    (25200.0, 10600.0)
    """
    flops = 2 * m.params * (w["prefill_tokens"] + w["decode_rows"]) + 4 * m.layers * m.attn_width * w["decode_context"]
    nbytes = w["decode_steps"] * m.params * m.engine_bytes + w["decode_context"] * 2 * m.layers * m.kv_width * m.engine_bytes
    return float(flops), float(nbytes)


def update_work(m: ModelCost, st: dict[str, float]) -> tuple[float, float]:
    """(FLOPs, bytes) of an update from the learner's counts ``st`` (perf/update_tokens_computed,
    perf/optimizer_steps, perf/micro_batches).

    >>> m = ModelCost(100, 100, 2, 8, 4, 2, 4, "float32", recompute=1.0)
    >>> update_work(m, {"perf/update_tokens_computed": 10, "perf/optimizer_steps": 2, "perf/micro_batches": 3})
    (8000.0, 9200.0)
    >>> update_work(ModelCost(100, 10, 2, 8, 4, 2, 4, "float32"), {"perf/update_tokens_computed": 10})  # LoRA-like
    (4200.0, 0.0)
    """
    flops = update_flops(m.params, m.trained, m.recompute, st.get("perf/update_tokens_computed", 0.0))
    nbytes = (st.get("perf/optimizer_steps", 0.0) * m.trained * ADAMW_BYTES
              + st.get("perf/micro_batches", 0.0) * 3 * m.params * m.weight_bytes)
    return float(flops), float(nbytes)


def sync_bytes(m: ModelCost) -> float:
    """Bytes of one weight sync: the learner's weights read, the engine's copies written."""
    return float(m.params * m.weight_bytes + m.copy_values * m.engine_bytes)


class PhaseMeter:
    """Per step, each phase's own seconds, floor and share of the floor (``perf/<phase>/s``, ``floor_s``,
    ``limit_frac``), from the engines' and learners' counters; and the totals of the run for its summary."""

    def __init__(self, costs: dict[str, ModelCost], limits: Limits | None) -> None:
        self.costs, self.limits = costs, limits
        self.totals: dict[str, dict[str, float]] = {}

    @classmethod
    def build(cls, cfg: Any, models: dict[str, Any], engines: dict[str, Any]) -> PhaseMeter:
        """The meter of a run's in-process ``models`` (none with the Ray backend: no floors) and their ``engines``,
        held against the GPU's data sheet or this CPU's limits (measured once per machine)."""
        costs = {}
        for name, module in models.items():
            mc = cfg.models[name]
            costs[name] = model_cost(module, engine=engines.get(name), dtype=mc.dtype,
                                     train_dtype="bfloat16" if "bfloat16" in (mc.dtype, mc.train_autocast) else "float32",
                                     trained=mc.trainable,
                                     recompute=mc.checkpoint_layers if mc.gradient_checkpointing else 0.0)
        devices = {next(m.parameters()).device for m in models.values()}
        cuda = [d for d in devices if d.type == "cuda"]
        limits = None
        if cuda:
            import torch

            limits = gpu_limits(torch.cuda.get_device_name(cuda[0]))
        elif devices:
            limits = cpu_limits(cfg.train.threads)
            log.info("limits: %s", limits.describe())
        return cls(costs, limits)

    def step_metrics(self, work: tuple[dict, dict, dict], seconds: tuple[float, float],
                     stats: dict[str, Any], *, teacher_s: float = 0.0) -> dict[str, float]:
        """A training step's ``perf/<phase>/...`` from the engines' counts at its start, after its rollout and after
        its update (``work``), the rollout's and the update's seconds and the learners' statistics: the weight sync's
        seconds (in the rollout where a released copy is made again, else in the update) and the recomputed
        log-probs' come out of the phase they ran in; ``teacher_s``, a distillation teacher's forwards (already out
        of the rollout's seconds), joins the log-probs phase, which then has no floor."""
        roll, upd = self.delta(work[0], work[1]), self.delta(work[1], work[2])
        sync_roll = sum(w.get("sync_s", 0.0) for w in roll.values())
        sync_upd = sum(w.get("sync_s", 0.0) for w in upd.values())
        logprobs_s = sum(st.get("perf/logprobs_s", 0.0) for st in stats.values())
        out = self.record("rollout", seconds[0] - sync_roll, self.decode_floor(roll), engine=roll)
        if stats:
            out |= self.record("update", seconds[1] - sync_upd - logprobs_s, self.update_floor(stats))
        if logprobs_s or teacher_s:
            out |= self.record("logprobs", logprobs_s + teacher_s, None if teacher_s else self.logprobs_floor(stats))
        synced = [n for n in roll if roll[n].get("sync_s", 0.0) + upd.get(n, {}).get("sync_s", 0.0) > 0]
        if synced:
            out |= self.record("sync", sync_roll + sync_upd, self.sync_floor(synced))
        return out

    @staticmethod
    def snapshot(engines: dict[str, Any]) -> dict[str, dict[str, float]]:
        """A copy of every engine's running work counts (engines without them: none)."""
        return {n: dict(e.work) for n, e in engines.items() if isinstance(getattr(e, "work", None), dict)}

    @staticmethod
    def delta(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        return {n: {k: v - before.get(n, {}).get(k, 0.0) for k, v in w.items()} for n, w in after.items()}

    def _floor(self, flops: dict[str, float], nbytes: float) -> float:
        """The floor of products in several dtypes and ``nbytes`` of memory traffic, on this meter's device."""
        assert self.limits is not None
        compute = sum(f / (self.limits.peak(d) * 1e9) for d, f in flops.items())
        return max(compute, nbytes / (self.limits.bandwidth * 1e9))

    def _sum_floor(self, per_model: dict[str, Any], work: Any, dtype: str) -> float | None:
        """The floor of every model's ``work(cost, counts) -> (flops, bytes)``, products summed by the dtype the
        cost's ``dtype`` attribute names; None without limits or for a model without a cost (the Ray backend)."""
        if self.limits is None or not per_model or any(n not in self.costs for n in per_model):
            return None
        flops: dict[str, float] = {}
        nbytes = 0.0
        for n, counts in per_model.items():
            f, b = work(self.costs[n], dict(counts))
            d = getattr(self.costs[n], dtype)
            flops[d] = flops.get(d, 0.0) + f
            nbytes += b
        return self._floor(flops, nbytes)

    def decode_floor(self, work: dict[str, dict[str, float]]) -> float | None:
        return self._sum_floor(work, decode_work, "engine_dtype")

    def update_floor(self, stats: dict[str, dict[str, float]]) -> float | None:
        return self._sum_floor(stats, update_work, "train_dtype")

    def logprobs_floor(self, stats: dict[str, dict[str, float]]) -> float | None:
        return self._sum_floor(stats, lambda m, st: (2 * m.params * st.get("perf/logprob_tokens", 0.0), 0.0),
                               "train_dtype")

    def sync_floor(self, synced: list[str]) -> float | None:
        if self.limits is None or any(n not in self.costs for n in synced):
            return None
        return sum(sync_bytes(self.costs[n]) for n in synced) / (self.limits.bandwidth * 1e9)

    def record(self, phase: str, seconds: float, floor: float | None,
               engine: dict[str, dict[str, float]] | None = None) -> dict[str, float]:
        """``perf/<phase>/s`` (and ``floor_s``, ``limit_frac`` where the floor is known), added to the run's totals.
        A rollout or evaluation also gets the engines' counts of ``engine``: ``engine_s`` (their own steps),
        ``host_s`` (the rest: rewards, sandboxes, environments, prompts), ``engine_limit_frac`` (floor / engine_s),
        ``decoded_tokens``, ``decode_steps`` and ``prefill_tokens``."""
        out = {f"perf/{phase}/s": seconds}
        tot = self.totals.setdefault(phase, {"s": 0.0, "floor_s": 0.0, "steps": 0.0, "engine_s": 0.0})
        tot["s"] += seconds
        tot["steps"] += 1
        if engine is not None:
            busy = sum(w.get("busy_s", 0.0) for w in engine.values())
            out |= {f"perf/{phase}/engine_s": busy, f"perf/{phase}/host_s": max(0.0, seconds - busy)}
            for key, name in (("decode_rows", "decoded_tokens"), ("decode_steps", "decode_steps"),
                              ("prefill_tokens", "prefill_tokens")):
                out[f"perf/{phase}/{name}"] = float(sum(w.get(key, 0.0) for w in engine.values()))
            tot["engine_s"] += busy
            if floor is not None:
                out[f"perf/{phase}/engine_limit_frac"] = floor / max(busy, 1e-9)
        if floor is not None:
            out[f"perf/{phase}/floor_s"] = floor
            out[f"perf/{phase}/limit_frac"] = floor / max(seconds, 1e-9)
            tot["floor_s"] += floor
        return out

    def summary(self) -> dict[str, dict[str, float]]:
        """Per phase of the training steps the run's seconds, floor and share of the floor (summary.json's ``time``)."""
        out = {}
        for p, t in self.totals.items():
            if p == "eval":  # each evaluation is summed apart (summary.json's time_evals)
                continue
            out[p] = {"s": round(t["s"], 2), "floor_s": round(t["floor_s"], 3),
                      "limit_frac": round(t["floor_s"] / max(t["s"], 1e-9), 4)}
            if t["engine_s"]:
                out[p] |= {"engine_s": round(t["engine_s"], 2), "host_s": round(t["s"] - t["engine_s"], 2)}
        return out


def model_cost(module: Any, *, engine: Any = None, dtype: str, train_dtype: str, trained: bool,
               recompute: float) -> ModelCost:
    """The :class:`ModelCost` of a loaded decoder ``module`` (its ``config``), decoded by ``engine`` (an hf engine:
    its copies; another: none)."""
    from teamrl.plan import decode_copies
    from teamrl.plan.shapes import Shape

    c = module.config
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    kv = getattr(c, "num_key_value_heads", None) or heads
    total = sum(p.numel() for p in module.parameters())
    emb_in, emb_out = module.get_input_embeddings(), module.get_output_embeddings()
    tied = emb_out is not None and emb_in.weight.data_ptr() == emb_out.weight.data_ptr()
    params = total - (0 if tied else emb_in.weight.numel())
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad) if trained else 0
    weight_bytes = 2 if dtype == "bfloat16" else 4
    engine_model = getattr(engine, "model", module)
    engine_bytes = next(engine_model.parameters()).element_size() if engine_model is not None else weight_bytes
    copies = 0
    if engine is not None and getattr(engine, "source", None) is not None:
        if engine.model is not engine.source:
            copies += total  # the rollout copy in another dtype
        if getattr(engine, "fuse", False) and getattr(engine, "_fast", False):
            shape = Shape(c.num_hidden_layers, c.hidden_size, getattr(c, "intermediate_size", 4 * c.hidden_size),
                          heads, kv, c.vocab_size, tied, head_dim)
            device = next(module.parameters()).device
            copies += decode_copies(shape, packed=device.type == "cpu" and getattr(engine, "pack", False))
    engine_bytes = 2 if engine_bytes <= 2 else 4
    return ModelCost(params, trainable, c.num_hidden_layers, heads * head_dim, kv * head_dim, engine_bytes,
                     weight_bytes, train_dtype, recompute, copies)
