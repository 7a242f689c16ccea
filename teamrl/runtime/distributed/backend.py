"""``backend: ray``: every physical model's engine and learner as Ray actors; the loop stays in the driver.

The :class:`~teamrl.train.trainer.Trainer` runs unchanged: it gets engines and learners by model
name, as from :func:`teamrl.runtime.local.build`, except that they are proxies to actors.
Rollout (the workflow runner and dispatcher), credit, advantages, metrics and checkpoints run in
the driver; generation and updates run in the actors. Nothing of the algorithm is duplicated.

Placement, per model (``models.<name>.placement``)::

    colocate: true (default)              colocate: false
    ┌ bundle 0 ────────────────┐          ┌ bundle 0 ──────┐ ┌ bundle 1 ──────┐ ┌ bundle W ──────┐
    │ learner rank 0 + engine  │ ...      │ learner rank 0 │ │ learner rank 1 │ │ engine (copy)  │
    │ (same module: free sync) │          └────────────────┘ └────────────────┘ └────────────────┘
    └──────────────────────────┘          weights: rank 0 → object store → engine, after each update

Each model gets one placement group (one bundle per actor: ``num_cpus``, ``num_gpus``, custom
``resources``; ``strategy``); models on the same cluster share its resource pool, and fractional
``num_gpus`` let models share a device. ``dp_workers`` learner ranks form one torch.distributed
group (gloo on CPU, NCCL on GPU) and sum gradients (:mod:`teamrl.runtime.distributed.dp`); with
``sharding: fsdp`` they hold FSDP2 shards, and reading weights or optimizer state is a call to every
rank (rank 0 returns the gathered tensors). A frozen model
(``trainable: false``) gets one engine actor; an ``openai`` model needs no actor (its engine is an
HTTP client in the driver).

One step::

    driver   rollout ──────────────► credit/advantages ─► update (all models at once) ─► sync ─► log/ckpt
    engines  add/step (hf, continuous) or generate(batch) (vllm, lockstep)              load weights
    learners                                             update(steps of its model)

``learner.update`` returns at once with metrics that are fetched when first read, so the learners
of different models train in parallel while the trainer's loop stays a plain ``for`` over models.

Failures: every remote call waits at most ``ray.timeout_s``; a dead actor (killed, out of memory,
its node gone) or a timeout raises :class:`ActorFailure` naming the model, the actor and the
newest checkpoint to resume from (``teamrl train CONFIG --resume``), instead of hanging.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from teamrl import hardware
from teamrl.config.schema import Config
from teamrl.engines.base import Engine, GenOutput, GenRequest
from teamrl.learner import checkpoint
from teamrl.learner.base import Learner
from teamrl.metrics.perf import ModelPerf
from teamrl.runtime.base import Runtime
from teamrl.team.records import Step

log = logging.getLogger(__name__)

_LIVE: list[Any] = []  # actors and placement groups made by build(), for shutdown()


class ActorFailure(RuntimeError):
    """A Ray actor died or did not answer in time; the message says how to resume."""


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError("backend: ray needs the ray package: pip install 'teamrl[ray]', or set backend: local") from exc
    return ray


class _Caller:
    """Waits for remote results with the configured timeout and turns failures into :class:`ActorFailure`."""

    def __init__(self, timeout_s: float, checkpoints: Path) -> None:
        self.timeout_s, self.checkpoints = timeout_s, checkpoints

    def get(self, refs: Any, what: str) -> Any:
        ray = _ray()
        try:
            return ray.get(refs, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError as exc:
            raise ActorFailure(self._message(what, f"no answer within ray.timeout_s={self.timeout_s} s")) from exc
        except ray.exceptions.RayActorError as exc:
            cause = " ".join(str(exc).split())[-600:]  # Ray's account: killed, out of memory, node lost, or its __init__ error
            raise ActorFailure(self._message(what, f"the actor died ({type(exc).__name__}: ...{cause})")) from exc

    def _message(self, what: str, why: str) -> str:
        latest = checkpoint.latest(self.checkpoints)
        resume = (f"the newest checkpoint is {latest}; continue with `teamrl train CONFIG --resume`" if latest
                  else f"no checkpoint was written yet under {self.checkpoints}; start again (or set train.save_every lower)")
        return f"{what}: {why}. {resume}"


class _Generator:
    """The engine actor's sampling generator, as the trainer's checkpoint code sees it."""

    def __init__(self, proxy: EngineProxy) -> None:
        self.proxy = proxy

    def get_state(self) -> Any:
        return self.proxy.call.get(self.proxy.actor.generator_state.remote(), self.proxy.what("generator_state"))

    def set_state(self, state: Any) -> None:
        self.proxy.call.get(self.proxy.actor.set_generator_state.remote(state), self.proxy.what("set_generator_state"))


class EngineProxy:
    """The engine of one model, living in an actor; same surface as an in-process engine."""

    def __init__(self, name: str, actor: Any, tokenizer: Any, call: _Caller, *, weights_from: list[Any] | None = None) -> None:
        self.name, self.actor, self.tokenizer, self.call = name, actor, tokenizer, call
        # when the engine holds its own copy: learner rank 0's actor, or every rank's under FSDP (all gather the shards)
        self.weights_from = weights_from
        self.generator = _Generator(self)
        self.actors: list[Any] = []  # every actor of this model (learner ranks, then the engine's own)

    def what(self, method: str) -> str:
        return f"engine of model {self.name!r} ({method})"

    def generate(self, requests: list[GenRequest], on_progress: Callable[[int], None] | None = None) -> list[GenOutput]:
        outs = self.call.get(self.actor.generate.remote(requests), self.what("generate"))
        if on_progress is not None:
            on_progress(len(outs))
        return outs

    def sync_weights(self) -> None:
        """Colocated: the actor's engine syncs from its own learner; split: learner rank 0's weights travel here."""
        if self.weights_from is None:
            self.call.get(self.actor.sync_weights.remote(), self.what("sync_weights"))
        else:
            refs = [r.weights.remote() for r in self.weights_from]  # rank 0's holds the weights
            self.call.get([self.actor.load_weights.remote(refs[0]), *refs[1:]], self.what("load_weights"))

    def release_memory(self) -> None:
        self.call.get(self.actor.release_memory.remote(), self.what("release_memory"))

    def reset(self) -> None:
        self.call.get(self.actor.reset.remote(), self.what("reset"))


class SteppedEngineProxy(EngineProxy):
    """An engine with the step API (hf): the dispatcher's continuous scheduler drives it one decode step
    per remote call, so calls join the running batch as in one process. ``busy`` is tracked here (the
    ids added and not yet returned), so asking costs no round trip."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outstanding: set[int] = set()

    def add(self, requests: list[GenRequest]) -> list[int]:
        ids = self.call.get(self.actor.add.remote(requests), self.what("add"))
        self.outstanding.update(ids)
        return ids

    @property
    def busy(self) -> bool:
        return bool(self.outstanding)

    def step(self) -> list[tuple[int, GenOutput]]:
        done = self.call.get(self.actor.step.remote(), self.what("step"))
        self.outstanding.difference_update(rid for rid, _ in done)
        return done

    def reset(self) -> None:
        self.outstanding.clear()
        super().reset()


