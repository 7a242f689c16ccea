"""Loading errors of teamrl.models, as the command line reports them: one line, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from teamrl.models import load_model_and_tokenizer, resolve_model_path
from tests.conftest import REPO


def _cli(args: list[str], tmp_path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    return subprocess.run([sys.executable, "-m", "teamrl.cli", *args, "--allocator", "system", f"run_dir={tmp_path / 'run'}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/no/such/dir", "error: model path /no/such/dir does not exist"),
        ("no-such-org/no-such-model", "error: model 'no-such-org/no-such-model' is not a local folder, and neither "
                                      "the network nor the local Hugging Face cache has it"),
    ],
)
def test_cli_reports_a_missing_model_in_one_line(tmp_path, path: str, expected: str) -> None:
    done = _cli(["train", f"models.main.path={path}"], tmp_path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(expected), done.stderr
    assert done.stderr.rstrip().splitlines()[-1] == errors[0]


def test_missing_local_paths_and_files(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"^model path \./models/x does not exist \(resolved to .*models/x\)"):
        resolve_model_path("./models/x")
    (tmp_path / "weights.bin").write_text("")
    with pytest.raises(FileNotFoundError, match=r"^model path .*weights\.bin is a file"):
        resolve_model_path(str(tmp_path / "weights.bin"))
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)  # an existing folder passes through


def test_a_folder_without_weights_is_one_line(tmp_path, tokenizer) -> None:
    from tests.conftest import make_tiny_model

    make_tiny_model(tokenizer).config.save_pretrained(tmp_path)  # config.json and tokenizer, no weights
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match=rf"^model folder {tmp_path} cannot be loaded: [^\n]*$"):
        load_model_and_tokenizer(str(tmp_path))


CONVERT = """
import os, sys, tempfile, time
from pathlib import Path
from teamrl.models import convert_once

out = Path(sys.argv[1])

def convert(folder):  # as the GGUF conversion: write beside the folder, then rename into place
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".convert-"))
    (tmp / "config.json").write_text(str(os.getpid()))
    time.sleep(1.0)
    with open(folder.parent / "conversions", "a") as log:
        log.write(f"{os.getpid()}\\n")
    os.replace(tmp, folder)

convert_once(out, convert)
print((out / "config.json").read_text())
"""


def test_two_processes_converting_at_once_convert_once(tmp_path) -> None:
    out = tmp_path / "models" / "m"
    procs = [subprocess.Popen([sys.executable, "-c", CONVERT, str(out)], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in results]
    assert len((tmp_path / "models" / "conversions").read_text().split()) == 1  # the second found it made
    assert {out_.strip() for out_, _ in results} == {(out / "config.json").read_text()}


@pytest.mark.slow
def test_two_processes_converting_the_embedded_model_into_an_empty_cache(tmp_path) -> None:
    code = "from teamrl.models import resolve_model_path; print(resolve_model_path('default'))"
    env = dict(os.environ, TEAMRL_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in results]
    folder = tmp_path / "cache" / "models" / "smollm2-135m-instruct"
    assert {o.strip() for o, _ in results} == {str(folder)} and (folder / "model.safetensors").is_file()
    assert not list(folder.parent.glob(".convert-*"))
