"""The training loop: rollout → credit → advantages → one update per physical model → log.

All choices are made in :meth:`Trainer.__init__` (task, workflow, models, engines, learners);
:meth:`Trainer.train` reads top to bottom with no branches on config strings.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import yaml

from teamrl import runtime as runtime_
from teamrl.config import tools as configtools
from teamrl.config.schema import Config, task_options, workflow_options
from teamrl.learner import checkpoint
from teamrl.metrics import sinks
from teamrl.metrics.diagnostics import SpikeCounter
from teamrl.metrics.memory import PeakMemory, heap_frozen, peak_rss_gb
from teamrl.metrics.perf import PerfMeter
from teamrl.metrics.phases import PhaseMeter
from teamrl.metrics.sinks import MetricsSink, append_jsonl
from teamrl.runtime import Runtime
from teamrl.scoring import Context, Scorer
from teamrl.scoring.distill_jsd import distill_learners
from teamrl.tasks.base import Problem, Task, build_task, grading_scope
from teamrl.team.agents import get_agent
from teamrl.team.records import Episode
from teamrl.team.registry import get_workflow
from teamrl.team.team import AgentBinding, Dispatcher
from teamrl.train import preflight, rundir
from teamrl.train.evaluation import EvaluationFailed, eval_result, failed_evaluation
from teamrl.train.progress import TokenProgress, UpdateProgress
from teamrl.train.reporting import (  # noqa: F401  (also importable from here, as before)
    episodes_without_calls,
    eval_metrics,
    multi_call_rate,
    rollout_metrics,
    transcript,
    update_metrics,
)
from teamrl.train.rollout import EpisodesFailed, Rollout
from teamrl.train.sampler import ProblemSampler
from teamrl.train.updates import build_updates

log = logging.getLogger(__name__)


class Trainer:
    """Builds a team from a config and trains it."""

    def __init__(self, cfg: Config, *, resume: bool = False, progress: bool = True,
                 runtime: Runtime | None = None, overwrite: bool = False, allow_change: Sequence[str] = ()) -> None:
        """``runtime``: engines and learners already built for ``cfg`` (default: built here by
        :func:`teamrl.runtime.build`, on the configured backend). A run folder holding an earlier run's records
        needs ``resume`` (continue it) or ``overwrite`` (move them aside): :func:`teamrl.train.rundir.claim`.
        A resume refuses a config that differs from the run's own in keys not named in ``allow_change``
        (:func:`teamrl.train.preflight.resume_changes`)."""
        refused = preflight.resume_changes(cfg, allow_change) if resume else None
        if refused:
            raise preflight.RunCheckError([refused])
        cfg = runtime_.prepare(cfg)
        self.cfg, self.progress = cfg, progress
        sinks.require(cfg.train.loggers)  # a missing tracker package fails before any model loads
        self.run_dir = Path(cfg.run_dir)
        with rundir.guard(self.run_dir, "the run folder"):
            rundir.claim(self.run_dir, resume=resume, overwrite=overwrite)
            self.run_dir.mkdir(parents=True, exist_ok=True)
            rundir.check_writable(self.run_dir)
            checkpoint.remove_stale_tmp(self.run_dir / "checkpoints")  # of a process killed mid-checkpoint
        if cfg.train.threads > 0:
            torch.set_num_threads(cfg.train.threads)
        random.seed(cfg.train.seed)
        torch.manual_seed(cfg.train.seed)
        self.task = build_task(cfg.task.name, task_options(cfg.task))
        wf = get_workflow(cfg.workflow.name)
        self._check_workflows()  # e.g. a game the random opponent cannot play: refused before any model loads
        self.runtime = runtime or runtime_.build(cfg, self.run_dir)
        self.models, self.engines, self.learners = self.runtime.modules, self.runtime.engines, self.runtime.learners
        self.memory = PeakMemory(release=cfg.train.release_memory)
        self.eval_peaks: dict[str, float] = {}
        self.eval_times: dict[str, dict[str, float]] = {}
        """Seconds, floor and share of the floor of each evaluation this process ran, by tag."""
        """Peak resident memory of each evaluation this process ran, by tag (GiB)."""
        self.perf = PerfMeter(self.models, {n: "bfloat16" if "bfloat16" in (m.dtype, m.train_autocast) else "float32"
                                            for n, m in cfg.models.items()}, remote=self.runtime.perf)
        self.phases = PhaseMeter.build(cfg, self.models, self.engines)
        self.bindings = {name: self._binding(name) for name in cfg.agents}
        self.rollout = Rollout(Dispatcher(self.engines, schedulers={m: cfg.models[m].scheduler for m in self.engines},
                                          context_limits={m: cfg.models[m].max_context for m in self.engines}),
                               self.bindings, wf, workflow_options(cfg.workflow), self.task)
        budget = cfg.loss.micro_batch_tokens if isinstance(cfg.loss.micro_batch_tokens, int) else 4096
        ctx = Context(self.rollout, {n: a.max_new_tokens for n, a in cfg.agents.items()}, self.task.name, cfg.train.seed,
                      modules=self.models | self.runtime.teachers, logits_chunk=cfg.loss.logits_chunk_tokens,
                      row_tokens=budget, pack=(cfg.loss.pack_rows, cfg.loss.share_prefixes,
                                               any(getattr(getattr(lr, "s", None), "autocast", False)
                                                   for lr in self.learners.values())))
        self.scorer = Scorer.build(cfg.algo, ctx, batch_size=cfg.rollout.batch_size)
        if cfg.algo.distill.teachers and cfg.algo.distill.loss == "jsd":  # the teachers' divergence, in the learners
            distill_learners(self.learners, ctx.modules or {}, cfg)
        self.updates = build_updates(cfg.train.update_mode, self.learners, min_steps=cfg.train.min_buffer_steps,
                                     max_steps=cfg.train.max_update_steps, max_lag=cfg.train.max_policy_lag,
                                     whole_batches=cfg.train.whole_batches)
        self.eval_workflow = cfg.eval.workflow or cfg.workflow.name
        self._sampler: ProblemSampler | None = None  # the train split is read on first use: eval needs none
        self.start_step = 0
        self.results: dict[str, Any] = {}
        self.spikes = SpikeCounter(factor=cfg.train.spike_factor, window=cfg.train.spike_window)
        with rundir.guard(self.run_dir, "config.yaml" if not resume else "the resumed records"):
            if resume:
                self._resume()
                saved_file = self.run_dir / "config.yaml"
                saved = (yaml.safe_load(saved_file.read_text()) or {}) if saved_file.is_file() else {}
                for key, (a, b) in preflight.config_changes(saved, configtools.to_dict(cfg)).items():
                    log.info("resume: %s %r -> %r (allowed)", key, a, b)
                (self.run_dir / "config.yaml").write_text(yaml.safe_dump(configtools.to_dict(cfg), sort_keys=False))
            else:
                (self.run_dir / "config.yaml").write_text(yaml.safe_dump(configtools.to_dict(cfg), sort_keys=False))
            self.sink = MetricsSink(self.run_dir, cfg.train.loggers, config=configtools.to_dict(cfg),
                                    samples_every=cfg.train.log_samples_every, project=cfg.train.tracker_project)

    def _binding(self, name: str, temperature: float | None = None, top_p: float | None = None) -> AgentBinding:
        ac = self.cfg.agents[name]
        agent = get_agent(name)
        return AgentBinding(agent, ac.model, ac.sampling(temperature, top_p),
                            agent.system_prompt if ac.system_prompt is None else ac.system_prompt, ac.adapter,
                            dict(ac.chat_template_kwargs), ac.tool_format, ac.max_prompt_tokens, ac.truncation)

    def _check_workflows(self) -> None:
        """Each workflow's own check (:attr:`~teamrl.team.registry.WorkflowSpec.check`) of the training and the
        evaluation workflow on the task: a one-line ValueError naming the workflow."""
        cfg = self.cfg
        names = {cfg.workflow.name: "workflow.name"}
        names.setdefault(cfg.eval.workflow or cfg.workflow.name, "eval.workflow")
        for name, key in names.items():
            spec = get_workflow(name)
            if spec.check is not None:
                try:
                    spec.check(workflow_options(replace(cfg.workflow, name=name)), self.task)
                except ValueError as exc:
                    raise ValueError(f"{key} {name}: {exc}") from None

    @property
    def sampler(self) -> ProblemSampler:
        """The train problems' sampler, built on first use (evaluating alone needs no train split)."""
        if self._sampler is None:
            self._sampler = ProblemSampler(self.task.problems("train"), self.cfg.train.seed)
        return self._sampler

    # ------------------------------------------------------------------ the loop

    def train(self) -> dict[str, Any]:
        """Train ``train.steps`` steps (from the resumed one); a full disk or a read-only run folder ends in one
        :class:`~teamrl.train.rundir.RunDirError` line saying what was kept."""
        with rundir.guard(self.run_dir, "the run's records"), heap_frozen():
            return self._train()

    def _train(self) -> dict[str, Any]:
        cfg = self.cfg
        every = cfg.eval.every
        sampler = self.sampler  # a task without a train split fails here, before any evaluation
        if cfg.eval.before and "before" not in self.results:
            try:
                self.results["before"] = self.evaluate("before")
            except EvaluationFailed as exc:  # nothing is trained yet, so nothing is lost: one line, exit 2
                raise ValueError(f"{exc}; nothing was trained (the evaluation after training would fail the same "
                                 f"way; fix it, or set eval.before=false)") from None
            if every:
                self.sink.write(0, eval_metrics(self.results["before"]))
        bar = TokenProgress("train", enabled=self.progress, every_s=0, unit="steps", leave=True)
        bar.update(self.start_step, cfg.train.steps)
        for step in range(self.start_step, cfg.train.steps):
            if every and step > 0 and step % every == 0:  # also right after a resume: its rows were dropped
                self.evaluate_along(step)
            t0 = time.perf_counter()
            w0 = self.phases.snapshot(self.engines)
            problems = sampler.next(cfg.rollout.batch_size)
            with self.memory.phase("rollout"), grading_scope() as graded:
                episodes = self.rollout.collect(problems, cfg.rollout.group_size, progress=self.progress,
                                                tree=tuple(cfg.rollout.prefix_tree))
                # credit (its reruns with the engines still awake), reward terms, advantages, selection (a refill
                # rolls out more problems through self._collect): teamrl.scoring
                scored = self.scorer.score(episodes, problems, step, self._collect)
            credit_s = scored.metrics["perf/credit_s"]
            terms_s = scored.metrics.get("perf/advantage_terms_s", 0.0)  # a teacher's forwards: the logprobs phase
            steps, trained = scored.steps, scored.trained
            for engine in self.engines.values():  # e.g. vLLM sleeps so a colocated learner gets the memory
                engine.release_memory()
            w1 = self.phases.snapshot(self.engines)
            t1 = time.perf_counter()
            tokens = sum(len(s.response_ids) for s in trained if s.advantage != 0.0 or s.token_advantages is not None)
            with self.memory.phase("update"), UpdateProgress(tokens, enabled=self.progress):
                stats, buffers = self.updates.run(trained, step)  # every learner, or those whose buffer is full (async)
                for engine in self.engines.values():  # learner -> engine weight sync (no-op when shared)
                    engine.sync_weights()
            t2 = time.perf_counter()
            w2 = self.phases.snapshot(self.engines)
            metrics = rollout_metrics(episodes, steps) | update_metrics(stats) | self.memory.metrics() | scored.metrics
            metrics |= buffers
            metrics |= {"rollout/context_length_exceeded":
                        float(sum("context_length_exceeded" in ep.info for ep in episodes)),
                        "rollout/grading_errors": float(graded[0])}
            metrics |= self.spikes.metrics(metrics)
            roll_s = t1 - t0 - credit_s - terms_s
            metrics |= {"perf/rollout_s": roll_s, "perf/credit_s": credit_s, "perf/update_s": t2 - t1,
                        "perf/step_s": t2 - t0}
            metrics |= self.perf.metrics(steps, roll_s, t2 - t1, set(stats))
            metrics |= self.phases.step_metrics((w0, w1, w2), (roll_s, t2 - t1), stats, teacher_s=terms_s)
            with rundir.guard(self.run_dir, f"the records of step {step}"):
                self.sink.write(step, metrics)
                self._write_transcripts(step, episodes, problems)
                self._keep_failures(step, episodes, problems)
            bar.update(step + 1, cfg.train.steps, f"reward {metrics['rollout/reward_mean']:.3f}, {t2 - t0:.0f} s/step")
            if (cfg.train.save_every and (step + 1) % cfg.train.save_every == 0) or step + 1 == cfg.train.steps:
                self.save(step + 1)
        bar.close()
        if every and cfg.train.steps % every == 0 and not cfg.eval.after:
            self.evaluate_along(cfg.train.steps)
        if cfg.eval.after and "after" not in self.results:
            saved = self._final_checkpoint_saved()
            if saved:  # AdamW's moments are on disk and no longer needed: the final evaluation runs without them
                for learner in self.learners.values():
                    learner.drop_optimizer_state()
            self.results["after"] = self.evaluate_or_report("after")  # the weights are on disk already
            if every:
                self.sink.write(cfg.train.steps, eval_metrics(self.results["after"]))
            if saved:  # the weights and optimizer states written at the last step stay; the results join them
                with rundir.guard(self.run_dir, f"checkpoint step_{cfg.train.steps}"):
                    checkpoint.save_trainer_state(self.run_dir / "checkpoints", cfg.train.steps, self._trainer_state())
            else:
                self.save(cfg.train.steps)
        elif cfg.eval.after and every:  # resumed after the final evaluation, whose row the resume dropped
            self.sink.write(cfg.train.steps, eval_metrics(self.results["after"]))
        summary = {**self.results, "grad_spikes": self.spikes.summary(),
                   "peak_rss_gb": round(max(self.memory.run_peak, peak_rss_gb()), 3),  # the whole run's, evaluations too
                   "peak_rss_gb_evals": self.eval_peaks, "time": self.phases.summary(),
                   "time_evals": self.eval_times}
        self.sink.close(summary)
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return self.results

    # ------------------------------------------------------------------ pieces

    def _collect(self) -> tuple[list[Problem], list[Episode]]:
        """The next ``rollout.batch_size`` problems of the train split, rolled out (a refill round of selection)."""
        more = self.sampler.next(self.cfg.rollout.batch_size)
        return more, self.rollout.collect(more, self.cfg.rollout.group_size, progress=self.progress,
                                          tree=tuple(self.cfg.rollout.prefix_tree))

    def evaluate(self, tag: str, task: Task | None = None) -> dict[str, Any]:
        """avg@n and pass@1..n (unbiased, n = ``eval.samples``) of the team on held-out problems of
        ``task`` (default: the training task's test split); written to ``eval_<tag>.json``. When every episode
        fails, that file records it (:func:`failed_evaluation`) and :class:`EvaluationFailed` is raised."""
        ev = self.cfg.eval
        task = task or self.task
        problems = task.problems("test")
        problems = problems[: ev.problems] if ev.problems else problems
        name = self.eval_workflow
        options = workflow_options(replace(self.cfg.workflow, name=name))
        rollout = replace(self.rollout, task=task, workflow=get_workflow(name), workflow_cfg=options,
                          bindings={n: self._binding(n, ev.temperature, ev.top_p) for n in self.cfg.agents})
        t0, w0 = time.perf_counter(), self.phases.snapshot(self.engines)
        failed: EpisodesFailed | None = None
        with self.memory.phase("eval"), grading_scope() as graded:  # what a checkpoint save or update freed goes back first
            try:
                episodes = rollout.collect(problems, ev.samples, desc=f"eval ({tag})", progress=self.progress)
            except EpisodesFailed as exc:
                failed = exc
        done = self.phases.delta(w0, self.phases.snapshot(self.engines))
        synced = sum(w.get("sync_s", 0.0) for w in done.values())
        timed = self.phases.record("eval", time.perf_counter() - t0 - synced, self.phases.decode_floor(done), engine=done)
        self.eval_times[tag] = {k.rpartition("/")[2]: round(v, 4) for k, v in timed.items()}  # summary.json
        self.eval_peaks[tag] = round(self.memory.peaks.pop("perf/peak_rss_gb/eval"), 3)  # summary.json (not step rows)
        self.memory.peaks.pop("perf/cuda_max_allocated_gb/eval", None)
        if failed is not None:  # the episodes and their errors are kept, and the record says it failed
            record = failed_evaluation(tag, failed, ev.samples, problems)
            self._write_eval(tag, failed.episodes, problems, record)
            raise EvaluationFailed(record)
        result = eval_result(episodes, problems, task, ev.samples, list(self.cfg.agents), graded[0])
        self._write_eval(tag, episodes, problems, result)
        return result

    def _write_eval(self, tag: str, episodes: list[Episode], problems: list[Problem], result: dict[str, Any]) -> None:
        """``eval_<tag>.json`` (the result) and ``eval_<tag>_episodes.jsonl`` (the episodes of this result only)."""
        (self.run_dir / f"eval_{tag}.json").write_text(json.dumps(result, indent=2))
        (self.run_dir / f"eval_{tag}_episodes.jsonl").unlink(missing_ok=True)
        append_jsonl(self.run_dir / f"eval_{tag}_episodes.jsonl",
                     [transcript(ep, problems[ep.prompt_index], -1) for ep in episodes])

    def evaluate_or_report(self, tag: str) -> dict[str, Any]:
        """:meth:`evaluate`, where an evaluation whose episodes all failed is a result saying so (``failed``: one
        line with the first episode's error), logged in one line: the evaluations during and after training, whose
        failure must not end a run whose weights are trained (and, after the last step, saved)."""
        try:
            return self.evaluate(tag)
        except EvaluationFailed as exc:
            log.warning("%s; the run goes on (its weights are kept)", exc)
            return exc.result

    def evaluate_along(self, step: int) -> dict[str, Any]:
        """The held-out evaluation after ``step`` updates (``eval.every``): ``eval_step<step>.json`` and
        ``eval/<score>`` rows at ``step`` in the metrics. The engines' sampling generators and the global
        random states are restored afterwards, so training samples what it would have sampled without it."""
        engines = {n: e.generator.get_state() for n, e in self.engines.items()}
        python, torch_cpu = random.getstate(), torch.get_rng_state()
        try:
            result = self.evaluate_or_report(f"step{step}")
        finally:
            for n, state in engines.items():
                self.engines[n].generator.set_state(state)
            random.setstate(python)
            torch.set_rng_state(torch_cpu)
        self.sink.write(step, eval_metrics(result))
        return result

    def _trainer_state(self) -> dict[str, Any]:
        return {"sampler_cursor": self.sampler.cursor, "results": self.results, "spikes": self.spikes.state_dict(),
                "updates": self.updates.state_dict(), "scoring": self.scorer.state_dict(),
                "engines": {n: e.generator.get_state() for n, e in self.engines.items()}}

    def _final_checkpoint_saved(self) -> bool:
        """Whether the newest checkpoint is the last step's, with every model's optimizer state."""
        root = self.run_dir / "checkpoints"
        found = checkpoint.latest(root)
        return (found is not None and found.name == f"step_{self.cfg.train.steps}"
                and all((found / f"optim-{name}.safetensors").is_file() for name in self.learners))

    def save(self, step: int) -> None:
        with rundir.guard(self.run_dir, f"checkpoint step_{step}"):
            checkpoint.save(self.run_dir / "checkpoints", step, self.learners, self._trainer_state())
            checkpoint.prune(self.run_dir / "checkpoints", self.cfg.train.keep_checkpoints)

    def _resume(self) -> None:
        path = checkpoint.latest(self.run_dir / "checkpoints")
        if path is None:
            raise FileNotFoundError(f"--resume: no checkpoint under {self.run_dir / 'checkpoints'}; train without --resume first")
        state = checkpoint.load(path, self.learners)
        self.sampler.cursor = state["sampler_cursor"]
        self.results = state["results"]
        self.spikes.load_state_dict(state.get("spikes", {"history": {}, "counts": {}}))
        self.updates.load_state_dict(state.get("updates", {}))
        self.scorer.load_state_dict(state.get("scoring", {"advantages": {"baselines": state.get("role_baselines", {})}}))
        for n, s in state["engines"].items():
            self.engines[n].generator.set_state(s)
        for engine in self.engines.values():  # learner -> engine: a bf16 rollout copy must hold the resumed weights
            engine.sync_weights()
        self.start_step = state["step"]
        for name in rundir.RECORDS:  # rows a killed run wrote past it, and a torn last line
            rundir.drop_rows_from(self.run_dir / name, self.start_step)
        log.info("resumed from %s (step %d)", path, self.start_step)

    @staticmethod
    def find_checkpoint(path: Path) -> Path:
        """The checkpoint ``path`` names: a ``checkpoints/step_N`` folder, or a run directory's latest."""
        found = checkpoint.latest(path / "checkpoints") if (path / "checkpoints").is_dir() else path
        if found is None or not checkpoint.is_checkpoint(found):
            raise FileNotFoundError(f"--checkpoint {path}: no checkpoint there; pass a run directory with "
                                    f"checkpoints/latest or a checkpoints/step_N folder")
        return found

    def load_weights(self, path: Path) -> None:
        """Load the weights of checkpoint ``path`` (a ``checkpoints/step_N`` folder or a run directory)."""
        found = self.find_checkpoint(Path(path))
        checkpoint.load_weights_only(found, self.learners)
        for engine in self.engines.values():
            engine.sync_weights()
        log.info("loaded weights from %s", found)

    def _keep_failures(self, step: int, episodes: list[Episode], problems: list[Problem]) -> None:
        """Failed episodes are not trained on; their transcripts and errors go to failed_episodes.jsonl."""
        failed = [ep for ep in episodes if ep.error is not None]
        if failed:
            log.warning("step %d: %d of %d episodes failed and were left out of the update; first: %s",
                        step, len(failed), len(episodes), failed[0].error)
            append_jsonl(self.run_dir / "failed_episodes.jsonl",
                         [transcript(ep, problems[ep.prompt_index], step) for ep in failed])

    def _write_transcripts(self, step: int, episodes: list[Episode], problems: list[Problem]) -> None:
        n = self.cfg.train.transcripts_per_step
        picks = episodes[:: max(1, len(episodes) // n)][:n] if n else []
        records = [transcript(ep, problems[ep.prompt_index], step) for ep in picks]
        append_jsonl(self.run_dir / "episodes.jsonl", records)
        self.sink.samples(step, records)
