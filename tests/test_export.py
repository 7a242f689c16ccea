"""teamrl export: a trained tiny team, exported and loaded back with plain transformers / PEFT,
gives the learner's logits."""

from __future__ import annotations

import json

import pytest
import torch

from teamrl.cli import main
from teamrl.export import export_run, read_weights
from teamrl.train.trainer import Trainer
from tests.train.test_trainer import _register_reply_length_task, tiny_config

PROMPT = [{"role": "system", "content": "You are a careful math solver."}, {"role": "user", "content": "2 + 3 = ?"}]


def _logits(model, tok) -> torch.Tensor:
    ids = tok.apply_chat_template(PROMPT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        return model(input_ids=ids["input_ids"]).logits


def _train(tmp_path, tiny_model_dir, *extra):  # rewards by reply length: random weights get a learning signal
    _register_reply_length_task()
    cfg = tiny_config(tmp_path, tiny_model_dir, "run", "task.name=reply_length", "algo.format_penalty=0",
                      "models.main.optim.lr=1e-2", *extra)
    trainer = Trainer(cfg, progress=False)
    trainer.train()
    return trainer


def test_export_of_a_trained_model_gives_the_learners_logits(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trainer = _train(tmp_path, tiny_model_dir, "eval.before=false", "train.steps=1")
    (ex,) = export_run(tmp_path / "run", tmp_path / "export")
    assert ex.path == tmp_path / "export" / "main" and ex.agents == ["solver", "verifier"]
    files = {p.name for p in ex.path.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "README.md",
            "teamrl_agents.json"} <= files and not any(f.endswith((".bin", ".pt")) for f in files)
    model = AutoModelForCausalLM.from_pretrained(ex.path)
    tok = AutoTokenizer.from_pretrained(ex.path)
    assert tok.chat_template  # the template agents were prompted with travels with the export
    learner = trainer.models["main"].eval()
    torch.testing.assert_close(_logits(model, tok), _logits(learner, tok), atol=0, rtol=0)
    untrained = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert not torch.equal(_logits(untrained, tok), _logits(model, tok))  # the training is in the export
    readme = (ex.path / "README.md").read_text()
    accuracy = json.loads((tmp_path / "run" / "summary.json").read_text())["after"]["accuracy"]
    assert "**solver**" in readme and "**verifier**" in readme and f"| trained | {accuracy:.3f}" in readme
    assert "train:\n  steps: 1" in readme  # the run's config
    assert json.loads((ex.path / "teamrl_agents.json").read_text())["solver"]["max_new_tokens"] == 6


def test_export_of_lora_adapters_and_merged_models_gives_each_agents_logits(tmp_path, tiny_model_dir):
    peft = pytest.importorskip("peft", reason="LoRA export needs peft (pip install 'teamrl[lora]')")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trainer = _train(tmp_path, tiny_model_dir, "models.main.lora.rank=4", "agents.solver.adapter=solver",
                     "agents.verifier.adapter=verifier", "eval.before=false", "eval.after=false",
                     "train.steps=1")
    done = export_run(tmp_path / "run", tmp_path / "adapters")
    assert [(e.path.name, e.kind, e.agents) for e in done] == [
        ("main-base", "base", []), ("main-solver", "adapter", ["solver"]), ("main-verifier", "adapter", ["verifier"])]
    merged = export_run(tmp_path / "run", tmp_path / "merged", merge_lora=True)
    assert [e.kind for e in merged] == ["merged", "merged"]
    tok = AutoTokenizer.from_pretrained(tmp_path / "adapters" / "main-solver")
    learner = trainer.models["main"].eval()
    base_logits = _logits(AutoModelForCausalLM.from_pretrained(tmp_path / "adapters" / "main-base"), tok)
    for adapter in ("solver", "verifier"):
        learner.set_adapter(adapter)
        want = _logits(learner, tok)
        assert not torch.equal(want, base_logits)  # the adapter was trained
        base = AutoModelForCausalLM.from_pretrained(tmp_path / "adapters" / "main-base")
        model = peft.PeftModel.from_pretrained(base, tmp_path / "adapters" / f"main-{adapter}").eval()
        torch.testing.assert_close(_logits(model, tok), want, atol=0, rtol=0)
        full = AutoModelForCausalLM.from_pretrained(tmp_path / "merged" / f"main-{adapter}")
        torch.testing.assert_close(_logits(full, tok), want, atol=1e-4, rtol=1e-4)  # merging re-rounds W + BA


def test_export_errors_name_the_problem(tmp_path, tiny_model_dir, capsys):
    with pytest.raises(FileNotFoundError, match="no config.yaml"):
        export_run(tmp_path, tmp_path / "out")
    _train(tmp_path, tiny_model_dir, "eval.before=false", "eval.after=false", "train.steps=1")
    with pytest.raises(FileNotFoundError, match="saved steps: 1"):
        export_run(tmp_path / "run", tmp_path / "out", step=2)
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--step", "2"]) == 2
    assert "saved steps: 1" in capsys.readouterr().err  # one line, no traceback
    with pytest.raises(ValueError, match="no model of this run has LoRA"):
        export_run(tmp_path / "run", tmp_path / "out", merge_lora=True)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(ValueError, match="not empty"):
        export_run(tmp_path / "run", tmp_path / "full")


def test_read_weights_reads_safetensors_and_refuses_pickles(tmp_path):
    from teamrl.learner.safestate import CheckpointError, save_weights

    torch.save({"w": torch.ones(2)}, tmp_path / "model-main.pt")
    with pytest.raises(CheckpointError, match="old pickle format"):
        read_weights(tmp_path / "model-main")
    emb = torch.zeros(2)
    save_weights(tmp_path / "model-main.safetensors", {"w": emb, "tied": emb})
    back = read_weights(tmp_path / "model-main")
    assert torch.equal(back["w"], torch.zeros(2)) and back["tied"] is back["w"]
    with pytest.raises(FileNotFoundError, match="no adapter-main-x.safetensors"):
        read_weights(tmp_path / "adapter-main-x")
