"""``teamrl export``: a run's trained models as standard Hugging Face directories.

For each trained physical model of the run (``models.<name>`` with ``trainable: true`` and local
weights) the export holds, under ``--out``:

- a fully trained model: ``<model>/`` (safetensors weights, config, tokenizer with its chat
  template, generation config), loadable with ``AutoModelForCausalLM.from_pretrained`` or served by
  vLLM;
- a LoRA model: ``<model>-base/`` (the frozen base) and one PEFT adapter directory
  ``<model>-<adapter>/`` per adapter (``PeftModel.from_pretrained(base, dir)``, or vLLM's
  ``--lora-modules``); with ``merge_lora=True`` each adapter is merged into its own full model
  ``<model>-<adapter>/`` instead.

Each directory has a README naming the agents it serves (with their system prompts and sampling
settings, in ``teamrl_agents.json`` too), the run's config and its held-out scores. The weights
come from ``<run>/checkpoints/step_N`` (default: the latest).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml

from teamrl.config import tools as configtools
from teamrl.config.schema import Config
from teamrl.engines.registry import engine_spec

if TYPE_CHECKING:
    from teamrl.models import CausalLM


@dataclass(frozen=True)
class Export:
    """One exported directory: ``kind`` is model, base, adapter or merged."""

    path: Path
    kind: str
    model: str
    agents: list[str]
    adapter: str | None = None


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of checkpoint weights file ``path`` (given without extension), by key.

    Reads ``<path>.safetensors`` (tied tensors restored under every name); nothing is unpickled.

    Raises:
        CheckpointError: only an old pickle file (``<path>.pt``) is there, or the file is not teamrl's.
        FileNotFoundError: no weights file exists.
    """
    from teamrl.learner.safestate import CheckpointError, load_weights

    st, pt = path.with_name(path.name + ".safetensors"), path.with_name(path.name + ".pt")
    if st.is_file():
        return load_weights(st)
    if pt.is_file():
        raise CheckpointError(f"{pt} is in the old pickle format, which teamrl no longer reads because unpickling "
                              "can run code; export a checkpoint written by this version")
    raise FileNotFoundError(f"checkpoint {path.parent} has no {path.name}.safetensors; "
                            f"was it written with the models and adapters of {path.parent.parent.parent / 'config.yaml'}?")


def find_checkpoint(run_dir: Path, step: int | None) -> Path:
    """``checkpoints/step_<step>`` of ``run_dir``, or the latest one when ``step`` is None."""
    root = run_dir / "checkpoints"
    steps = sorted(int(p.name[5:]) for p in root.glob("step_*") if p.name[5:].isdigit()) if root.is_dir() else []
    if not steps:
        raise FileNotFoundError(f"{run_dir}: no checkpoints/step_N; pass a run directory that "
                                f"`teamrl train` has saved a checkpoint in")
    if step is None:
        pointer = root / "latest"
        name = pointer.read_text().strip() if pointer.is_file() else f"step_{steps[-1]}"
        return root / name
    if step not in steps:
        raise FileNotFoundError(f"--step {step}: {root} has no step_{step}; saved steps: {', '.join(map(str, steps))}")
    return root / f"step_{step}"


def export_run(run_dir: str | Path, out: str | Path, *, step: int | None = None,
               merge_lora: bool = False) -> list[Export]:
    """Export every trained model of ``run_dir`` under ``out`` (see the module docstring).

    Raises:
        FileNotFoundError: no run config or checkpoint there.
        ValueError: ``out`` is not empty, ``merge_lora`` on a run without LoRA, or nothing is trained.
    """
    run_dir, out = Path(run_dir), Path(out)
    if not (run_dir / "config.yaml").is_file():
        raise FileNotFoundError(f"{run_dir}: no config.yaml; pass a run directory written by `teamrl train`")
    cfg = configtools.load(Config, run_dir / "config.yaml")
    ckpt = find_checkpoint(run_dir, step)
    trained = [n for n, mc in sorted(cfg.models.items())
               if mc.trainable and engine_spec(mc).local_weights and any(a.model == n for a in cfg.agents.values())]
    if not trained:
        raise ValueError(f"{run_dir}: no model of this run is trained (all are frozen or remote); nothing to export")
    if merge_lora and not any(cfg.models[n].lora.rank > 0 for n in trained):
        raise ValueError("--merge-lora: no model of this run has LoRA adapters (lora.rank is 0); "
                         "its models are exported whole already, drop --merge-lora")
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out {out} is not empty; pick a new folder")
    out.mkdir(parents=True, exist_ok=True)
    card = _run_card(run_dir, ckpt)
    done: list[Export] = []
    for name in trained:
        done += _export_model(cfg, name, ckpt, out, merge_lora=merge_lora, card=card)
    (out / "README.md").write_text(_index(run_dir, ckpt, done))
    return done


