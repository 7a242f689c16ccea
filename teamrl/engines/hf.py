"""``hf`` engine: in-process batched generation with a Hugging Face causal LM.

By default the engine holds a reference to the very module the learner trains, so weight sync is free. With
``dtype=torch.bfloat16`` over an fp32 learner it keeps a bf16 copy instead (about 1.75x faster decoding on a CPU with
AVX-512 bf16) and :meth:`HFEngine.sync_weights` copies the learner's weights into it after every update.

The engine is a small serving loop with a step-level API: :meth:`HFEngine.add` queues requests, :meth:`HFEngine.step`
advances the running batch by one token and returns the requests that finished, and :meth:`HFEngine.generate` is
``add`` + ``step`` until done. The :class:`~teamrl.team.dispatcher.Dispatcher` calls ``step`` itself, so a finished call
resolves at once, its episode runs on, and the episode's next call joins the running batch at the next step
(continuous batching).

Decode loops with the same results (tested):

* the fast loop (:class:`~teamrl.engines.fast_decoder.FastDecoder`, Llama / Mistral / Qwen2 /
  Qwen3 decoders without LoRA), continuous: keys and values live in preallocated
  ``[layers, rows, kv_heads, columns, head_dim]`` buffers, one row per running request, each row
  filled from column 0 with its own length, so requests of any prompt length join between two
  steps. New requests are prefilled by the same
  per-layer code as the decode step (identical prompts once; optionally a prompt prefix shared by
  several requests once, ``share_prefix``); a finished row is replaced by the last row of the
  batch (only that row's cache is copied), so the batch stays dense. Each step runs the model's
  own modules with fused q/k/v and gate/up matmuls (on CPU in bf16 and float32, every linear weight of a
  decode step prepacked for oneDNN, or in float32 for MKL where it is faster) and one attention call per
  layer over each row's filled columns (on CPU the C kernel of :mod:`~teamrl.engines.cpu.attention` where it builds);
  sampling is inverse-CDF over one exp/cumsum pass, which also gives the sampled token's
  log-prob;
* on a CUDA GPU the fast loop runs as the device loop (:mod:`~teamrl.engines.cuda_graphs`): the
  same cache rows and admission, but each decode step has fixed shapes, multiplies by fused weights
  that keep their addresses, samples on the GPU and is replayed as a CUDA graph; only the sampled
  ids and log-probs reach the host. Its cache and graphs stay allocated between rollouts;
* the generic loop over ``model.forward`` with a ``DynamicCache`` (LoRA models, other
  architectures, ``fast=False``), batch-at-a-time: ``step`` takes up to ``max_batch_size``
  queued requests and decodes them to completion (left-padded prompts, one forward per token,
  finished rows dropped every step). Joining mid-flight would need a per-row cache layout that
  ``DynamicCache`` does not have.

Both take per-request temperature / top-p / top-k / max tokens / stop strings / ``ignore_eos``. Each request draws its
``max_new_tokens`` uniform variates from the engine's generator when it is added, and its i-th token is sampled with the
i-th: a request's tokens depend only on the generator state when it was added, not on which other requests share its
batch or when it was admitted. docs/results/speed.md has the measured speeds and a decode-step profile.

On a model with LoRA adapters (``adapters=True``, a PEFT model) one batch mixes the calls of every adapter: each
forward passes ``adapter_names`` (one per row), so the base weights run once for the whole batch and each row adds its
own adapter's low-rank update (one decode loop per adapter would run the base once per adapter and token).
"""

from __future__ import annotations

import copy
import logging
from collections import deque
from collections.abc import Callable
from typing import Literal

import torch

from teamrl.engines.base import GenOutput, GenRequest
from teamrl.engines.cuda_graphs import DeviceLoop
from teamrl.engines.decode_weights import decode_weights
from teamrl.engines.fast_decoder import FastDecoder
from teamrl.engines.generic_loop import Row, decode_rows, hits_stop
from teamrl.engines.prefixes import PrefixStore
from teamrl.engines.sampling import sample
from teamrl.engines.work import Work

log = logging.getLogger(__name__)

AUTO_SHARE_PREFIX = 16
"""``share_prefix="auto"`` (the config's default) on the fast loop: long enough for a chat template's system
prompt, short enough that prompts sharing only a few template tokens are not grouped (docs/results/speed.md)."""


