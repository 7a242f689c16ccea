"""Numbers outside their range are refused with one line naming their own key (not a neighbouring rule's),
and a device the machine does not have is refused by ``--dry-run`` too."""

from __future__ import annotations

import pytest
import torch

from teamrl.cli import main
from teamrl.config import tools as configtools
from teamrl.config.schema import load_config

TREE = "workflow.name=math_tree|agents.solver.model=main|agents.refiner.model=main|algo.reward_alloc.name=tree"

# (override, the one key the single error must name, the value it must echo)
REFUSED = [
    ("train.steps=-5", "train.steps", "-5"),
    ("train.threads=-3", "train.threads", "-3"),
    ("train.save_every=-1", "train.save_every", "-1"),
    ("train.transcripts_per_step=-2", "train.transcripts_per_step", "-2"),
    ("eval.problems=-1", "eval.problems", "-1"),
    ("eval.temperature=-0.5", "eval.temperature", "-0.5"),
    ("loss.clip_low=-0.1", "loss.clip_low", "-0.1"),
    ("loss.clip_low=1.0", "loss.clip_low", "1.0"),
    ("loss.clip_high=-0.1", "loss.clip_high", "-0.1"),
    ("loss.kl_coef=-1", "loss.kl_coef", "-1"),
    ("loss.dual_clip=0.5", "loss.dual_clip", "0.5"),
    ("models.main.optim.lr=-1", "models.main.optim: lr", "-1.0"),
    ("models.main.optim.lr=0", "models.main.optim: lr", "0"),
    ("models.main.optim.lr=.nan", "models.main.optim: lr", "nan"),
    ("models.main.optim.weight_decay=-0.1", "models.main.optim: weight_decay", "-0.1"),
    ("models.main.optim.grad_clip=-1", "models.main.optim: grad_clip", "-1"),
    ("models.main.optim.warmup_steps=-3", "models.main.optim: warmup_steps", "-3"),
    ("models.main.optim.betas=[1.5, 0.9]", "models.main.optim: betas", "1.5"),
    ("backend=ray|ray.num_cpus=0", "ray: num_cpus", "0"),
    ("algo.group_filter=uid|algo.group_filter_ratio=1.5", "algo.group_filter_ratio", "1.5"),
    (f"{TREE}|algo.reward_alloc.beta=2", "algo.reward_alloc.beta", "2"),
    (f"{TREE}|algo.reward_alloc.alpha=-1", "algo.reward_alloc.alpha", "-1"),
    ("algo.reward_alloc.name=margin", "algo.reward_alloc.name", "margin"),
    ("loss.mini_batch_rows=-4", "loss.mini_batch_rows", "-4"),
    ("loss.mini_batch_rows=16|loss.updates_per_batch=2", "loss.mini_batch_rows", "16"),
    ("loss.drop_remainder=true", "loss.drop_remainder", "mini_batch_rows"),
    ("models.main.optim.warmup_ratio=1.2", "models.main.optim: warmup_ratio", "1.2"),
    ("models.main.optim.warmup_ratio=0.1|models.main.optim.warmup_steps=3", "models.main.optim: warmup_steps", "both"),
    ("models.main.optim.min_lr_ratio=0.1", "models.main.optim: min_lr_ratio", "schedule: cosine"),
    ("models.main.optim.schedule_steps=0", "models.main.optim: schedule_steps", "0"),
    ("models.main.optim.schedule_style=verll", "models.main.optim.schedule_style", "verll"),
    ("loss.logprob_temperature=1.0", "loss.logprob_temperature", "old_logprobs: recompute"),
    ("loss.logprob_temperature=0|loss.old_logprobs=recompute", "loss.logprob_temperature", "0"),
    ("eval.top_p=1.5", "eval.top_p", "1.5"),
    ("algo.group_pool=0", "algo.group_pool", "0"),
    ("agents.solver.max_prompt_tokens=-1", "agents.solver: max_prompt_tokens", "-1"),
    ("agents.solver.truncation=middel|agents.verifier.model=main", "agents.solver.truncation", "middel"),
]


@pytest.mark.parametrize(("override", "key", "value"), REFUSED, ids=[c[0] for c in REFUSED])
def test_an_out_of_range_value_is_one_error_naming_its_key(override: str, key: str, value: str) -> None:
    with pytest.raises(configtools.ConfigError) as info:
        load_config(None, override.split("|"))
    lines = [e for e in info.value.errors if e.startswith(key)]  # the error is about this key, not another's
    assert len(lines) == 1 and value in lines[0].split(key, 1)[1], info.value.errors
    others = [e for e in info.value.errors if e not in lines and "backend: ray" not in e]
    assert others == [], others  # e.g. train.steps=-5 is not reported as an eval.every problem


def test_zero_steps_still_means_evaluate_only() -> None:
    assert load_config(None, ["train.steps=0"]).train.steps == 0


@pytest.mark.skipif(torch.cuda.device_count() > 7, reason="this machine has a cuda:7")
def test_dry_run_refuses_a_device_the_machine_does_not_have(capsys) -> None:
    assert main(["train", "models.main.device=cuda:7", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: models.main.device 'cuda:7'"), err
