"""``teamrl eval``: avg@n and pass@k of a checkpoint (or the untrained model) on held-out benchmarks.

A benchmark is ``name=PATH`` of a GSM8K/MATH-style file read by the ``math`` task; without
benchmarks the config's own task's test split is used, named after its test file
(``hotpotqa_distractor_rpt/test.jsonl``). Each benchmark's results go to
``<out>/eval_<name>.json`` (and its episodes to ``eval_<name>_episodes.jsonl``; characters other
than letters, digits and ``-`` in the name become ``_``); all of them to
``<out>/eval.json``.

pass@k counts a sample as solved when its reward is > 0, except where the task says what solved
means (:meth:`teamrl.domains.search.search.SearchTask.passed`: exact match, whatever metric the reward
uses); then every key and column carries the label, e.g. ``pass@4 (EM)``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any


def pass_key(result: dict[str, Any], k: int) -> str:
    """The key of pass@k in an evaluation result: ``pass@k``, or ``pass@k (EM)`` where the task labels it.

    >>> pass_key({"accuracy": 0.5, "pass@2 (EM)": 0.5}, 2), pass_key({"pass@2": 1.0}, 2)
    ('pass@2 (EM)', 'pass@2')
    """
    return next((key for key in result if key == f"pass@{k}" or key.startswith(f"pass@{k} (")), f"pass@{k}")


def task_benchmark_name(cfg) -> str:
    """The name of the config task's test data: ``<folder>/<file>`` of its test file, or the task's name.

    Several test files are joined with ``+``.
    """
    options = getattr(cfg.task, cfg.task.name, None)
    paths = getattr(options, "test_path", None)
    paths = [paths] if isinstance(paths, str) else list(paths or [])
    return "+".join("/".join(Path(p).parts[-2:]) for p in paths) or cfg.task.name


def parse_benchmarks(items: list[str]) -> dict[str, str]:
    """``["gsm8k=a.jsonl,math500=b.jsonl", "x=c.jsonl"]`` to a name → path mapping.

    >>> parse_benchmarks(["gsm8k=a.jsonl,math500=b.jsonl"])
    {'gsm8k': 'a.jsonl', 'math500': 'b.jsonl'}
    """
    out = {}
    for item in (x for arg in items for x in arg.split(",") if x.strip()):
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"--benchmarks item {item!r} is not NAME=PATH; write e.g. gsm8k=data/gsm8k/test.jsonl")
        out[name.strip()] = path.strip()
    return out


def run_eval(cfg, *, checkpoint: str | None, benchmarks: dict[str, str], k: int, progress: bool = True) -> dict[str, Any]:
    """Evaluate ``cfg``'s team (weights from ``checkpoint`` when given) on each benchmark.

    ``eval.samples`` is the n of avg@n and pass@k; it must be >= ``k``.
    """
    from teamrl.tasks.base import benchmark_task
    from teamrl.train.trainer import Trainer

    if k < 1 or k > cfg.eval.samples:
        raise ValueError(f"--k {k} must be between 1 and the samples per problem (eval.samples={cfg.eval.samples}); "
                         f"raise eval.samples or lower --k")
    if checkpoint is not None:  # before any model loads, and before the output folder is made
        Trainer.find_checkpoint(Path(checkpoint))
    trainer = Trainer(cfg, progress=progress)
    if checkpoint is not None:
        trainer.load_weights(Path(checkpoint))
    tasks = {name: benchmark_task(path) for name, path in benchmarks.items()}
    tasks = tasks or {task_benchmark_name(cfg): trainer.task}
    scores: dict[str, dict[str, Any]] = {}
    for name, task in tasks.items():
        r = trainer.evaluate(re.sub(r"[^\w-]+", "_", name), task)  # the file tag: hotpotqa_distractor_rpt_test_jsonl
        pk = pass_key(r, k)
        scores[name] = {"avg@n": r["accuracy"], pk: r[pk], "n": r["samples"],
                         "problems": r["problems"], **{key: v for key, v in r.items() if key.startswith("pass@")},
                         **{key: r[key] for key in ("success_rate", "avg_turns", "outcomes") if key in r}}
    results = {"checkpoint": checkpoint or "untrained", "k": k, "benchmarks": scores}
    (Path(cfg.run_dir) / "eval.json").write_text(json.dumps(results, indent=2))
    return results


EVAL_SETTINGS = ("temperature", "top_p", "top_k", "max_new_tokens")
"""The sampling keys of each agent that an evaluation's score depends on (beside ``eval.*`` and the task)."""