class _PendingStats(Mapping):
    """A learner's update metrics, fetched from its actors when first read."""

    def __init__(self, refs: list[Any], call: _Caller, what: str) -> None:
        self.refs, self.call, self.what = refs, call, what
        self._value: dict[str, float] | None = None

    def _get(self) -> dict[str, float]:
        if self._value is None:
            self._value = self.call.get(self.refs, self.what)[0]  # every rank returns the same metrics
        return self._value

    def __getitem__(self, key: str) -> float:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


class LearnerProxy:
    """The learner of one model: ``dp_workers`` actors; same surface as :class:`teamrl.learner.learner.TorchLearner`."""

    def __init__(self, name: str, ranks: list[Any], call: _Caller, *, sharded: bool = False) -> None:
        self.name, self.ranks, self.call = name, ranks, call
        # FSDP: reading weights or optimizer state gathers the shards, so every rank takes part (rank 0 gets them)
        self.readers = ranks if sharded else ranks[:1]
        self.engine: EngineProxy | None = None  # re-synced after weights are loaded from a checkpoint

    def what(self, method: str) -> str:
        return f"learner of model {self.name!r} ({len(self.ranks)} worker(s), {method})"

    def update(self, steps: list[Step], step: int | None = None) -> Mapping:
        """Start the update on every rank; the metrics are fetched when first read (models train in parallel)."""
        return _PendingStats([r.update.remote(steps, step) for r in self.ranks], self.call, self.what("update"))

    def weight_files(self) -> dict[str, dict[str, Any]]:
        return self.call.get([r.weight_files.remote() for r in self.readers], self.what("weight_files"))[0]

    def load_weight_files(self, files: dict[str, dict[str, Any]]) -> None:
        self.call.get([r.load_weight_files.remote(files) for r in self.ranks], self.what("load_weight_files"))
        if self.engine is not None:
            self.engine.sync_weights()

    def state_dict(self) -> dict[str, Any]:
        return self.call.get([r.state_dict.remote() for r in self.readers], self.what("state_dict"))[0]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.call.get([r.load_state_dict.remote(state) for r in self.ranks], self.what("load_state_dict"))

    def drop_optimizer_state(self) -> None:
        self.call.get([r.drop_optimizer_state.remote() for r in self.ranks], self.what("drop_optimizer_state"))


