"""The hubs' config rules, checked without either package: a verifiers environment is scored by its own rollout, so
its task and the verifiers workflow go together, and each hub's options are validated like every section."""

from __future__ import annotations

import pytest

from teamrl.config.schema import load_config
from tests.conftest import REPO


def test_the_verifiers_task_needs_the_verifiers_workflow():
    with pytest.raises(ValueError, match=r"workflow.name: task verifiers is scored by the environment's own rollout"):
        load_config(REPO / "configs" / "verifiers_arith.yaml", ["workflow.name=single", "agents.solver.model=main"])
    with pytest.raises(ValueError, match=r"workflow.name: workflow verifiers runs a verifiers environment; set "
                                         r"task.name: verifiers \(not 'arith'\)"):
        load_config(REPO / "configs" / "verifiers_arith.yaml", ["task.name=arith"])


def test_hub_options_are_checked():
    with pytest.raises(ValueError, match="task.verifiers.env_id is empty"):
        load_config(REPO / "configs" / "verifiers_arith.yaml", ["task.verifiers.env_id="])
    with pytest.raises(ValueError, match="workflow.verifiers.model 'nobody' is not in models"):
        load_config(REPO / "configs" / "verifiers_arith.yaml", ["workflow.verifiers.model=nobody"])


def test_openenv_options_are_checked():
    with pytest.raises(ValueError, match="needs exactly one of env_id"):
        load_config(REPO / "configs" / "openenv_guess.yaml", ["task.openenv.url=http://127.0.0.1:1"])
    with pytest.raises(ValueError, match="did you mean 'task.openenv.env_args'"):
        load_config(REPO / "configs" / "openenv_guess.yaml", ["task.openenv.env_arg={}"])