def run_config(checkpoint: str) -> Path | None:
    """The ``config.yaml`` of the run ``checkpoint`` belongs to (a run directory or its ``checkpoints/step_N``)."""
    path = Path(checkpoint)
    for folder in (path, path.parent.parent):
        if (folder / "config.yaml").is_file():
            return folder / "config.yaml"
    return None


def _settings(data: dict[str, Any]) -> dict[str, Any]:
    out = {f"eval.{k}": v for k, v in (data.get("eval") or {}).items() if k in ("problems", "samples", "temperature",
                                                                               "workflow")}
    out |= {"task.name": (data.get("task") or {}).get("name"), "workflow.name": (data.get("workflow") or {}).get("name")}
    for name, agent in (data.get("agents") or {}).items():
        out |= {f"agents.{name}.{k}": v for k, v in agent.items() if k in EVAL_SETTINGS}
    return out


def beside_run(cfg, run_config_path: Path) -> str:
    """One line setting this evaluation beside the run's own last one (``eval_after.json``, else the newest
    ``eval_*.json``): its score, and the settings that differ between them (then the scores do not compare)."""
    import yaml

    from teamrl.config import tools as configtools

    run_dir = run_config_path.parent
    found = [run_dir / "eval_after.json"] if (run_dir / "eval_after.json").is_file() else \
        sorted(run_dir.glob("eval_*.json"), key=lambda p: p.stat().st_mtime)[-1:]
    own = json.loads(found[0].read_text()) if found else None
    score = (f"{found[0].name}: accuracy {own['accuracy']:.3f} on {own['problems']} problems x {own['samples']} "
             f"samples") if own and "failed" not in own else f"{found[0].name}: {own['failed']}" if own else "none written"
    saved = _settings(yaml.safe_load(run_config_path.read_text()) or {})
    now = _settings(configtools.to_dict(cfg))
    differ = {k: (saved.get(k), now.get(k)) for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)}
    if not differ:
        return f"the run's own evaluation ({score}) used the same settings"
    shown = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in differ.items())
    return f"the run's own evaluation ({score}) used other settings, so the scores do not compare: {shown}"


def format_eval(results: dict[str, Any]) -> str:
    """A markdown table of :func:`run_eval`'s results."""
    k = results["k"]
    keys = {name: pass_key(r, k) for name, r in results["benchmarks"].items()}
    header = next(iter(set(keys.values()))) if len(set(keys.values())) == 1 else f"pass@{k}"
    lines = [f"weights: {results['checkpoint']}", "", f"| benchmark | problems | n | avg@n | {header} |",
             "| --- | --- | --- | --- | --- |"]
    for name, r in results["benchmarks"].items():
        label = "" if keys[name] == header else keys[name].removeprefix(f"pass@{k}")
        lines.append(f"| {name} | {r['problems']} | {r['n']} | {r['avg@n']:.3f} | {r[keys[name]]:.3f}{label} |")
    envs = {name: r for name, r in results["benchmarks"].items() if "avg_turns" in r}
    if envs:  # environment tasks: the share of solved episodes and the turns they took
        lines += ["", "| environment | success rate | average turns |", "| --- | --- | --- |"]
        lines += [f"| {name} | {r['success_rate']:.3f} | {r['avg_turns']:.2f} |" for name, r in envs.items()]
    games = {name: r["outcomes"] for name, r in results["benchmarks"].items() if "outcomes" in r}
    if games:  # two-player games against the random player: rates with Wilson 95% intervals
        lines += ["", "| game | games | win | draw | loss |", "| --- | --- | --- | --- | --- |"]
        cell = lambda o: f"{o['rate']:.3f} [{o['low']:.3f}, {o['high']:.3f}]"  # noqa: E731
        lines += [f"| {name} | {o['games']} | {cell(o['win'])} | {cell(o['draw'])} | {cell(o['loss'])} |"
                  for name, o in games.items()]
    return "\n".join(lines)
