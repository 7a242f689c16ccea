"""The command line a newcomer can trust (issue 66): `--dry-run` makes every check the run makes before it loads
weights, a resume refuses a changed config in one line, `eval` on a run uses the run's own settings, a failed
command leaves no run folder, and the small things (`--version`, bare `teamrl`, other trainers' flags)."""

from __future__ import annotations

import pytest

from teamrl.cli import main

TINY = ["rollout.batch_size=2", "rollout.group_size=2", "train.steps=1", "eval.samples=1", "eval.problems=2",
        "agents.solver.max_new_tokens=4", "agents.verifier.max_new_tokens=3", "agents.solver.temperature=0.7",
        "task.arith.n_test=4"]


def _err(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


def test_version_and_bare_teamrl(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("teamrl ")
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: teamrl") and "train" in out and "eval" in out


@pytest.mark.parametrize(("flags", "hint"), [
    (["--learning_rate", "1e-5"], "settings are key=value, e.g. models.<m>.optim.lr=1e-5"),
    (["--train.steps=1"], "settings are key=value: write train.steps=1"),
])
def test_other_trainers_flags_get_a_key_value_hint(flags, hint, capsys):
    with pytest.raises(SystemExit) as done:
        main(["train", "quickstart", *flags])
    assert done.value.code == 2
    assert hint in _err(capsys)[-1]


def test_a_dry_run_fails_on_what_the_run_refuses_all_in_one_report(tmp_path, capsys):
    used = tmp_path / "used"
    used.mkdir()
    (used / "metrics.jsonl").write_text('{"step": 0}\n')
    rc = main(["train", "quickstart", "models.main.path=/no/such/model", f"run_dir={used}", "task.name=math",
               f"task.math.train_path={tmp_path / 'missing.jsonl'}", "--dry-run"])
    assert rc == 2
    err = _err(capsys)
    assert err[0] == "error: 3 problems found before loading weights:"
    assert err[1].startswith("  model path /no/such/model does not exist") and "models.main.path" in err[1]
    assert err[2].startswith(f"  run_dir {used} holds an earlier run's records (metrics.jsonl)")
    assert err[3].startswith(f"  data file not found: {tmp_path / 'missing.jsonl'}")
    assert main(["train", "quickstart", f"run_dir={tmp_path / 'none'}", "--resume", "--dry-run"]) == 2
    assert _err(capsys) == [f"error: --resume: no checkpoint under {tmp_path / 'none' / 'checkpoints'}; train "
                            f"without --resume first"]
    assert not (tmp_path / "none").exists()


def test_steps_0_is_refused_without_an_evaluation_and_explained_with_one(tmp_path, capsys):
    assert main(["train", "quickstart", "train.steps=0", "eval.before=false", "eval.after=false", "--dry-run"]) == 2
    assert "train.steps 0 trains nothing" in _err(capsys)[-1]
    assert main(["train", "quickstart", "train.steps=0", f"run_dir={tmp_path / 'r'}", "--dry-run"]) == 0
    assert "nothing is trained" in capsys.readouterr().out


def test_resume_eval_and_cleanup_on_a_tiny_run(tmp_path, tiny_model_dir, capsys):
    run = tmp_path / "run"
    common = [f"models.main.path={tiny_model_dir}", *TINY, f"run_dir={run}"]
    assert main(["train", "quickstart", *common]) == 0
    out = capsys.readouterr().out
    assert f"tensorboard --logdir {run}/tensorboard" in out and f"teamrl eval --checkpoint {run}" in out
    # a changed learning rate is refused in one line; a named change is allowed
    assert main(["train", "quickstart", *common, "models.main.optim.lr=1e-3", "--resume"]) == 2
    assert _err(capsys) == [f"error: --resume: the config differs from {run / 'config.yaml'} in models.main.optim.lr "
                            f"(2e-05 -> 0.001); resume with the run's settings, or allow each change: "
                            f"--allow-change models.main.optim.lr"]
    assert main(["train", "quickstart", *common, "train.steps=2", "--resume", "--allow-change", "train.steps"]) == 0
    assert "train:\n  steps: 2" in (run / "config.yaml").read_text().replace("  seed", "\n  seed")
    capsys.readouterr()
    # eval on the run: its own sampling settings (not the defaults), said in one line, and beside its own score
    out_dir = tmp_path / "ev"
    assert main(["eval", "--checkpoint", str(run), "--k", "1", "--out", str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"config: {run / 'config.yaml'} (the run's own)"
    assert "the run's own evaluation (eval_after.json: accuracy" in out and "used the same settings" in out
    import yaml

    agents = yaml.safe_load((out_dir / "config.yaml").read_text())["agents"]
    assert (agents["solver"]["temperature"], agents["solver"]["max_new_tokens"]) == (0.7, 4)
    assert main(["eval", "--checkpoint", str(run), "--k", "1", "--out", str(tmp_path / "ev2"),
                 "agents.solver.temperature=1.0"]) == 0
    assert "scores do not compare: agents.solver.temperature 0.7 -> 1.0" in capsys.readouterr().out
    # a failed eval and a failed train leave no run folder
    assert main(["eval", "--checkpoint", str(tmp_path / "nothing"), f"models.main.path={tiny_model_dir}",
                 "--out", str(tmp_path / "ev3")]) == 2
    assert "no checkpoint there" in _err(capsys)[-1] and not (tmp_path / "ev3").exists()
    empty = tmp_path / "no-weights"
    empty.mkdir()
    assert main(["train", "quickstart", f"models.main.path={empty}", *TINY, f"run_dir={tmp_path / 'r2'}"]) == 2
    assert _err(capsys) == [f"error: model folder {empty} has no config.json; point models.main.path at a model "
                            f"folder (with config.json and the weights), a hub id or 'default'"]
    (empty / "config.json").write_text('{"model_type": "llama"}')  # passes the checks, fails as the model loads
    assert main(["train", "quickstart", f"models.main.path={empty}", *TINY, f"run_dir={tmp_path / 'r2'}"]) == 2
    assert "error: " in capsys.readouterr().err and not (tmp_path / "r2").exists()  # made, then removed
