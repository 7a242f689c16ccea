"""Built-in configs: shipped in the package, found by name, listed and copied out; --dry-run validates."""

from __future__ import annotations

import pytest

from teamrl.cli import main
from teamrl.config import files as configfiles
from teamrl.config.schema import load_config
from tests.conftest import REPO


def test_the_builtin_configs_are_the_repositorys_configs():
    names = configfiles.builtin_names()
    repo = [p.stem for p in (REPO / "configs").glob("*.yaml")] + [f"recipes/{p.stem}" for p in (REPO / "configs" / "recipes").glob("*.yaml")]
    assert "quickstart" in names and names == sorted(repo)
    assert (configfiles.builtin_dir() / "quickstart.yaml").read_text() == (REPO / "configs" / "quickstart.yaml").read_text()


def test_a_name_or_a_repository_path_resolves_to_a_builtin_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # outside the repository: configs/quickstart.yaml is not a file here
    for arg in ("quickstart", "quickstart.yaml", "configs/quickstart.yaml"):
        assert configfiles.resolve(arg) == str(configfiles.builtin_dir() / "quickstart.yaml")
    (tmp_path / "quickstart").write_text("run_dir: mine\n")  # a file of that name wins
    assert configfiles.resolve("quickstart") == "quickstart"
    with pytest.raises(FileNotFoundError, match="did you mean 'search_quickstart'"):
        configfiles.resolve("search_quickstrt")


def test_configs_command_lists_and_copies(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["configs"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in configfiles.builtin_names()) and "Quickstart: a solver" in listing
    assert main(["configs", "copy", "quickstart"]) == 0
    assert load_config("quickstart.yaml").run_dir == load_config(configfiles.resolve("quickstart")).run_dir
    assert main(["configs", "copy", "math_team_lora", "sub/"]) == 0 and (tmp_path / "sub" / "math_team_lora.yaml").is_file()
    capsys.readouterr()
    assert main(["configs", "copy", "quickstart"]) == 2  # never overwrites
    assert "exists" in capsys.readouterr().err
    assert main(["configs", "copy", "quikstart"]) == 2
    assert "did you mean 'quickstart'" in capsys.readouterr().err


def test_train_dry_run_validates_without_loading(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "quickstart", "train.steps=3", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "steps: 3" in out and "config ok: 1 model(s), agents solver, verifier" in out
    assert not (tmp_path / "runs").exists()  # nothing was written
    assert main(["train", "quickstart", "train.stpes=3", "--dry-run"]) == 2
    assert "did you mean" in capsys.readouterr().err
