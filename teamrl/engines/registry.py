"""The generation engines by name: what ``models.<m>.engine`` means, in one place.

Each engine declares what it can do (:class:`EngineSpec`), the config rules that follow from it
and its factory. Everything else asks the spec (``engine_spec(mc).local_weights``) instead of
comparing engine names. The options of the ``vllm`` and ``openai`` engines
(``models.<m>.vllm``, ``models.<m>.openai``) are defined here too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args

if TYPE_CHECKING:
    import torch

    from teamrl.engines.base import Engine

__all__ = ["ENGINES", "EngineName", "EngineSpec", "OpenAIEngineConfig", "VLLMEngineConfig", "build_engine",
           "engine_errors", "engine_spec"]

EngineName = Literal["hf", "vllm", "openai"]


@dataclass(kw_only=True)
class OpenAIEngineConfig:
    base_url: str = ""
    """Base URL of an OpenAI-compatible server (vLLM serve, SGLang, ...), e.g. http://10.0.0.5:8000/v1. Needed when engine is openai."""
    model: str | None = None
    """Model name the server serves (the request's `model` field); null takes models.<name>.path."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the API key (sent as a Bearer token when set; many local servers need none)."""
    timeout_s: float = 120.0
    """Seconds one HTTP request may take before it is retried."""
    retries: int = 3
    """Retries of a request that failed with a connection error, a timeout, HTTP 429 or 5xx (exponential back-off)."""
    concurrency: int = 32
    """Most requests in flight at once (the server batches them)."""
    token_ids: Literal["server", "retokenize"] = "server"
    """How response token ids are obtained. server: the server returns them (vLLM's return_tokens_as_token_ids; tokens come back as 'token_id:N'), exact. retokenize: the reply text is tokenized locally with the model's tokenizer; the server's log-probs are kept only when the token counts agree (else NaN)."""

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"openai.timeout_s {self.timeout_s} must be > 0")
        if self.retries < 0:
            raise ValueError(f"openai.retries {self.retries} must be >= 0")
        if self.concurrency < 1:
            raise ValueError(f"openai.concurrency {self.concurrency} must be >= 1")


@dataclass(kw_only=True)
class VLLMEngineConfig:
    gpu_memory_utilization: float = 0.5
    """Share of the GPU's memory vLLM may take (weights + KV cache); leave room for the learner when colocated."""
    max_model_len: int = 2048
    """Longest prompt + reply (tokens) vLLM plans its KV cache for."""
    enforce_eager: bool = True
    """Skip CUDA-graph capture (faster start, slower decode); false captures graphs on a GPU."""
    cpu_kv_cache_gb: int = 1
    """KV-cache size in GiB on a CPU build of vLLM (sets VLLM_CPU_KVCACHE_SPACE when it is unset)."""
    sleep: bool = False
    """Release vLLM's memory between rollout and training (sleep mode level 1: KV cache freed, weights offloaded to host memory; woken before the next weight sync). Needs a CUDA GPU; rejected on a CPU build, which has no sleep mode."""

    def __post_init__(self) -> None:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"vllm.gpu_memory_utilization {self.gpu_memory_utilization} must be in (0, 1]")
        if self.max_model_len < 16:
            raise ValueError(f"vllm.max_model_len {self.max_model_len} must be >= 16")
        if self.cpu_kv_cache_gb <= 0:
            raise ValueError(f"vllm.cpu_kv_cache_gb {self.cpu_kv_cache_gb} must be > 0")


