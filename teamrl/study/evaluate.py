"""``teamrl eval``: avg@n and pass@k of a checkpoint (or the untrained model) on held-out benchmarks.

A benchmark is ``name=PATH`` of a GSM8K/MATH-style file read by the ``math`` task; without
benchmarks the config's own task's test split is used. Each benchmark's results go to
``<out>/eval_<name>.json`` (and its episodes to ``eval_<name>_episodes.jsonl``); all of them to
``<out>/eval.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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
    from teamrl.tasks.base import build_task
    from teamrl.tasks.math import MathConfig
    from teamrl.train.trainer import Trainer

    if k < 1 or k > cfg.eval.samples:
        raise ValueError(f"--k {k} must be between 1 and the samples per problem (eval.samples={cfg.eval.samples}); "
                         f"raise eval.samples or lower --k")
    trainer = Trainer(cfg, progress=progress)
    if checkpoint is not None:
        trainer.load_weights(Path(checkpoint))
    tasks = {name: build_task("math", MathConfig(test_path=path)) for name, path in benchmarks.items()}
    tasks = tasks or {cfg.task.name: trainer.task}
    results = {}
    for name, task in tasks.items():
        r = trainer.evaluate(name, task)
        results[name] = {"avg@n": r["accuracy"], f"pass@{k}": r[f"pass@{k}"], "n": r["samples"],
                         "problems": r["problems"], **{key: v for key, v in r.items() if key.startswith("pass@")}}
    results = {"checkpoint": checkpoint or "untrained", "k": k, "benchmarks": results}
    (Path(cfg.run_dir) / "eval.json").write_text(json.dumps(results, indent=2))
    return results


def format_eval(results: dict[str, Any]) -> str:
    """A markdown table of :func:`run_eval`'s results."""
    k = results["k"]
    lines = [f"weights: {results['checkpoint']}", "", f"| benchmark | problems | n | avg@n | pass@{k} |",
             "| --- | --- | --- | --- | --- |"]
    for name, r in results["benchmarks"].items():
        lines.append(f"| {name} | {r['problems']} | {r['n']} | {r['avg@n']:.3f} | {r[f'pass@{k}']:.3f} |")
    return "\n".join(lines)
