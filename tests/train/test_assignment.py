"""Agent→model mappings trained end to end on tiny models: shared, separate, heterogeneous, LoRA.

Each run trains 2 steps with an entropy bonus, so every row carries a gradient whatever the
rewards, and checks that exactly the parameters that should change did change.
"""

from __future__ import annotations

import json

import pytest
import torch

from teamrl.config.schema import load_config
from teamrl.train.trainer import Trainer

SIGNAL = ("loss.entropy_coef=0.01", "eval.before=false", "eval.after=false", "train.save_every=1")


def config(tmp_path, run: str, models: str, agents: str, *extra: str):
    return load_config(None, [
        f"run_dir={tmp_path / run}", f"models={models}", f"agents={agents}",
        "rollout.batch_size=2", "rollout.group_size=2", "train.steps=2", "task.arith.n_test=10",
        "algo.format_penalty=0.5", *SIGNAL, *extra,
    ])


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def changed(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> set[str]:
    return {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}


def group_lrs(tr: Trainer, model: str) -> dict[str, float]:
    return {g["name"]: g["lr"] for g in tr.learners[model].optimizer.param_groups}


def test_shared_model_trains_its_one_set_of_weights(tmp_path, tiny_model_dir):
    cfg = config(tmp_path, "shared", f"{{main: {{path: {tiny_model_dir}, optim: {{lr: 0.002}}}}}}",
                 "{solver: {max_new_tokens: 6}, verifier: {max_new_tokens: 4, loss_weight: 0.5}}")
    tr = Trainer(cfg, progress=False)
    before = snapshot(tr.models["main"])
    tr.train()
    assert list(tr.models) == ["main"] and len(tr.engines) == 1
    assert changed(tr.models["main"], before) == set(before)
    assert group_lrs(tr, "main") == {"main": 0.002}
    metrics = [json.loads(line) for line in (tmp_path / "shared" / "metrics.jsonl").read_text().splitlines()]
    assert {"perf/peak_rss_gb/rollout", "perf/peak_rss_gb/update"} <= metrics[-1].keys()
    assert metrics[-1]["perf/peak_rss_gb/update"] > 0.05


@pytest.mark.parametrize("verifier_weight", [1.0, 0.0])
def test_separate_models_each_train_on_their_own_agent(tmp_path, tiny_model_dir, verifier_weight):
    cfg = config(tmp_path, f"separate{verifier_weight}",
                 f"{{a: {{path: {tiny_model_dir}}}, b: {{path: {tiny_model_dir}}}}}",
                 f"{{solver: {{model: a, max_new_tokens: 6, lr: 0.003}}, "
                 f"verifier: {{model: b, max_new_tokens: 4, lr: 0.0007, loss_weight: {verifier_weight}}}}}")
    tr = Trainer(cfg, progress=False)
    assert tr.models["a"] is not tr.models["b"]
    before = {m: snapshot(tr.models[m]) for m in ("a", "b")}
    tr.train()
    assert changed(tr.models["a"], before["a"]) == set(before["a"])
    assert changed(tr.models["b"], before["b"]) == (set(before["b"]) if verifier_weight else set())
    assert group_lrs(tr, "a") == {"a": 0.003} and group_lrs(tr, "b") == {"b": 0.0007}


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory):
    """A tiny Qwen2 model with its own BPE tokenizer, special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    text = ["What is 3 + 4? Put the final answer after ####. yes no correct answer solution verifier"] * 20
    bpe.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<pad>", "<bos>", "<eot>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>", pad_token="<pad>", bos_token="<bos>",
                                  eos_token="<eot>")
    tok.chat_template = ("{% for m in messages %}<bos>[{{ m['role'] }}] {{ m['content'] }}<eot>{% endfor %}"
                         "{% if add_generation_prompt %}<bos>[assistant] {% endif %}")
    torch.manual_seed(1)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    out = tmp_path_factory.mktemp("tiny-qwen2")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_heterogeneous_team_uses_each_models_tokenizer(tmp_path, tiny_model_dir, other_model_dir, tokenizer):
    cfg = config(tmp_path, "hetero", f"{{solver_m: {{path: {tiny_model_dir}}}, judge: {{path: {other_model_dir}}}}}",
                 "{solver: {model: solver_m, max_new_tokens: 6}, verifier: {model: judge, max_new_tokens: 5, lr: 0.01}}")
    tr = Trainer(cfg, progress=False)
    before = {m: snapshot(tr.models[m]) for m in tr.models}
    tr.train()
    assert type(tr.models["judge"]).__name__ == "Qwen2ForCausalLM"
    assert all(changed(tr.models[m], before[m]) == set(before[m]) for m in tr.models)
    assert group_lrs(tr, "judge") == {"judge": 0.01}
    judge_tok = tr.engines["judge"].tokenizer
    assert len(judge_tok) < 500 < len(tokenizer)
    assert tr.engines["judge"].stop_ids == {judge_tok.convert_tokens_to_ids("<eot>")}
    episodes = tr.rollout.collect(tr.sampler.next(2), 2, progress=False)
    verifier = [s for ep in episodes for s in ep.steps if s.agent == "verifier"]
    solver = [s for ep in episodes for s in ep.steps if s.agent == "solver"]
    assert verifier and solver
    assert all(judge_tok.decode(s.prompt_ids).startswith("<bos>[system]") for s in verifier)
    assert all(max(s.prompt_ids + s.response_ids) < len(judge_tok) for s in verifier)
    assert all(tokenizer.decode(s.prompt_ids).startswith("<|im_start|>system") for s in solver)
    stopped = [s for s in verifier if s.finish_reason == "stop"]
    assert all(s.response_ids[-1] == judge_tok.eos_token_id for s in stopped)


LORA_MODELS = "{{main: {{path: {d}, lora: {{rank: 4, alpha: 8, targets: [q_proj, v_proj]}}, optim: {{lr: 0.001}}}}}}"
LORA_AGENTS = ("{solver: {max_new_tokens: 6, adapter: solver, lr: 0.005}, "
               "verifier: {max_new_tokens: 4, adapter: verifier, loss_weight: 0.0}}")
# (an agent that no workflow calls is refused when the config loads: tests/config/test_names.py)


def test_lora_trains_only_the_adapters_of_agents_with_a_signal(tmp_path, tiny_model_dir):
    pytest.importorskip("peft")
    tr = Trainer(config(tmp_path, "lora", LORA_MODELS.format(d=tiny_model_dir), LORA_AGENTS), progress=False)
    model = tr.models["main"]
    before = snapshot(model)
    tr.train()
    moved = changed(model, before)
    solver = {n for n in before if ".solver." in n}
    assert solver and moved == solver  # base frozen; verifier (weight 0) unchanged
    assert all(not p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)
    assert group_lrs(tr, "main") == {"solver": 0.005, "verifier": 0.001}
    ckpt = tmp_path / "lora" / "checkpoints" / "step_2"
    assert {p.name for p in ckpt.iterdir()} == {"adapter-main-solver.safetensors",
                                                "adapter-main-verifier.safetensors", "optim-main.safetensors",
                                                "trainer.safetensors"}


def test_lora_engine_routes_each_row_to_its_adapter(tokenizer):
    pytest.importorskip("peft")
    from teamrl.config.schema import LoraConfig
    from teamrl.engines.base import GenRequest, SamplingParams
    from teamrl.engines.hf import HFEngine
    from teamrl.learner.learner import response_logprobs
    from teamrl.runtime.local import adapter_params, add_adapters
    from tests.conftest import make_tiny_model
    from tests.train.test_learner import make_rows

    model = add_adapters(make_tiny_model(tokenizer), LoraConfig(rank=4, targets=["q_proj", "v_proj"]), ["x", "y"])
    with torch.no_grad():  # make the adapters differ (LoRA B starts at zero)
        for i, name in enumerate(["x", "y"]):
            for p in adapter_params(model, name).values():
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(i))
    engine = HFEngine(model, tokenizer, adapters=True)
    prompt = tokenizer.encode("question: what is 2 + 2")
    greedy = SamplingParams(temperature=0, max_new_tokens=5)
    mixed = engine.generate([GenRequest(prompt, greedy, "x"), GenRequest(prompt, greedy, "y")])
    alone = [engine.generate([GenRequest(prompt, greedy, a)])[0] for a in ("x", "y")]
    assert [o.response_ids for o in mixed] == [o.response_ids for o in alone]
    assert mixed[0].response_ids != mixed[1].response_ids
    row = make_rows(tokenizer, n=1)[0]
    for adapter, out in zip(("x", "y"), mixed):
        row.prompt_ids, row.response_ids, row.temperature = prompt, out.response_ids, 1.0
        model.set_adapter(adapter)
        logp, _, _ = response_logprobs(model, [row])
        torch.testing.assert_close(logp[0], torch.tensor(out.logprobs), atol=1e-3, rtol=0)


@pytest.mark.slow  # tests/train/test_resume.py resumes math_team_separate and math_team_lora in the default run
@pytest.mark.parametrize("mapping", ["separate", "lora"])
def test_resume_reproduces_an_uninterrupted_run(tmp_path, tiny_model_dir, mapping):
    if mapping == "lora":
        pytest.importorskip("peft")
        models = LORA_MODELS.format(d=tiny_model_dir)
        agents = LORA_AGENTS.replace("loss_weight: 0.0", "loss_weight: 1.0")
    else:
        models = f"{{a: {{path: {tiny_model_dir}}}, b: {{path: {tiny_model_dir}}}}}"
        agents = "{solver: {model: a, max_new_tokens: 6, lr: 0.003}, verifier: {model: b, max_new_tokens: 4}}"
    run = lambda name, *extra: config(tmp_path, name, models, agents, *extra)  # noqa: E731
    straight = Trainer(run("straight"), progress=False)
    straight.train()
    Trainer(run("resumed", "train.steps=1"), progress=False).train()
    second = Trainer(run("resumed"), resume=True, allow_change=("train.steps",), progress=False)
    assert second.start_step == 1
    second.train()
    for m in straight.models:
        for (n, p), (_, q) in zip(straight.models[m].named_parameters(),
                                  second.models[m].named_parameters(), strict=True):
            torch.testing.assert_close(p, q, atol=0, rtol=0, msg=n)
    strip = lambda line: {k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}  # noqa: E731
    a = (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()
    b = (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()
    assert [strip(x) for x in a] == [strip(x) for x in b]