class ModelSettings(Protocol):
    """What the registry reads of one ``models.<m>`` section (:class:`teamrl.config.model.ModelConfig` is one).

    Named here so that the config package imports the registry one way: the registry never imports the schema."""

    @property
    def path(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def rollout_dtype(self) -> str: ...
    @property
    def engine(self) -> str: ...
    @property
    def trainable(self) -> bool: ...
    @property
    def max_batch_size(self) -> int: ...
    @property
    def scheduler(self) -> str: ...
    @property
    def share_prefix(self) -> int | Literal["auto"]: ...
    @property
    def cpu_attention(self) -> str: ...
    @property
    def cuda_graphs(self) -> bool: ...
    @property
    def lora(self) -> Any: ...
    @property
    def openai(self) -> OpenAIEngineConfig: ...
    @property
    def vllm(self) -> VLLMEngineConfig: ...


class RunSettings(Protocol):
    """What the registry reads of a whole config (:class:`teamrl.config.schema.Config` is one): the models and
    ``train.seed``."""

    @property
    def models(self) -> Mapping[str, ModelSettings]: ...
    @property
    def train(self) -> Any: ...


Rules = Callable[[str, ModelSettings], list[str]]
Factory = Callable[[RunSettings, str, Any, "torch.nn.Module | None"], "Engine"]


@dataclass(frozen=True)
class EngineSpec:
    """What one engine is and can do."""

    name: str
    local_weights: bool
    """The model's weights are loaded in this process (false: a server holds them; only the tokenizer is loaded,
    and device and dtypes are the server's)."""
    trainable: bool
    """Its model can be trained (false: rollout-only, the model must be trainable: false)."""
    lora: bool
    """It decodes with LoRA adapters."""
    stepped: bool
    """The rollout steps its decode batch token by token (scheduler: continuous; share_prefix)."""
    section: str | None
    """Its options under models.<m> (None: it has none)."""
    rules: Rules
    """Config problems of a model on this engine beyond the generic ones, each naming its key."""
    build: Factory
    """``build(cfg, name, tokenizer, module)``: the engine of model ``name`` (module: its in-process weights)."""


def _hf_rules(name: str, mc: ModelSettings) -> list[str]:
    if mc.share_prefix != "auto" and mc.share_prefix and mc.lora.rank > 0:
        return [f"models.{name}: share_prefix needs the fast decode loop, which LoRA models do not use; set it to 0"]
    return []


def _openai_rules(name: str, mc: ModelSettings) -> list[str]:
    errors = []
    if mc.trainable:
        errors.append(f"models.{name}.engine: openai is rollout-only (a remote server cannot be trained); "
                      f"set models.{name}.trainable: false to use it as a frozen agent, or use engine hf or vllm")
    if not mc.openai.base_url:
        errors.append(f"models.{name}.openai.base_url is empty; set it to the server's URL, e.g. http://localhost:8000/v1")
    if mc.rollout_dtype not in ("same", "auto"):
        errors.append(f"models.{name}.rollout_dtype: {mc.rollout_dtype!r} has no effect with engine openai "
                      f"(the server picks its dtype); remove it")
    return errors


def _no_rules(name: str, mc: ModelSettings) -> list[str]:
    return []


def _build_hf(cfg: RunSettings, name: str, tok: Any, model: torch.nn.Module | None) -> Engine:
    from teamrl.engines.hf import HFEngine
    from teamrl.models import DTYPES

    mc = cfg.models[name]
    return HFEngine(model, tok, max_batch_size=mc.max_batch_size, seed=cfg.train.seed,
                    dtype=None if mc.rollout_dtype == "same" else DTYPES[mc.rollout_dtype],
                    adapters=mc.lora.rank > 0, share_prefix=mc.share_prefix,
                    cpu_kernel=mc.cpu_attention == "kernel", cuda_graphs=mc.cuda_graphs,
                    release_copies=cfg.train.release_memory)


def _build_vllm(cfg: RunSettings, name: str, tok: Any, model: torch.nn.Module | None) -> Engine:
    from teamrl.engines.vllm import VLLMEngine  # optional dependency: imported only when asked for
    from teamrl.models import resolve_model_path

    mc = cfg.models[name]
    return VLLMEngine(resolve_model_path(mc.path), tok, source=model if mc.trainable else None,
                      seed=cfg.train.seed, dtype=mc.dtype if mc.rollout_dtype == "same" else mc.rollout_dtype,
                      max_batch_size=mc.max_batch_size, gpu_memory_utilization=mc.vllm.gpu_memory_utilization,
                      max_model_len=mc.vllm.max_model_len, enforce_eager=mc.vllm.enforce_eager,
                      cpu_kv_cache_gb=mc.vllm.cpu_kv_cache_gb, sleep=mc.vllm.sleep)


def _build_openai(cfg: RunSettings, name: str, tok: Any, model: torch.nn.Module | None) -> Engine:
    from teamrl.engines.openai import OpenAIEngine, api_key_from_env

    mc = cfg.models[name]
    o = mc.openai
    return OpenAIEngine(o.base_url, o.model or mc.path, tok, api_key=api_key_from_env(o.api_key_env),
                        timeout_s=o.timeout_s, retries=o.retries, concurrency=o.concurrency,
                        token_ids=o.token_ids, seed=cfg.train.seed)


ENGINES: dict[str, EngineSpec] = {
    "hf": EngineSpec(name="hf", local_weights=True, trainable=True, lora=True, stepped=True, section=None,
                     rules=_hf_rules, build=_build_hf),
    "vllm": EngineSpec(name="vllm", local_weights=True, trainable=True, lora=False, stepped=False, section="vllm",
                       rules=_no_rules, build=_build_vllm),
    "openai": EngineSpec(name="openai", local_weights=False, trainable=False, lora=False, stepped=False,
                         section="openai", rules=_openai_rules, build=_build_openai),
}
"""Every engine ``models.<m>.engine`` may name (the values of :data:`EngineName`)."""


def engine_spec(mc: ModelSettings) -> EngineSpec:
    """The engine of a model's config."""
    if mc.engine not in ENGINES:
        raise ValueError(f"models.<name>.engine: {mc.engine!r} is not one of {', '.join(get_args(EngineName))}")
    return ENGINES[mc.engine]


def engine_errors(name: str, mc: ModelSettings) -> list[str]:
    """Settings of model ``name`` that its engine cannot honour, each with what to do instead."""
    spec = engine_spec(mc)
    errors = []
    if mc.share_prefix != "auto" and mc.share_prefix and not spec.stepped:
        errors.append(f"models.{name}: share_prefix applies to engine: hf only (this model uses engine: "
                      f"{spec.name}); set it to 0")
    if mc.cpu_attention != "kernel" and not spec.stepped:
        errors.append(f"models.{name}: cpu_attention applies to engine: hf only (this model uses engine: "
                      f"{spec.name}); remove it")
    if not mc.cuda_graphs and not spec.stepped:
        errors.append(f"models.{name}: cuda_graphs applies to engine: hf only (this model uses engine: "
                      f"{spec.name}); remove it")
    if mc.scheduler == "continuous" and not spec.stepped:
        errors.append(f"models.{name}: scheduler: continuous steps an hf engine token by token; engine {spec.name} "
                      f"batches by itself: use scheduler: lockstep")
    for other in ENGINES.values():
        section = other.section
        if section is not None and other is not spec and getattr(mc, section) != type(getattr(mc, section))():
            errors.append(f"models.{name}.{section}: options of engine {other.name}, but the model's engine is "
                          f"{spec.name!r}; set models.{name}.engine: {other.name} or remove models.{name}.{section}")
    if mc.lora.rank > 0 and not spec.lora:
        errors.append(f"models.{name}.lora.rank: LoRA adapters run with engine hf only; set models.{name}.engine: hf "
                      f"or lora.rank: 0")
    return spec.rules(name, mc) + errors


def build_engine(cfg: RunSettings, name: str, tok: Any, model: torch.nn.Module | None = None) -> Engine:
    """The engine of model ``name``: over its in-process ``model`` (hf: the same module; vllm: its own copy,
    synced), or a client of its server (``model`` None)."""
    spec = engine_spec(cfg.models[name])
    if spec.local_weights and model is None:
        raise ValueError(f"models.{name}: engine {spec.name} runs on the model's weights in this process; "
                         f"load the model first")
    return spec.build(cfg, name, tok, model)

