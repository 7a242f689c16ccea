"""A failed evaluation never costs the training: the weights are on disk before the final evaluation (also with
``train.save_every=0``), an evaluation whose episodes all fail is one line in the summary, the console and
summary.json, and the run ends normally; an evaluation before training that fails refuses the run in one line."""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from teamrl.cli import main
from teamrl.learner import checkpoint
from teamrl.team.registry import WORKFLOWS, register_workflow
from teamrl.train.trainer import Trainer
from tests.train.test_trainer import _register_reply_length_task, tiny_config


@dataclass(kw_only=True)
class BrokenEvalConfig:
    """No options."""


async def broken_eval(team, problem, task, cfg) -> str | None:
    """An evaluation that fails every episode, as one whose opponent finds no move does (the first line is what
    the summary must show; the second must not reach it)."""
    await team.ask("solver", [{"role": "user", "content": problem.question}])
    raise ValueError(f"the opponent has no move on {problem.id}\nsecond line of the error")


if "broken_eval_test" not in WORKFLOWS:
    register_workflow("broken_eval_test", config=BrokenEvalConfig, agents=("solver",), calls=lambda wf, task: 1)(broken_eval)

_register_reply_length_task()  # mixed rewards: the weights move in training
FAILING_EVAL = ("task.name=reply_length", "algo.format_penalty=0", "workflow.name=single",
                "eval.workflow=broken_eval_test", "train.save_every=0")


def test_a_final_evaluation_that_fails_keeps_the_trained_weights_and_says_so_in_one_line(tmp_path, tiny_model_dir):
    from safetensors.torch import load_file

    cfg = tiny_config(tmp_path, tiny_model_dir, "run", *FAILING_EVAL, "eval.before=false")
    tr = Trainer(cfg, progress=False)
    untrained = {n: p.detach().clone() for n, p in tr.models["main"].named_parameters()}
    on_disk: list[str | None] = []  # the newest checkpoint when the final evaluation starts
    evaluate = tr.evaluate

    def spy(tag, task=None):
        found = checkpoint.latest(tmp_path / "run" / "checkpoints")
        on_disk.append(found.name if found is not None and checkpoint.is_checkpoint(found) else None)
        return evaluate(tag, task)

    tr.evaluate = spy  # type: ignore[method-assign]
    results = tr.train()  # no exception
    assert on_disk == ["step_2"]  # save_every=0: the last step's weights were written before the evaluation
    run = tmp_path / "run"
    failed = results["after"]["failed"]
    assert failed.startswith("the evaluation (after) failed: all 6 episodes failed; the first: workflow failed on")
    assert "ValueError: the opponent has no move on" in failed and "\n" not in failed and "second line" not in failed
    summary = json.loads((run / "summary.json").read_text())
    assert summary["after"]["failed"] == failed and summary["after"]["failed_episodes"] == 6
    assert json.loads((run / "eval_after.json").read_text())["failed"] == failed
    assert len((run / "eval_after_episodes.jsonl").read_text().splitlines()) == 6  # the failed episodes are kept
    saved = load_file(str(run / "checkpoints" / "step_2" / "model-main.safetensors"))  # the trained weights
    trained = dict(tr.models["main"].named_parameters())
    assert all(torch.equal(saved[n], p) for n, p in trained.items() if n in saved) and len(saved) > 0
    assert any(not torch.equal(p, untrained[n]) for n, p in trained.items())  # they moved: not the untrained ones


def test_the_command_line_ends_normally_and_prints_the_failure_in_one_line(tmp_path, tiny_model_dir, capsys):
    overrides = [f"run_dir={tmp_path / 'cli'}", f"models.main.path={tiny_model_dir}", *FAILING_EVAL, "eval.before=false",
                 "rollout.batch_size=2", "rollout.group_size=2", "train.steps=1", "eval.problems=2", "eval.samples=1",
                 "agents.solver.max_new_tokens=4"]
    assert main(["train", *overrides]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "the evaluation (after) failed" in line]
    assert len(lines) == 1 and "the weights are saved" in lines[0] and "Traceback" not in out


def test_the_command_line_refuses_a_failing_evaluation_before_training_with_exit_2(tmp_path, tiny_model_dir, capsys):
    overrides = [f"run_dir={tmp_path / 'cli_before'}", f"models.main.path={tiny_model_dir}", *FAILING_EVAL,
                 "rollout.batch_size=2", "train.steps=2", "eval.problems=2", "eval.samples=1",
                 "agents.solver.max_new_tokens=4"]
    assert main(["train", *overrides]) == 2  # nothing is trained yet, so nothing is lost
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert line.startswith("error: the evaluation (before) failed: all 2 episodes failed; the first: ")
    assert line.endswith("nothing was trained (the evaluation after training would fail the same way; fix it, or "
                         "set eval.before=false)") and "Traceback" not in err
    assert not (tmp_path / "cli_before").exists()  # a new run folder with nothing trained is removed