def build(cfg: Config, run_dir: Path) -> Runtime:
    """Start the actors of every model some agent uses; returns their engines and learners (proxies) like
    :func:`teamrl.runtime.local.build` (no modules: the weights live in the actors)."""
    ray = _ray()
    from teamrl.engines.registry import build_engine, engine_spec
    from teamrl.models import load_tokenizer

    if not ray.is_initialized():
        ray.init(address=cfg.ray.address, num_cpus=cfg.ray.num_cpus if cfg.ray.address is None else None,
                 include_dashboard=False, log_to_driver=True)
    call = _Caller(cfg.ray.timeout_s, Path(run_dir) / "checkpoints")
    engines: dict[str, Engine] = {}
    learners: dict[str, Learner] = {}
    perf: dict[str, ModelPerf] = {}
    for name in sorted({a.model for a in cfg.agents.values()}):
        mc = cfg.models[name]
        if not engine_spec(mc).local_weights:  # e.g. openai: an HTTP client in the driver, no actor
            engines[name] = build_engine(cfg, name, load_tokenizer(mc.path))
            continue
        engine, learner = _start_model(cfg, name, call)
        engines[name] = engine
        if learner is not None:
            learners[name] = learner
        perf[name] = _perf(engine, learner, call)
    return Runtime(engines, learners, perf=perf)


def _perf(engine: EngineProxy, learner: LearnerProxy | None, call: _Caller) -> ModelPerf:
    """Model ``engine.name``'s size and its engine's and learner workers' devices, as its actors report them."""
    e = call.get(engine.actor.perf.remote(), engine.what("perf"))
    ranks = call.get([r.perf.remote() for r in learner.ranks], learner.what("perf")) if learner else []
    return ModelPerf(e["params"], e["device"], e["peak"], tuple(r["device"] for r in ranks))


