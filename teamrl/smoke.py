"""The ``--smoke`` override set: any config, recipes included, runs one real training step on a CPU.

``teamrl train CONFIG --smoke`` loads the config, then applies (before the user's own overrides, so
those still win):

* every model: ``path: default`` (the embedded SmolLM2-135M-Instruct), ``device: cpu``, float32, no
  bf16 copies, no LoRA adapter rank change, ``max_batch_size: 8``, ``max_context: null``, Ray placement off
  (``backend: local``);
* every agent: ``max_new_tokens: 8``;
* sizes: 2 prompts, groups of 2 (1 under tree sampling, whose groups are its branches, cut to 2), one step,
  no evaluation, no checkpoint, micro-batches of 1024 tokens;
* data the package makes itself (:mod:`teamrl.smoke_data`, written once under ``$TEAMRL_CACHE/smoke``): a math task
  reads generated arithmetic problems in MATH's layout, a search task generated questions in HotpotQA's distractor
  layout (BM25 in-process); a dataset id or a file the recipe names is never needed; a code-files or HumanEval task becomes the
  procedural ``pyfunc`` task (with ``code_team``'s tester scored on the coder's program, since pyfunc has no
  reference solutions); environments (Sokoban, Plan-Path, Sudoku) run one or two turns.

Left out: checking that a smoke run learns anything (one step on a 135M model), GPU placement.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from teamrl import smoke_data

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
    task = cfg.task.name
    if task == "math":
        train, test = smoke_data.math_files()
        return [f"task.math.train_path={train}", f"task.math.test_path={test}", "task.math.train_split=train",
                "task.math.test_split=test", "task.math.limit_train=8", "task.math.limit_test=2",
                "task.math.answer_key=null", "task.math.test_answer_key=null", "task.math.question_key=null"]
    if task == "search":
        train, test = smoke_data.search_files()
        return [f"task.search.train_path={train}", f"task.search.test_path={test}",
                "task.search.retriever_url=null", "task.search.corpus_path=null", "task.search.limit_train=8",
                "task.search.limit_test=2", "task.search.test_per_source=0", "task.search.topk=1"]
    if task in ("code_files", "humaneval"):
        # pyfunc's answers are signatures, not reference programs: a tester scored against the reference
        # (code_team's default) is scored on the coder's program instead
        fix = ["workflow.code_team.tester_reward=generated"] if cfg.workflow.name == "code_team" else []
        return ["task.name=pyfunc", "task.pyfunc.n_test=2", "task.pyfunc.n_tests=2", *fix]
    if task in ("sokoban", "plan_path", "sudoku"):
        return [f"task.{task}.max_turns=1", f"task.{task}.n_train=4", f"task.{task}.n_test=2"]
    return []
