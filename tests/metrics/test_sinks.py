"""The trackers of train.loggers, read back with each tracker's own reader: same metric names,
the resolved config, per-agent curves, episode tables and held-out scores."""

from __future__ import annotations

import importlib.util
import json
import struct
import time

import pytest

from teamrl.config.schema import load_config
from teamrl.metrics import sinks
from teamrl.metrics.sinks import MetricsSink

CONFIG = {"run_dir": "r", "train": {"steps": 2, "loggers": ["tensorboard"]}}
METRICS = {"rollout/reward_mean": 0.25, "agent/solver/reward_mean": 0.5, "agent/verifier/reward_mean": 0.0,
           "loss/main/loss": float("nan")}
EPISODE = {"step": 0, "problem_id": "p7", "final": "4", "gold": "4", "reward": 1.0,
           "turns": [{"agent": "solver", "agent_call": 0, "text": "2+2 = 4", "reward": 1.0, "advantage": 0.5},
                     {"agent": "verifier", "agent_call": 1, "text": "ok", "reward": 1.0, "advantage": -0.25}]}
SUMMARY = {"after": {"accuracy": 0.5, "pass@2": 0.75, "problems": 8}}


def _needs(module: str):
    return pytest.mark.skipif(importlib.util.find_spec(module) is None,
                              reason=f"{module} is not installed (pip install 'teamrl[{module}]')")


def _log_two_steps(run_dir, loggers):
    sink = MetricsSink(run_dir, loggers, config=CONFIG, samples_every=1, project="teamrl-test")
    for step in (0, 1):
        sink.write(step, {k: v + step for k, v in METRICS.items()})
        sink.samples(step, [{**EPISODE, "step": step}])
    sink.close(SUMMARY)


def test_jsonl_is_written_without_any_tracker(tmp_path):
    _log_two_steps(tmp_path, [])
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and rows[1]["agent/solver/reward_mean"] == 1.5
    assert rows[0]["loss/main/loss"] is None and not (tmp_path / "tensorboard").exists()


def test_tensorboard_holds_metrics_config_table_scores_and_agent_layout(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _log_two_steps(tmp_path, ["tensorboard"])
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    assert {"rollout/reward_mean", "agent/solver/reward_mean", "eval/after/accuracy"} <= set(scalars)
    assert "loss/main/loss" not in scalars  # non-finite values stay out of the trackers
    assert [e.value for e in acc.Scalars("agent/verifier/reward_mean")] == [0.0, 1.0]
    texts = {t: acc.Tensors(t) for t in acc.Tags()["tensors"]}
    table = texts["episodes/text_summary"][0].tensor_proto.string_val[0].decode()
    assert "| solver | 0 | 2+2 = 4 | 1.0 | 0.5 |" in table and "| verifier |" in table
    assert "steps: 2" in texts["config/text_summary"][0].tensor_proto.string_val[0].decode()
    layout = acc.Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0]
    assert b"agent/[^/]+/reward_mean$" in layout