def _start_model(cfg: Config, name: str, call: _Caller) -> tuple[EngineProxy, LearnerProxy | None]:
    ray = _ray()
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from teamrl.engines.registry import engine_spec
    from teamrl.models import load_tokenizer
    from teamrl.runtime.distributed.worker import ModelWorker

    mc, pl = cfg.models[name], cfg.models[name].placement
    bundle = {k: v for k, v in {"CPU": pl.num_cpus, "GPU": pl.num_gpus, **pl.resources}.items() if v > 0}
    if not bundle:
        raise ValueError(f"models.{name}.placement reserves nothing (num_cpus 0, num_gpus 0, no resources); "
                         f"Ray needs at least one, e.g. num_cpus: 1")
    learner_ranks = pl.dp_workers if mc.trainable else 0
    separate_engine = not mc.trainable or not pl.colocate
    tag = f"teamrl-{name}-{uuid.uuid4().hex[:6]}"  # unique: several runs may share one cluster
    pg = placement_group([dict(bundle) for _ in range(learner_ranks + separate_engine)], strategy=pl.strategy, name=tag)
    _LIVE.append(pg)
    try:
        ray.get(pg.ready(), timeout=min(cfg.ray.timeout_s, 300))
    except ray.exceptions.GetTimeoutError as exc:
        raise ActorFailure(f"model {name!r}: the cluster cannot place {learner_ranks + separate_engine} actor(s) of "
                           f"{bundle} ({pl.strategy}); it has {ray.cluster_resources()}. Lower models.{name}.placement "
                           f"or add nodes") from exc
    threads = cfg.train.threads or max(1, int(pl.num_cpus))
    speed = hardware.cpu_bf16_speed()  # measured here once: every rank of the model resolves the same autocast
    remote = ray.remote(ModelWorker)

    def actor(index: int, **kw: Any) -> Any:
        strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=index)
        a = remote.options(num_cpus=pl.num_cpus, num_gpus=pl.num_gpus, resources=dict(pl.resources),
                           scheduling_strategy=strategy, max_restarts=0,
                           name=f"{tag}-{kw['role']}{kw.get('rank', '')}").remote(cfg, name, threads=threads,
                                                                                    bf16_speed=speed, **kw)
        _LIVE.append(a)
        return a

    ranks = [actor(r, role="learner", rank=r, world=learner_ranks, with_engine=r == 0 and not separate_engine)
             for r in range(learner_ranks)]
    sharded = pl.sharding == "fsdp" and learner_ranks > 0
    if learner_ranks > 1 or sharded:
        address, port = call.get(ranks[0].rendezvous.remote(), f"learner of model {name!r} (rendezvous)")
        call.get([r.join.remote(address, port) for r in ranks], f"learner of model {name!r} (process group)")
    engine_actor = actor(learner_ranks, role="engine") if separate_engine else ranks[0]
    call.get(engine_actor.where.remote(), f"engine of model {name!r} (start)")
    proxy = SteppedEngineProxy if engine_spec(mc).stepped else EngineProxy  # the step API: continuous scheduler
    engine = proxy(name, engine_actor, load_tokenizer(mc.path), call,
                   weights_from=(ranks if sharded else ranks[:1]) if separate_engine and ranks else None)
    learner = LearnerProxy(name, ranks, call, sharded=sharded) if ranks else None
    engine.actors = ranks + ([engine_actor] if separate_engine else [])
    if learner is not None:
        learner.engine = engine
    log.info("model %s: %d learner worker(s)%s, engine %s", name, learner_ranks,
             f" (FSDP2-sharded{', offloaded to CPU' if pl.offload else ''})" if sharded else "",
             "in its own actor" if separate_engine else "colocated with learner rank 0")
    return engine, learner


def shutdown() -> None:
    """Kill every actor and remove every placement group that :func:`build` made in this process."""
    ray = _ray()
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    while _LIVE:
        item = _LIVE.pop()
        try:
            remove_placement_group(item) if isinstance(item, PlacementGroup) else ray.kill(item)
        except Exception as exc:  # already gone with its node or the cluster
            log.debug("shutdown: %s", exc)