def _export_model(cfg: Config, name: str, ckpt: Path, out: Path, *, merge_lora: bool, card: dict) -> list[Export]:
    """The directories of one physical model: whole, or its base plus one per adapter."""
    from teamrl.models import load_model_and_tokenizer

    mc = cfg.models[name]
    users = {a: ac for a, ac in cfg.agents.items() if ac.model == name}
    if mc.lora.rank == 0:
        model, tok = load_model_and_tokenizer(mc.path, dtype=mc.dtype)
        load_full_weights(model, read_weights(ckpt / f"model-{name}"))
        return [_save(model, tok, out / name, Export(out / name, "model", name, sorted(users)), cfg, card)]
    from teamrl.runtime.local import adapter_params, add_adapters

    adapters = sorted({ac.adapter for ac in users.values() if ac.adapter is not None})  # LoRA: every user has one
    done = []
    if not merge_lora:
        base, tok = load_model_and_tokenizer(mc.path, dtype=mc.dtype)
        done.append(_save(base, tok, out / f"{name}-base", Export(out / f"{name}-base", "base", name, []), cfg, card))
    for adapter in adapters:
        model, tok = load_model_and_tokenizer(mc.path, dtype=mc.dtype)
        model = add_adapters(model, mc.lora, [adapter])
        state = read_weights(ckpt / f"adapter-{name}-{adapter}")
        params = adapter_params(model, adapter)
        if set(state) != set(params):
            raise ValueError(f"{ckpt}: adapter {adapter!r} of model {name!r} does not match models.{name}.lora "
                             f"of the run's config ({len(state)} tensors saved, {len(params)} expected)")
        with torch.no_grad():
            for n, t in state.items():
                params[n].copy_(t)
        served = sorted(a for a, ac in users.items() if ac.adapter == adapter)
        target = out / f"{name}-{adapter}"
        if merge_lora:
            done.append(_save(model.merge_and_unload(), tok, target, Export(target, "merged", name, served, adapter), cfg, card))
        else:
            model.peft_config[adapter].base_model_name_or_path = str((out / f"{name}-base").resolve())
            done.append(_save(model, tok, target, Export(target, "adapter", name, served, adapter), cfg, card))
    return done


