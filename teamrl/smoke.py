"""The ``--smoke`` override set: any config, recipes included, runs one real training step on a CPU.

``teamrl train CONFIG --smoke`` loads the config, then applies (before the user's own overrides, so
those still win):

* every model: ``path: default`` (the embedded SmolLM2-135M-Instruct), ``device: cpu``, float32, no
  bf16 copies, no LoRA adapter rank change, ``max_batch_size: 8``, ``max_context: null``, Ray placement off
  (``backend: local``);
* every agent: ``max_new_tokens: 8``;
* sizes: 2 prompts, groups of 2 (1 under tree sampling, whose groups are its branches, cut to 2), one step,
  no evaluation, no checkpoint, micro-batches of 1024 tokens;
* each task's own overrides (``register_task(..., smoke=)``), with data the package makes itself
  (:mod:`teamrl.smoke_data`, written once under ``$TEAMRL_CACHE/smoke``): a math task
  reads generated arithmetic problems in MATH's layout, a search task generated questions in HotpotQA's distractor
  layout (BM25 in-process); a dataset id or a file the recipe names is never needed; a code-files or HumanEval task becomes the
  procedural ``pyfunc`` task (with ``code_team``'s tester scored on the coder's program, since pyfunc has no
  reference solutions); environments (Sokoban, Plan-Path, Sudoku) run one or two turns.

Left out: checking that a smoke run learns anything (one step on a 135M model), GPU placement.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from teamrl.config.schema import Config



def smoke_overrides(cfg: Config) -> list[str]:
    """The dotted ``key=value`` overrides that turn ``cfg`` into its one-step CPU variant (module docstring).

    >>> from teamrl.config.schema import load_config
    >>> o = smoke_overrides(load_config(None, []))
    >>> "models.main.path=default" in o and "train.steps=1" in o
    True
    """
    out = ["backend=local", "train.steps=1", "train.save_every=0", "eval.before=false", "eval.after=false",
           "eval.every=0", "rollout.batch_size=2", "loss.micro_batch_tokens=1024", "train.loggers=[]"]
    tree = "tree" in cfg.workflow.name
    out.append(f"rollout.group_size={1 if tree else min(2, max(cfg.rollout.group_size, 2))}")
    if tree and hasattr(getattr(cfg.workflow, cfg.workflow.name, None), "branch"):
        out.append(f"workflow.{cfg.workflow.name}.branch=2")
    if cfg.algo.overlong_buffer:
        out.append("algo.overlong_buffer=2")  # shorter than the 8 new tokens
    if cfg.train.update_mode == "async":
        out.append("train.min_buffer_steps=1")
    for name in cfg.models:
        out += [f"models.{name}.path=default", f"models.{name}.device=cpu", f"models.{name}.dtype=float32",
                f"models.{name}.train_autocast=none", f"models.{name}.rollout_dtype=same",
                f"models.{name}.max_batch_size=8", f"models.{name}.max_context=null",
                f"models.{name}.gradient_checkpointing=false"]
    out += [f"agents.{a}.max_new_tokens=8" for a in cfg.agents]
    out += _task(cfg)
    return out


def _task(cfg: Config) -> list[str]:
    """The task's own ``--smoke`` overrides (:attr:`teamrl.tasks.base.TaskSpec.smoke`), none when it names none."""
    from teamrl.tasks.base import TASKS, load_builtin_tasks

    load_builtin_tasks()
    spec = TASKS.get(cfg.task.name)
    return spec.smoke(cfg) if spec is not None and spec.smoke is not None else []