def test_tensorboard_agent_layout_waits_for_a_row_with_agents(tmp_path):
    """A held-out row (eval.every with eval.before) comes before the first training row: the per-agent layout is
    built from the first row that has per-agent metrics."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = MetricsSink(tmp_path, ["tensorboard"])
    sink.write(0, {"eval/accuracy": 0.5})
    sink.write(0, {"agent/solver/reward_mean": 1.0})
    sink.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    assert b"agent/[^/]+/reward_mean$" in acc.Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0]
    assert [e.value for e in acc.Scalars("eval/accuracy")] == [0.5]


def wandb_records(path):
    """The records of a ``run-*.wandb`` file: LevelDB-log framed protobuf ``Record``s (W&B's own format)."""
    from wandb.proto import wandb_internal_pb2

    data, pos, parts = path.read_bytes(), 7, b""  # 7: the ':W&B' file header
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a record header is padding
            pos += 32768 - pos % 32768
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        parts, pos = parts + data[pos + 7:pos + 7 + n], pos + 7 + n
        if kind in (1, 4):  # FULL or LAST fragment
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            yield record
            parts = b""


def wandb_run_log(path, timeout_s: float = 60.0) -> list:
    """The records of a finished run, once W&B's service has written them all (it does so after ``finish()``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = list(wandb_records(path))
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


@pytest.mark.slow  # wandb's own offline service process (about 5 s)
@_needs("wandb")
def test_wandb_offline_run_holds_metrics_config_table_and_scores(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    _log_two_steps(tmp_path, ["wandb"])
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    records = wandb_run_log(next(run.glob("run-*.wandb")))
    (start,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert start.project == "teamrl-test" and start.display_name == tmp_path.name
    config = {u.key: json.loads(u.value_json) for u in start.config.update}
    assert config["train"] == {"steps": 2, "loggers": ["tensorboard"]}
    history = [{"/".join(i.nested_key) or i.key: i.value_json for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    curve = [(json.loads(h["_step"]), json.loads(h["agent/verifier/reward_mean"]))
             for h in history if "agent/verifier/reward_mean" in h]
    assert curve == [(0, 0.0), (1, 1.0)] and not any("loss/main/loss" in h for h in history)
    assert sum("episodes/_type" in h for h in history) == 2
    summary = {"/".join(u.nested_key) or u.key: u.value_json for r in records
               if r.WhichOneof("record_type") == "summary" for u in r.summary.update}
    assert json.loads(summary["eval/after/accuracy"]) == 0.5
    tables = sorted((run / "files" / "media" / "table").glob("episodes_*.table.json"))
    assert len(tables) == 2
    table = json.loads(tables[0].read_text())
    assert table["columns"] == sinks.SAMPLE_COLUMNS
    assert [r[3] for r in table["data"]] == ["solver", "verifier"] and table["data"][1][7] == -0.25


@_needs("mlflow")
def test_mlflow_file_store_holds_metrics_params_table_and_scores(tmp_path, monkeypatch):
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    _log_two_steps(tmp_path, ["mlflow"])
    client = mlflow.MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("teamrl-test").experiment_id])
    assert run.info.run_name == tmp_path.name and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "agent/verifier/reward_mean")
    assert [(m.step, m.value) for m in history] == [(0, 0.0), (1, 1.0)]
    assert run.data.metrics["eval/after/pass_2"] == 0.75  # '@' is not allowed in MLflow names
    assert run.data.params["train.steps"] == "2" and run.data.params["train.loggers"] == '["tensorboard"]'
    table = json.loads((tmp_path / "mlruns" / run.info.experiment_id / run.info.run_id / "artifacts" / "episodes"
                        / "step_000001.json").read_text())
    assert table["columns"] == sinks.SAMPLE_COLUMNS and table["data"][0][5] == "2+2 = 4"


def test_a_missing_tracker_package_names_its_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(sinks.importlib.util, "find_spec", lambda m: None if m == "wandb" else real(m))
    with pytest.raises(ImportError, match=r"pip install 'teamrl\[wandb\]'"):
        sinks.require(["tensorboard", "wandb"])


def test_loggers_are_validated_by_the_config():
    assert load_config(None, ["train.loggers=[wandb, mlflow]"]).train.loggers == ["wandb", "mlflow"]
    with pytest.raises(Exception, match="train.loggers"):
        load_config(None, ["train.loggers=[wandbb]"])
    with pytest.raises(Exception, match="each tracker once"):
        load_config(None, ["train.loggers=[wandb, wandb]"])


@_needs("wandb")
@_needs("mlflow")
def test_a_training_run_reaches_every_tracker(tmp_path, tiny_model_dir, monkeypatch):
    import mlflow

    from teamrl.train.trainer import Trainer
    from tests.train.test_trainer import tiny_config

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = tiny_config(tmp_path, tiny_model_dir, "run", "train.loggers=[tensorboard, wandb, mlflow]",
                      "train.log_samples_every=1", "eval.before=false")
    Trainer(cfg, progress=False).train()
    run_dir = tmp_path / "run"
    jsonl = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (wb,) = (run_dir / "wandb").glob("offline-run-*")
    history = [{"/".join(i.nested_key) or i.key for i in r.history.item}
               for r in wandb_run_log(next(wb.glob("run-*.wandb"))) if r.WhichOneof("record_type") == "history"]
    finite = {k for k, v in jsonl[0].items() if v is not None and k != "step"}
    assert finite <= history[0] and "agent/solver/reward_mean" in finite  # the same names as metrics.jsonl
    client = mlflow.MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("teamrl").experiment_id])
    assert [m.value for m in client.get_metric_history(run.info.run_id, "rollout/reward_mean")] == \
        [r["rollout/reward_mean"] for r in jsonl]
    assert "eval/after/accuracy" in run.data.metrics and run.data.params["train.log_samples_every"] == "1"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "episodes")}
    assert artifacts == {"episodes/step_000000.json", "episodes/step_000001.json"}
