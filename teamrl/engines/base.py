"""The generation-engine interface: requests in, token ids and log-probs out.

An engine generates for one physical model. It receives every pending call of every episode and
every agent that shares that model at once (see :class:`teamrl.team.dispatcher.Dispatcher`) and
returns, per call, the sampled token ids with their log-probs. Backends live next to this file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class SamplingParams:
    """How one call is sampled. ``temperature == 0`` means greedy decoding.

    ``ignore_eos`` keeps decoding through end-of-turn tokens and stop strings until
    ``max_new_tokens`` (fixed-length generation, e.g. for throughput measurements).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature {self.temperature} must be >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p {self.top_p} must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError(f"top_k {self.top_k} must be >= 0 (0 = off)")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens {self.max_new_tokens} must be >= 1")


@dataclass
class GenRequest:
    """One LLM call: a tokenized prompt, how to sample its continuation, and the LoRA adapter to use.

    ``adapter`` names the agent's LoRA adapter on a model with adapters (None: the model itself).
    """

    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    adapter: str | None = None


@dataclass
class GenOutput:
    """The result of one call.

    ``logprobs[i]`` is log p(response_ids[i]) under softmax(logits / temperature) (temperature 1
    for greedy calls), the same quantity the learner recomputes; top-p/top-k truncation is not
    folded in.
    """

    response_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" (end-of-turn token or stop string) or "length"


class GeneratorState(Protocol):
    """The engine's sampling random state, as checkpoints save and restore it (``torch.Generator`` has it)."""

    def get_state(self) -> Any: ...

    def set_state(self, state: Any, /) -> object: ...  # torch.Generator returns itself


@runtime_checkable
class Engine(Protocol):
    """Generates continuations for one physical model: the contract every engine keeps.

    In-process (:class:`~teamrl.engines.hf.HFEngine`, :class:`~teamrl.engines.vllm.VLLMEngine`), remote
    (:class:`~teamrl.engines.openai.OpenAIEngine`) and Ray-actor engines
    (:class:`~teamrl.runtime.distributed.backend.EngineProxy`) implement it; the type checker verifies it where
    they are built (:func:`teamrl.engines.registry.build_engine` returns an ``Engine``; the Ray proxies are stored
    as ``Engine`` in :mod:`teamrl.runtime.distributed.backend`).
    """

    tokenizer: Any
    """The model's tokenizer (chat template, stop tokens)."""

    @property
    def generator(self) -> GeneratorState:
        """Draws every sampling decision; saved in checkpoints so a resumed run samples the same."""
        ...

    def generate(self, requests: list[GenRequest], on_progress: Callable[[int], None] | None = None) -> list[GenOutput]:
        """Generate one output per request, in request order; ``on_progress(n)`` reports n more done."""
        ...

    def sync_weights(self) -> None:
        """The one path of weights from learner to engine: after it, the engine samples from the learner's
        current weights (a no-op where the engine decodes with the learner's own module)."""
        ...

    def release_memory(self) -> None:
        """Rollout is over until the next :meth:`sync_weights`; free what can be freed (``vllm`` with ``sleep``:
        KV cache freed, weights offloaded, so a colocated learner has the device). Often a no-op."""
        ...

    def reset(self) -> None:
        """Drop every queued or running request (after an error); the engine stays usable."""
        ...


@runtime_checkable
class SteppedEngine(Engine, Protocol):
    """An engine with the step API, which the ``continuous`` scheduler drives token by token."""

    @property
    def busy(self) -> bool:
        """Requests are queued or decoding."""
        ...

    def add(self, requests: list[GenRequest]) -> list[int]:
        """Queue requests; they join the running batch at the next :meth:`step`. Returns their ids."""
        ...

    def step(self) -> list[tuple[int, GenOutput]]:
        """Advance decoding by one step; returns (id, output) of the requests that finished."""
        ...
