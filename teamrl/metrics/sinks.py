"""Where metrics go: ``metrics.jsonl`` (always) and the experiment trackers of ``train.loggers``.

Rows are appended whole (:func:`append_jsonl`): a failed write leaves no part of its line.

Every tracker gets the same things under the same names: each step's metrics (``agent/<name>/...``
are the per-agent curves), the resolved config, a table of sampled episode transcripts (who said
what, reward, advantage) every ``train.log_samples_every`` steps, and the held-out scores at the
end (``eval/<before|after>/<score>``).

- tensorboard: event files in ``<run_dir>/tensorboard`` (plus a "per agent" layout that draws
  every agent's curve of a metric in one chart).
- wandb: Weights & Biases (``pip install 'teamrl[wandb]'``); ``WANDB_MODE=offline`` writes
  ``<run_dir>/wandb/offline-run-*`` without an account (``wandb sync`` uploads it later).
- mlflow: MLflow (``pip install 'teamrl[mlflow]'``); logs to ``MLFLOW_TRACKING_URI`` when set,
  else to a local file store ``<run_dir>/mlruns``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import yaml

log = logging.getLogger(__name__)

SAMPLE_COLUMNS = ["step", "problem_id", "episode", "agent", "agent_call", "text", "reward", "advantage",
                  "episode_reward", "final", "gold"]
"""Columns of the episode table each tracker receives: one row per agent turn."""

_PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"),
             "mlflow": ("mlflow", "mlflow")}  # logger -> (module, extra of teamrl)


class Tracker(Protocol):
    """One experiment tracker; :class:`MetricsSink` calls these in this order."""

    def log_config(self, config: dict[str, Any]) -> None: ...

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None: ...

    def log_samples(self, step: int, rows: list[list[Any]]) -> None: ...

    def close(self, scores: dict[str, float]) -> None: ...


def require(loggers: Sequence[str]) -> None:
    """Fail early, before any model loads, when a tracker's package is not installed.

    Raises:
        ImportError: one line naming the extra that installs it.
    """
    for name in loggers:
        module, extra = _PACKAGES[name]
        if name != "tensorboard" and importlib.util.find_spec(module) is None:
            raise ImportError(f"train.loggers: {name!r} needs the {module} package; "
                              f"pip install 'teamrl[{extra}]' (or remove {name!r} from train.loggers)")


class MetricsSink:
    """Appends each step's metrics to ``metrics.jsonl`` and hands everything to the trackers.

    Args:
        run_dir: the run directory.
        loggers: names from ``train.loggers``.
        config: the resolved config as a plain dict (what ``config.yaml`` holds).
        samples_every: send the episode table at steps divisible by this (0: never).
        project: W&B project / MLflow experiment.
    """

    def __init__(self, run_dir: Path, loggers: Sequence[str] = ("tensorboard",), *, config: dict[str, Any] | None = None,
                 samples_every: int = 0, project: str = "teamrl") -> None:
        require(list(loggers))
        self.path = run_dir / "metrics.jsonl"
        self.samples_every = samples_every
        builders = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "mlflow": MLflowTracker}
        self.trackers: list[Tracker] = []
        for name in loggers:
            try:
                self.trackers.append(builders[name](run_dir, project=project, config=config or {}))
            except ImportError:
                if name != "tensorboard":
                    raise
                # tensorboard is a dependency, but a broken install must not stop training
                log.warning("tensorboard is not importable; its metrics go to metrics.jsonl only")
        for t in self.trackers:
            t.log_config(config or {})

    def write(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: (v if math.isfinite(v) else None) for k, v in metrics.items()}
        append_jsonl(self.path, [{"step": step, **clean}])
        finite = {k: float(v) for k, v in metrics.items() if math.isfinite(v)}
        for t in self.trackers:
            t.log_metrics(step, finite)

    def samples(self, step: int, transcripts: list[dict[str, Any]]) -> None:
        """Send the table of ``transcripts`` (records of :func:`teamrl.train.trainer.transcript`) when due."""
        if self.samples_every and step % self.samples_every == 0 and transcripts:
            rows = sample_rows(transcripts)
            for t in self.trackers:
                t.log_samples(step, rows)

    def close(self, summary: dict[str, Any] | None = None) -> None:
        """Finish every tracker; ``summary`` (summary.json) adds the held-out scores."""
        scores = eval_scores(summary or {})
        for t in self.trackers:
            t.close(scores)


def sample_rows(transcripts: list[dict[str, Any]]) -> list[list[Any]]:
    """One row per agent turn, in :data:`SAMPLE_COLUMNS` order.

    >>> ep = {"step": 3, "problem_id": "p1", "final": "4", "gold": "4", "reward": 1.0,
    ...       "turns": [{"agent": "solver", "agent_call": 0, "text": "2+2=4", "reward": 1.0, "advantage": 0.5}]}
    >>> sample_rows([ep])
    [[3, 'p1', 0, 'solver', 0, '2+2=4', 1.0, 0.5, 1.0, '4', '4']]
    """
    rows = []
    for i, ep in enumerate(transcripts):
        for t in ep["turns"]:
            rows.append([ep["step"], str(ep["problem_id"]), i, t["agent"], t["agent_call"], t["text"], t["reward"],
                         t["advantage"], ep["reward"], str(ep["final"]), str(ep["gold"])])
    return rows


def eval_scores(summary: dict[str, Any]) -> dict[str, float]:
    """The numeric held-out scores of summary.json, named ``eval/<tag>/<score>``.

    >>> eval_scores({"after": {"accuracy": 0.5, "pass@2": 0.75, "problems": 8, "calls_per_episode": {"solver": 1.0}}})
    {'eval/after/accuracy': 0.5, 'eval/after/pass@2': 0.75, 'eval/after/problems': 8.0}
    """
    out = {}
    for tag in ("before", "after"):
        for k, v in (summary.get(tag) or {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                out[f"eval/{tag}/{k}"] = float(v)
    return out


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config dict -> dotted keys.

    >>> flatten({"train": {"steps": 2, "loggers": ["wandb"]}, "run_dir": "r"})
    {'train.steps': 2, 'train.loggers': ['wandb'], 'run_dir': 'r'}
    """
    out: dict[str, Any] = {}
    for k, v in config.items():
        if isinstance(v, dict) and v:
            out |= flatten(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def markdown_table(rows: list[list[Any]], columns: list[str] = SAMPLE_COLUMNS) -> str:
    """Rows as a Markdown table (TensorBoard's text plugin renders it).

    >>> print(markdown_table([[1, "a|b\\nc"]], ["step", "text"]))
    | step | text |
    | --- | --- |
    | 1 | a\\|b<br>c |
    """
    cell = lambda v: str(v).replace("|", "\\|").replace("\n", "<br>")  # noqa: E731
    lines = ["| " + " | ".join(columns) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- trackers


class TensorBoardTracker:
    """TensorBoard event files in ``<run_dir>/tensorboard``."""

    def __init__(self, run_dir: Path, **_: Any) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(str(run_dir / "tensorboard"))
        self.layout_written = False
        self.last_step = 0

    def log_config(self, config: dict[str, Any]) -> None:
        self.tb.add_text("config", "```yaml\n" + yaml.safe_dump(config, sort_keys=False) + "```", 0)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        layout = agent_layout(metrics)
        if not self.layout_written and layout["per agent"]:  # from the first row with per-agent metrics
            self.tb.add_custom_scalars(layout)
            self.layout_written = True
        for k, v in metrics.items():
            self.tb.add_scalar(k, v, step)
        self.last_step = step
        self.tb.flush()

    def log_samples(self, step: int, rows: list[list[Any]]) -> None:
        self.tb.add_text("episodes", markdown_table(rows), step)

    def close(self, scores: dict[str, float]) -> None:
        for k, v in scores.items():
            self.tb.add_scalar(k, v, self.last_step)
        self.tb.close()


def agent_layout(metrics: dict[str, float]) -> dict[str, dict[str, list]]:
    """TensorBoard custom-scalar layout: one chart per per-agent metric with every agent's curve.

    >>> agent_layout({"agent/a/reward_mean": 1.0, "agent/b/reward_mean": 0.0, "loss/main/loss": 0.1})
    {'per agent': {'reward_mean': ['Multiline', ['agent/[^/]+/reward_mean$']]}}
    """
    names = sorted({m.group(1) for k in metrics if (m := re.fullmatch(r"agent/[^/]+/(.+)", k))})
    return {"per agent": {n: ["Multiline", [f"agent/[^/]+/{re.escape(n)}$"]] for n in names}}


class WandbTracker:
    """A Weights & Biases run whose files live in ``<run_dir>/wandb`` (``WANDB_MODE`` picks online/offline)."""

    def __init__(self, run_dir: Path, *, project: str, config: dict[str, Any]) -> None:
        import wandb

        self.wandb = wandb
        self.run = wandb.init(project=project, name=run_dir.name, dir=str(run_dir), config=config,
                              reinit="create_new")

    def log_config(self, config: dict[str, Any]) -> None:
        pass  # given to wandb.init, where W&B expects it

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_samples(self, step: int, rows: list[list[Any]]) -> None:
        self.run.log({"episodes": self.wandb.Table(columns=list[Any](SAMPLE_COLUMNS), data=rows)}, step=step)

    def close(self, scores: dict[str, float]) -> None:
        self.run.summary.update(scores)
        self.run.finish()


_MLFLOW_KEY = re.compile(r"[^\w\-. :/]")


class MLflowTracker:
    """An MLflow run in experiment ``project``: metrics, config params and artifacts, episode tables as JSON."""

    def __init__(self, run_dir: Path, *, project: str, config: dict[str, Any]) -> None:
        import mlflow

        uri = os.environ.get("MLFLOW_TRACKING_URI") or (run_dir.resolve() / "mlruns").as_uri()
        if uri.startswith("file:"):  # MLflow 3 asks for this opt-in before it writes a local file store
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(project)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(project)
        self.run_id = self.client.create_run(exp_id, run_name=run_dir.name).info.run_id
        self.uri = uri
        self.last_step = 0

    def log_config(self, config: dict[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(k, json.dumps(v) if not isinstance(v, str) else v)
                  for k, v in flatten(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=[Param(p.key, p.value[:500]) for p in params[i:i + 100]])
        self.client.log_dict(self.run_id, config, "config.yaml")

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(_MLFLOW_KEY.sub("_", k), v, now, step) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):  # MLflow takes at most 1000 metrics per batch
            self.client.log_batch(self.run_id, metrics=batch[i:i + 1000])
        self.last_step = step

    def log_samples(self, step: int, rows: list[list[Any]]) -> None:
        table = {"columns": SAMPLE_COLUMNS, "data": rows}
        self.client.log_dict(self.run_id, table, f"episodes/step_{step:06d}.json")

    def close(self, scores: dict[str, float]) -> None:
        self.log_metrics(self.last_step, scores)
        self.client.set_terminated(self.run_id)


def append_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """Append rows to a JSON-lines file in one ``write``; a write that fails part-way (a full disk) is cut back
    to the file's previous end, so no torn line stays behind (a kill mid-write can still tear the last line,
    which a resume drops: :func:`teamrl.train.rundir.drop_rows_from`).

    Raises:
        OSError: the write failed (the file is as it was).
    """
    data = memoryview("".join(json.dumps(row, default=str) + "\n" for row in rows).encode())
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        start = os.fstat(fd).st_size
        try:
            while data:
                data = data[os.write(fd, data):]
        except OSError:
            os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)