class HFEngine:
    """Batched sampling with log-probs for one in-process ``transformers`` model.

    Args:
        model: a causal LM (shared with the learner; the engine never copies it).
        tokenizer: its tokenizer.
        max_batch_size: most sequences decoded together; further requests wait in a queue.
        seed: seed of the engine's own sampling generator.
        dtype: generate with a copy of ``model`` in this dtype (None: use ``model`` itself).
        adapters: ``model`` is a PEFT model with LoRA adapters; each request's ``adapter`` is used for its row.
        fast: use the preallocated-cache continuous loop where the architecture allows it (see :class:`FastDecoder`);
            False always runs the generic loop over ``model.forward``.
        fuse: the fast loop multiplies by concatenated q/k/v and gate/up weights (the host loop: copies, remade after
            updates; the device loop: :class:`~teamrl.engines.decode_weights.DeviceWeights`, views of the engine's
            own copy or copies refreshed in place).
        pack: with ``fuse``, on CPU in bf16 and float32, decode steps multiply by prepacked copies of every linear
            weight (faster; bit-identical results in bf16, the last bits differ in float32; see
            :class:`~teamrl.engines.decode_weights.DecodeWeights`).
        mkl_pack: with ``pack`` in float32 where the panel product is not used, decode steps whose rows fill the
            top quarter of a bucket (16, 32, ... 256) multiply by MKL-packed copies for that bucket where MKL's
            product times faster there on this CPU (see :meth:`DecodeWeights.for_step
            <teamrl.engines.decode_weights.DecodeWeights.for_step>`); False: oneDNN's prepacked weights only.
        panel: with ``pack`` and ``cpu_kernel`` in float32, every decode step multiplies by copies packed for the C
            library's panel product (:func:`~teamrl.engines.cpu.panel.panel_linear`; x86-64 with AVX2 and FMA),
            its only copy of the step's weights (nothing prepacked for oneDNN or MKL); False: not used.
        cpu_kernel: on CPU, decode steps of the fast loop use :mod:`teamrl.engines.cpu.attention`'s attention kernel
            where it builds (False: torch's ``scaled_dot_product_attention`` kernel).
        fused_step: with ``cpu_kernel`` and ``fuse`` (a Llama-style model with SiLU MLPs), the work between the
            products runs in that kernel's library: in decode steps with ``pack``, rotation + cache write +
            attention, residual add + RMSNorm and ``silu(gate) * up`` as three calls per layer
            (:func:`~teamrl.engines.cpu.fused_step.fused_step`); in prefills,
            residual add + RMSNorm and ``silu(gate) * up``. Results agree with torch's operations to rounding, not
            bit for bit. False: torch's operations.
        share_prefix: the fast loop prefills a token prefix common to several prompts admitted together
            once when it is at least this long, and keeps such prefixes for later calls to copy
            (:class:`~teamrl.engines.prefixes.PrefixStore`, until a parameter changes). 0: off; ``"auto"``:
            :data:`AUTO_SHARE_PREFIX` where the fast loop runs, 0 where it does not (docs/results/speed.md).
        device_loop: the fast loop samples on the model's device and decodes with fixed-shape steps
            (:mod:`~teamrl.engines.cuda_graphs`); None: where the model is on a CUDA GPU.
        cuda_graphs: in the device loop on CUDA, capture each step shape once as a CUDA graph and replay it.
        compile: the device loop's step (forward and sampling) goes through ``torch.compile`` (inductor: the
            elementwise kernels between the matmuls fused) before this module captures it; one compile per step
            shape until automatic dynamic shapes take over (``mode="reduce-overhead"`` skips this step: it writes
            the KV cache, an input). Off by default (``benchmarks/rollout.py --variant compile=1`` measures it).
        overlap: the device loop launches each step before the host handles the previous one's tokens (stop
            checks, outputs, moving finished rows out), so that the GPU is not idle meanwhile; a row that ends
            gets one step computed for nothing. The same tokens as without it; log-probs agree to rounding (a
            step's padded batch can include the rows that end with it). False: launch, wait, handle.
        release_copies: :meth:`release_memory` frees the host loops' decode copies and the rollout copy's parameters
            (``train.release_memory``); False: they stay between rollouts.
    """

    def __init__(self, model, tokenizer, *, max_batch_size: int = 64, seed: int = 0,
                 dtype: torch.dtype | None = None, adapters: bool = False, fast: bool = True,
                 fuse: bool = True, pack: bool = True, mkl_pack: bool = True, panel: bool = True,
                 cpu_kernel: bool = True,
                 fused_step: bool = True,
                 share_prefix: int | Literal["auto"] = 0,
                 device_loop: bool | None = None, cuda_graphs: bool = True, compile: bool = False,
                 overlap: bool = True, release_copies: bool = True) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size {max_batch_size} must be >= 1")
        if share_prefix != "auto" and share_prefix < 0:
            raise ValueError(f"share_prefix {share_prefix} must be >= 0 (0 = off) or auto")
        self.source = model
        own_dtype = next(model.parameters()).dtype
        self.model = model if dtype in (None, own_dtype) else copy.deepcopy(model).to(dtype).eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.adapters = adapters
        self.max_batch_size = max_batch_size
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        eos = {tokenizer.eos_token_id}
        for name in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end|>", "</s>"):
            tid = tokenizer.convert_tokens_to_ids(name)
            if isinstance(tid, int) and tid != tokenizer.unk_token_id:
                eos.add(tid)
        self.stop_ids = {i for i in eos if i is not None}
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.device = next(model.parameters()).device
        self.fuse, self.pack, self.mkl_pack, self.cpu_kernel = fuse, pack, mkl_pack, cpu_kernel
        self.panel = panel and cpu_kernel
        self.fused_step = fused_step
        self._weights_cache: dict = {}  # the fast loop's DecodeWeights, remade when the model changes
        self._fast = FastDecoder.supports(self.model) if fast and not adapters else False
        if share_prefix == "auto":
            share_prefix = AUTO_SHARE_PREFIX if self._fast else 0
        self.share_prefix: int = share_prefix
        # prefixes prefilled earlier with the current weights (the fast loop, share_prefix > 0): copied, not run again
        self._prefix_store = PrefixStore(share_prefix) if self._fast and share_prefix > 0 else None
        if share_prefix and not self._fast:
            log.warning("share_prefix=%d has no effect: this model decodes with the generic loop (LoRA adapters, "
                        "fast=False or an architecture without the fast path)", share_prefix)
        self._queue: deque[Row] = deque()  # added, not yet admitted
        self._rows: list[Row] = []  # the running batch of the fast loop; row j lives in cache row j
        self._dec: FastDecoder | None = None
        self._logits: torch.Tensor | None = None  # [n, V] next-token logits of the running rows
        self._params: tuple | None = None  # per-row sampling tensors of the running batch (rebuilt on change)
        self._next_id = 0
        self.generated_tokens = 0
        """Running count of sampled tokens (progress displays read it: :class:`~teamrl.team.dispatcher.Dispatcher`)."""
        self.unused_tokens = 0
        """Running count of ``max_new_tokens`` left unused by the requests that finished (stopped early)."""
        self.work = Work()  # the time plan's counts (teamrl.engines.work)
        self.cuda_graphs, self.compile, self.overlap = cuda_graphs, compile, overlap
        self.release_copies = release_copies
        self._released = False  # the rollout copy's parameters are freed until the next sync_weights / use
        use_device = self._fast and (self.device.type == "cuda" if device_loop is None else device_loop)
        self._device = DeviceLoop(self) if use_device else None  # its buffers and graphs stay between batches

    @torch.no_grad()
    def sync_weights(self) -> None:
        """Copy the learner's current weights into the engine's copy (a no-op when shared); a copy freed by
        :meth:`release_memory` is made again from them."""
        if self.model is self.source:
            return
        if self._released:
            self._restore()
            return
        with self.work.sync():
            for dst, src in zip(self.model.state_dict().values(), self.source.state_dict().values()):
                dst.copy_(src)

    @torch.no_grad()
    def _restore(self) -> None:
        """Make the rollout copy's parameters again, cast from the learner's current ones."""
        sources = dict(self.source.named_parameters())
        with self.work.sync():
            for name, p in self.model.named_parameters():  # a tied weight once: its modules share the Parameter
                p.data = sources[name].detach().to(p.dtype)
        self._released = False

    def prefix_store(self) -> PrefixStore | None:
        """The store of prefilled prefixes (None without shared prefixes), cleared if the weights changed since it
        was filled (another parameter tensor, or one written in place: an optimizer step, :meth:`sync_weights`)."""
        store = self._prefix_store
        if store is not None:
            store.valid_for(tuple((p.data_ptr(), p._version) for p in self.model.parameters()))
        return store

    def release_memory(self) -> None:
        """Free what the engine holds between rollouts: the device loop's KV cache unless CUDA graphs hold it (the host
        loops drop theirs per batch); with ``release_copies``, in the host loops, the decode copies, kept prefixes and
        the parameters of a rollout copy in another dtype (remade from the learner's weights by :meth:`sync_weights`
        or the next request; SmolLM2-135M in bf16 on a CPU: 0.25 + 0.38 GiB the update would hold beside its state)."""
        if self.busy:
            return
        if self._device is not None and not self.cuda_graphs:
            self._device.graphs = None
        if not self.release_copies or self._device is not None:
            return
        self._weights_cache.clear()
        self._dec = None
        if self._prefix_store is not None:
            self._prefix_store.valid_for(None)
        if self.model is not self.source and not self._released:
            for p in self.model.parameters():
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
            self._released = True

    # ---- step-level API ---------------------------------------------------------------------

    def add(self, requests: list[GenRequest]) -> list[int]:
        """Queue requests; they join the running batch at the next :meth:`step`. Returns their ids."""
        if self._released:  # released without a sync since: the learner's weights have not changed
            self._restore()
        if not self._fast or self._device is not None:  # the host loop counts the tokens its prefills run
            self.work["prefill_tokens"] += sum(len(r.prompt_ids) for r in requests)
        ids = list(range(self._next_id, self._next_id + len(requests)))
        for i, r in zip(ids, requests):
            self._queue.append(Row(i, r, torch.rand(r.sampling.max_new_tokens, generator=self.generator).tolist()))
        self._next_id += len(requests)
        return ids

    @property
    def busy(self) -> bool:
        """Requests are queued or decoding."""
        return bool(self._queue or self._rows)

    def step(self) -> list[tuple[int, GenOutput]]:
        """Admit queued requests, sample one token for every running one; returns (id, output) of those that finished.

        In the generic loop a step decodes one batch of queued requests to completion.
        """
        was_training = self.model.training  # eval() walks every module: only when it changes something
        if was_training:
            self.model.eval()
        before = sum(len(r.tokens) for r in self._rows)
        try:
            with torch.no_grad(), self.work.busy():
                if self._device is not None:
                    done = self._device.step()
                else:
                    done = self._step_fast() if self._fast else self._step_generic()
        finally:
            if was_training:
                self.model.train()
        made = sum(len(r.tokens) for r in self._rows) + sum(len(out.response_ids) for _, out in done) - before
        self.generated_tokens += made
        if self._device is not None or not self._fast:  # the host loop counts its forwards itself
            self.work.decoded(made, done, one_token=self._fast)
        return done

    def reset(self) -> None:
        """Drop every queued and running request (after an error) and free the cache."""
        self._queue.clear()
        self._rows, self._dec, self._logits, self._params = [], None, None, None
        if self._device is not None:
            self._device.reset()

    def generate(self, requests: list[GenRequest], on_progress: Callable[[int], None] | None = None) -> list[GenOutput]:
        """Generate for all requests (``add`` + ``step`` until done); outputs in request order."""
        if self.busy:
            raise RuntimeError("generate() called while requests added with add() are still running; "
                               "step() until busy is False first")
        where = {rid: i for i, rid in enumerate(self.add(requests))}
        outputs: list[GenOutput | None] = [None] * len(requests)
        while self.busy:
            done = self.step()
            for rid, out in done:
                outputs[where[rid]] = out
            if on_progress is not None:  # every step, also with none done: progress displays count tokens
                on_progress(len(done))
        return outputs  # type: ignore[return-value]

    # ---- the fast loop ----------------------------------------------------------------------

    def _step_fast(self) -> list[tuple[int, GenOutput]]:
        self._admit()
        if not self._rows:
            return []
        temps, top_p, top_k, filters = self._sampling_params()
        u = torch.tensor([r.u[len(r.tokens)] for r in self._rows])  # [n]
        if self._logits is None:  # _admit() prefilled every running row
            raise RuntimeError("the fast loop has running rows but no logits; call reset() after an error")
        tok, lp = sample(self._logits, temps, top_p, top_k, None, filters=filters, u=u)  # [n], [n]
        finished: list[int] = []
        for j, (row, t, l) in enumerate(zip(self._rows, tok.tolist(), lp.tolist())):
            row.tokens.append(t)
            row.logps.append(l)
            if self._done(row):
                finished.append(j)
        outputs = [(self._rows[j].id, self._output(self._rows[j])) for j in finished]
        if finished:
            tok = self._drop(finished, tok)
        if not self._rows:  # nothing left: free the cache until the next request
            self._dec, self._logits = None, None
            return outputs
        self.work.forward(len(self._rows), sum(len(r.req.prompt_ids) + len(r.tokens) for r in self._rows))
        self._logits = self._dec.step(tok.to(self.device))  # type: ignore[union-attr]
        return outputs

    def _admit(self) -> None:
        """Prefill queued requests into new cache rows at the end of the running batch."""
        room = self.max_batch_size - len(self._rows)
        if not self._queue or room <= 0:
            return
        new = [self._queue.popleft() for _ in range(min(room, len(self._queue)))]
        if self._dec is None:
            with self.work.sync():  # the decode copies, made again after a weight sync: the sync's work
                weights = decode_weights(self.model, self._weights_cache, self.pack, self.mkl_pack, self.panel) \
                    if self.fuse else None
            self._dec = FastDecoder(self.model, weights, attention_kernel=self.cpu_kernel,
                                    fused_step=self.fused_step, work=self.work)
        self._dec.store = self.prefix_store()
        prompts = [r.req.prompt_ids for r in new]
        logits = self._dec.prefill(prompts, len(self._rows), [r.req.sampling.max_new_tokens for r in new],
                                   share_prefix=self.share_prefix)  # [k, V]
        self._logits = logits if self._logits is None or not self._rows else torch.cat([self._logits, logits])
        self._rows += new
        self._params = None

    def _compact(self, finished: list[int]) -> tuple[list[int], list[int]]:
        """Remove finished rows from ``_rows``: the last running rows take their places. Returns (src, dst):
        the rows that moved and where to, for the caller to move their cache rows and per-row tensors."""
        n = len(self._rows)
        gone = set(finished)
        keep_n = n - len(gone)
        src = [j for j in range(keep_n, n) if j not in gone]  # running rows past the new end
        dst = [j for j in finished if j < keep_n]  # holes inside the new batch
        for a, b in zip(src, dst):
            self._rows[b] = self._rows[a]
        self._rows = self._rows[:keep_n]
        self._params = None
        return src, dst

    def _drop(self, finished: list[int], tok: torch.Tensor) -> torch.Tensor:
        """Remove finished rows (their cache rows are overwritten by the moved ones); returns the running rows' tokens."""
        src, dst = self._compact(finished)
        if src:
            self._dec.move(src, dst)  # type: ignore[union-attr]
            tok[torch.tensor(dst)] = tok[torch.tensor(src)]
        return tok[: len(self._rows)]

    def _sampling_params(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
        if self._params is None:
            s = [r.req.sampling for r in self._rows]
            top_p, top_k = torch.tensor([x.top_p for x in s]), torch.tensor([x.top_k for x in s])
            self._params = (torch.tensor([x.temperature for x in s]), top_p, top_k, bool((top_p < 1).any() or (top_k > 0).any()))
        return self._params

    def _done(self, row: Row) -> bool:
        """Whether ``row`` ends with its last token (sets its finish reason)."""
        s = row.req.sampling
        if not s.ignore_eos:
            # The end-of-turn token is kept: the learner trains on it, so the model learns to stop.
            if row.tokens[-1] in self.stop_ids or (s.stop and hits_stop(self.tokenizer, row.tokens, s.stop)):
                row.finish = "stop"
                return True
        return len(row.tokens) >= s.max_new_tokens

    def _output(self, row: Row) -> GenOutput:
        self.unused_tokens += row.req.sampling.max_new_tokens - len(row.tokens)
        return GenOutput(row.tokens, row.logps, self.tokenizer.decode(row.tokens, skip_special_tokens=True), row.finish)

    # ---- the generic loop -------------------------------------------------------------------

    def _step_generic(self) -> list[tuple[int, GenOutput]]:
        rows = [self._queue.popleft() for _ in range(min(self.max_batch_size, len(self._queue)))]
        if not rows:
            return []
        self._rows = rows  # so that busy stays True while decoding (and reset() can clear it)
        try:
            decode_rows(self.model, rows, pad_id=self.pad_id, device=self.device, adapters=self.adapters, done=self._done)
        finally:
            self._rows = []
        return [(r.id, self._output(r)) for r in rows]
