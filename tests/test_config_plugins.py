"""Plug-in options: ``task.<name>`` and ``workflow.<name>`` are checked against the class each task and
workflow registered, wherever it was registered; the registries make no import cycle."""

from __future__ import annotations

import pickle
import subprocess
import sys
from dataclasses import dataclass

import pytest

from teamrl.config import tools as configtools
from teamrl.config.schema import Config, load_config, task_options, workflow_options
from teamrl.tasks.base import TASKS, register_task
from teamrl.team.registry import WORKFLOWS, register_workflow


@dataclass(kw_only=True)
class RoundsConfig:
    rounds: int = 1
    """Rounds."""

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"rounds {self.rounds} must be >= 1")


@dataclass(kw_only=True)
class WordConfig:
    word: str = "hi"
    """The word."""


@pytest.fixture
def plugins():
    """A workflow and two tasks registered as an --import file registers them."""

    async def rounds(team, problem, task, cfg):
        return ""

    register_workflow("rounds_test", config=RoundsConfig, agents=("solver",))(rounds)
    register_task("word_test", config=WordConfig)(lambda cfg: cfg)
    register_task("free_test")(lambda cfg: cfg)
    yield
    del WORKFLOWS["rounds_test"], TASKS["word_test"], TASKS["free_test"]


def errors(*overrides: str) -> list[str]:
    with pytest.raises(configtools.ConfigError) as e:
        load_config(None, list(overrides))
    return e.value.errors


def test_sections_of_registered_plugins_are_validated_and_become_their_objects(plugins):
    cfg = load_config(None, ["workflow.name=rounds_test", "workflow.rounds_test.rounds=3", "task.name=word_test",
                             "task.word_test.word=yo"])
    assert workflow_options(cfg.workflow) == RoundsConfig(rounds=3) and cfg.workflow.rounds_test is cfg.workflow.selected
    assert task_options(cfg.task) == WordConfig(word="yo")
    assert load_config(None, ["task.name=free_test", "task.free_test={a: [1, 2]}"]).task.free_test == {"a": [1, 2]}
    assert errors("task.name=word_test", "task.free_test={a: [1, 2]}") == [  # options nothing reads: a typo's sign
        "task.free_test: options of task 'free_test', which is not selected (task.name is 'word_test'); "
        "set task.name=free_test, or remove them"]
    assert cfg.workflow.math_team.max_loops == 2  # every registered section is there, with its defaults
    assert configtools.from_dict(Config, configtools.to_dict(cfg)) == cfg
    assert errors("workflow.rounds_test.rounds=0") == ["workflow.rounds_test: rounds 0 must be >= 1"]
    assert errors("workflow.rounds_test.roundz=2") == [
        "unknown key 'workflow.rounds_test.roundz'; did you mean 'workflow.rounds_test.rounds'?"]
    assert errors("task.word_tst.word=x") == ["unknown key 'task.word_tst'; did you mean 'task.word_test'?"]
    assert errors("task.name=word_tst")[0].startswith("task.name: unknown task 'word_tst'; did you mean 'word_test'?")


def test_options_is_another_spelling_of_the_selected_section(plugins):
    cfg = load_config(None, ["workflow.name=rounds_test", "workflow.options.rounds=2", "task.name=free_test",
                             "task.options={a: 1}", "task.free_test={}"])
    assert workflow_options(cfg.workflow) == RoundsConfig(rounds=2) and task_options(cfg.task) == {"a": 1}
    assert load_config(None, ["workflow.options={}"]) == load_config(None)  # as an older run's config.yaml has it
    assert errors("workflow.name=rounds_test", "workflow.options.roundz=2") == [
        "unknown key 'workflow.options.roundz'; did you mean 'workflow.options.rounds'?"]
    assert errors("workflow.name=rounds_test", "workflow.options.rounds=2", "workflow.rounds_test.rounds=3") == [
        "workflow.options: sets the options of 'rounds_test' a second time; keep workflow.rounds_test and remove "
        "workflow.options"]


def test_a_selected_workflow_whose_options_need_settings_says_so():
    (message,) = errors("workflow.name=agent_program")
    assert message.startswith("workflow.agent_program: agent_program needs exactly one of program")
    assert load_config(None).workflow.agent_program is None  # not selected: no settings needed


def test_help_lists_every_registered_section(plugins):
    text = configtools.describe(Config)
    assert "workflow.rounds_test.rounds: int = 1" in text and "task.free_test: dict[str, Any] = {}" in text
    assert "task.math.train_path: str | None = null" in text


def test_help_config_lists_the_options_of_an_imported_workflow(tmp_path, capsys):
    from teamrl.cli import main

    (tmp_path / "help_team.py").write_text(
        "from dataclasses import dataclass\n"
        "from teamrl.team.registry import register_workflow\n\n"
        "@dataclass(kw_only=True)\n"
        "class HelpConfig:\n"
        "    turns: int = 2\n"
        "    \"\"\"How many turns.\"\"\"\n\n"
        "@register_workflow('help_test', config=HelpConfig, agents=('solver',))\n"
        "async def help_test(team, problem, task, cfg):\n"
        "    return ''\n")
    try:
        assert main(["train", "--import", str(tmp_path / "help_team.py"), "--help-config"]) == 0
    finally:
        WORKFLOWS.pop("help_test", None)
        sys.modules.pop("help_team", None)
    assert "workflow.help_test.turns: int = 2\n    How many turns." in capsys.readouterr().out


def test_a_config_travels_to_a_process_without_the_plugins_module(plugins, tmp_path):
    cfg = load_config(None, ["workflow.name=rounds_test", "workflow.rounds_test.rounds=3"])
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    (tmp_path / "cfg.pkl").write_bytes(pickle.dumps(cfg))
    code = ("import pickle, sys; c = pickle.load(open(sys.argv[1], 'rb')); "
            "print(c.workflow.name, c.workflow.rounds_test, c.workflow.math_team.max_loops)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cfg.pkl")], capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["rounds_test", "{'rounds':", "3}", "2"]


def test_registries_load_builtins_on_demand_without_an_import_cycle():
    code = ("import sys, teamrl.config.schema, teamrl.team.workflows; "
            "print(sorted(m for m in sys.modules if m.startswith(('teamrl.tasks.', 'teamrl.team.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "teamrl.domains.search.search_team" not in out and "teamrl.domains.math.arith" not in out
    assert "teamrl.team.registry" in out
    from teamrl.team.workflows import get_workflow

    assert get_workflow("math_tree").config_cls.__name__ == "MathTreeConfig"