def load_full_weights(model: CausalLM, state: dict[str, torch.Tensor]) -> None:
    """Load a whole model's checkpoint; a tied output head may be absent (safetensors keeps one copy)."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise ValueError(f"checkpoint weights do not fit the run's model: missing {sorted(set(missing) - tied)[:3]}, "
                         f"unexpected {sorted(unexpected)[:3]}")
    model.tie_weights()


def _save(model: Any, tok: Any, path: Path, ex: Export, cfg: Config, card: dict) -> Export:
    """Write one Hugging Face directory: weights (safetensors), tokenizer, generation config, README."""
    path.mkdir(parents=True)
    if ex.kind == "adapter" and ex.adapter is not None:
        tmp = path.parent / f".tmp-{path.name}"
        model.save_pretrained(str(tmp), selected_adapters=[ex.adapter], safe_serialization=True)
        nested = tmp / ex.adapter if (tmp / ex.adapter).is_dir() else tmp  # PEFT nests a non-"default" adapter
        for f in nested.iterdir():
            shutil.move(str(f), path / f.name)
        shutil.rmtree(tmp)
    else:
        model.generation_config = generation_config(model.generation_config, cfg, ex.agents)
        model.save_pretrained(str(path), safe_serialization=True)
    tok.save_pretrained(str(path))
    agents = agent_cards(cfg, ex.agents)
    (path / "teamrl_agents.json").write_text(json.dumps(agents, indent=2))
    (path / "README.md").write_text(model_readme(ex, agents, card))
    return ex


def generation_config(base: Any, cfg: Config, agents: list[str]) -> Any:
    """The model's generation config; the agents' sampling settings when they all share one."""
    import copy

    gc = copy.deepcopy(base)
    settings = {(a.temperature, a.top_p, a.top_k, a.max_new_tokens) for n, a in cfg.agents.items() if n in agents}
    if len(settings) == 1:
        temperature, top_p, top_k, max_new = settings.pop()
        gc.do_sample = temperature > 0
        gc.temperature, gc.top_p, gc.top_k, gc.max_new_tokens = temperature, top_p, top_k or None, max_new
    return gc


def agent_cards(cfg: Config, agents: list[str]) -> dict[str, dict[str, Any]]:
    """Per served agent: its system prompt and sampling settings (what serving it needs)."""
    from teamrl.team.agents import AGENTS

    out = {}
    for name in agents:
        ac = cfg.agents[name]
        registered = AGENTS.get(name)
        out[name] = {"system_prompt": (registered.system_prompt if registered else None) if ac.system_prompt is None else ac.system_prompt,
                     "adapter": ac.adapter, "temperature": ac.temperature, "top_p": ac.top_p, "top_k": ac.top_k,
                     "max_new_tokens": ac.max_new_tokens}
    return out


def _run_card(run_dir: Path, ckpt: Path) -> dict[str, Any]:
    """What every README repeats: the run, its config and its held-out scores."""
    scores = {}
    summary = run_dir / "summary.json"
    if summary.is_file():
        scores = {k: v for k, v in json.loads(summary.read_text()).items() if k in ("before", "after")}
    for tag in ("before", "after"):
        f = run_dir / f"eval_{tag}.json"
        if tag not in scores and f.is_file():
            scores[tag] = json.loads(f.read_text())
    return {"run_dir": str(run_dir), "checkpoint": ckpt.name, "config": (run_dir / "config.yaml").read_text(),
            "scores": scores, "workflow": yaml.safe_load((run_dir / "config.yaml").read_text())["workflow"]["name"]}


def _score_lines(scores: dict[str, Any]) -> list[str]:
    if not scores:
        return ["No held-out evaluation was recorded for this run."]
    lines = ["| model | " + " | ".join(k for k in next(iter(scores.values())) if _is_score(k)) + " |"]
    lines.append("|" + " --- |" * (lines[0].count("|") - 1))
    for tag, r in scores.items():
        label = {"before": "untrained", "after": "trained"}.get(tag, tag)
        lines.append(f"| {label} | " + " | ".join(f"{v:.3f}" for k, v in r.items() if _is_score(k)) + " |")
    any_r = next(iter(scores.values()))
    lines.append(f"\n{any_r.get('problems')} held-out problems x {any_r.get('samples')} samples per problem "
                 f"(accuracy is avg@n).")
    return lines


def _is_score(key: str) -> bool:
    return key == "accuracy" or key.startswith("pass@")


def model_readme(ex: Export, agents: dict[str, dict[str, Any]], card: dict[str, Any]) -> str:
    """The model card of one exported directory."""
    what = {"model": "the fully trained model", "base": "the frozen base model the LoRA adapters of this run train on",
            "adapter": "a LoRA adapter (PEFT)", "merged": "a LoRA adapter merged into its base model"}[ex.kind]
    front = ["---", f"library_name: {'peft' if ex.kind == 'adapter' else 'transformers'}", "tags:", "- teamrl",
             "- multi-agent", "- reinforcement-learning", "---", ""]
    lines = [*front, f"# {ex.path.name}", "",
             f"Model `{ex.model}` of the teamrl run `{card['run_dir']}` (checkpoint `{card['checkpoint']}`, "
             f"workflow `{card['workflow']}`): {what}.", "", "## Agents it serves", ""]
    if ex.agents:
        for name, a in agents.items():
            lines.append(f"- **{name}**: system prompt {a['system_prompt']!r}; temperature {a['temperature']}, "
                         f"top_p {a['top_p']}, top_k {a['top_k']}, max_new_tokens {a['max_new_tokens']}")
        lines.append("\nEach agent's prompt is its system prompt then the user turn, through this "
                     "tokenizer's chat template (settings also in `teamrl_agents.json`).")
    else:
        lines.append("None directly: load it under the adapters exported beside it.")
    lines += ["", "## Usage", "", "```python"]
    if ex.kind == "adapter":
        lines += ["from peft import PeftModel", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
                  f'base = AutoModelForCausalLM.from_pretrained("{ex.model}-base")',
                  f'model = PeftModel.from_pretrained(base, "{ex.path.name}")',
                  f'tok = AutoTokenizer.from_pretrained("{ex.path.name}")']
    else:
        lines += ["from transformers import AutoModelForCausalLM, AutoTokenizer", "",
                  f'model = AutoModelForCausalLM.from_pretrained("{ex.path.name}")',
                  f'tok = AutoTokenizer.from_pretrained("{ex.path.name}")']
    lines += ["```", "", "## Held-out scores of the team", "", *_score_lines(card["scores"]), "",
              "## Training config", "", "```yaml", card["config"].rstrip(), "```", ""]
    return "\n".join(lines)


def _index(run_dir: Path, ckpt: Path, done: list[Export]) -> str:
    lines = [f"# teamrl export of `{run_dir}` ({ckpt.name})", "", "| folder | kind | agents |", "| --- | --- | --- |"]
    lines += [f"| {e.path.name} | {e.kind} | {', '.join(e.agents) or '-'} |" for e in done]
    return "\n".join(lines) + "\n"
