"""The ``hf`` engine's device loop: decode steps with sampling on the model's device, replayed as CUDA graphs.

On a GPU the fast loop's cost is the host, not the GPU: a 30-layer decode step launches a few
hundred small kernels from Python, and sampling on the host copies ``[rows x vocabulary]`` logits
out every step. The device loop instead runs one step as

* :func:`decode_static`: the forward of rows ``0 .. b-1``
  over cache columns ``0 .. cols-1`` (shapes fixed by ``(b, cols)``, no host synchronisation);
* :func:`~teamrl.engines.sampling.sample_rows`: temperature / top-p / top-k sampling and the
  sampled token's log-prob, per row, from the uniform variates the engine drew when the request
  was added (so results do not depend on the batch, as on the host);

and on CUDA captures that pair once per ``(b, cols, top-k on, top-p on)`` as a CUDA graph and
replays it. ``b`` is the running batch rounded up to a power of two and ``cols`` the longest row
rounded up to a column bucket (:func:`column_bucket`), so a handful of graphs serve a whole rollout;
padding rows (``n .. b-1``) write only into free cache rows. The step multiplies by fused q/k/v and
gate/up weights (:class:`~teamrl.engines.decode_weights.DeviceWeights`); with ``compile`` it goes
through ``torch.compile`` first, so that inductor's fused kernels are what the graph replays. Only
the sampled token ids and their log-probs cross to the host (one copy of ``2 x n`` numbers per step).

:class:`DeviceLoop` drives it for :class:`~teamrl.engines.hf.HFEngine`: admission into free cache rows,
one step per engine call, finished rows moved out. With ``overlap`` (the default) each call launches the
next step before the host handles the current tokens (stop checks, outputs, moves), so the GPU does
not wait for the host between steps.

A graph reads the cache, the parameters, the fused weights and the sampling buffers at the addresses it
was captured with. Weight updates keep those addresses (the optimizer and :meth:`HFEngine.sync_weights
<teamrl.engines.hf.HFEngine.sync_weights>` write in place), so the weight sync stays free; when
any address changes (a reallocated cache, parameters replaced) the graphs are dropped and
captured again (:meth:`DecodeGraphs.valid`).
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, Protocol, cast

import torch
import torch.nn.functional as F

from teamrl.engines.base import GenOutput
from teamrl.engines.decode_weights import DeviceWeights
from teamrl.engines.fast_decoder import FastDecoder
from teamrl.engines.generic_loop import Row
from teamrl.engines.layer_ops import call_module, rms_norm
from teamrl.engines.prefixes import PrefixStore
from teamrl.engines.sampling import sample_rows

log = logging.getLogger(__name__)


class LoopEngine(Protocol):
    """What the device loop uses of its engine (:class:`teamrl.engines.hf.HFEngine`, which builds the loop; typed
    here so that this module does not import it back): its model and settings, its queue and running rows, and
    how it finishes a row."""

    @property
    def model(self) -> Any: ...
    @property
    def source(self) -> Any: ...
    @property
    def fuse(self) -> bool: ...
    @property
    def overlap(self) -> bool: ...
    @property
    def compile(self) -> bool: ...
    @property
    def cuda_graphs(self) -> bool: ...
    @property
    def max_batch_size(self) -> int: ...
    @property
    def share_prefix(self) -> int: ...
    _queue: deque[Row]
    _rows: list[Row]

    def prefix_store(self) -> PrefixStore | None: ...
    def _compact(self, finished: list[int]) -> tuple[list[int], list[int]]: ...
    def _done(self, row: Row) -> bool: ...
    def _output(self, row: Row) -> GenOutput: ...


COLUMN_STEP = 128


def decode_static(dec: FastDecoder, tok: torch.Tensor, cols: int) -> torch.Tensor:
    """One decode step of the fast loop ``dec``'s rows ``0 .. b-1`` (b = len(tok)) attending over cache columns
    ``0 .. cols-1``, with shapes fixed by (b, cols) and no host synchronisation, so that a CUDA graph can capture it
    (see :class:`DecodeGraphs`). Returns next-token logits [b, V] (model dtype).

    Each row writes its keys and values at column ``lens[row]`` (clamped to ``cols - 1``: rows past the
    running ones are padding, their columns are free and rewritten by the next prefill) and sees the
    columns ``<= lens[row]``; ``lens`` is not advanced (the caller advances the running rows).
    """
    b = tok.shape[0]
    C, D, dev = dec.k.shape[3], dec.head_dim, tok.device
    g = dec.n_heads // dec.n_kv
    pos = dec.lens[:b].clamp(max=cols - 1).view(b, 1)  # [b, 1]
    h = dec.inner.embed_tokens(tok.view(b, 1))  # [b, 1, H]
    cos, sin = dec.inner.rotary_emb(h, pos)
    cos, ssin = cos[:, :, None], torch.cat([-sin[..., : D // 2], sin[..., D // 2 :]], -1)[:, :, None]
    flat = (torch.arange(b, device=dev)[:, None] * dec.n_kv + torch.arange(dec.n_kv, device=dev)) * C + pos
    mask = torch.zeros((b, 1, 1, cols), dtype=dec.dtype, device=dev).masked_fill_(
        (torch.arange(cols, device=dev) > pos)[:, None, None, :], -torch.inf)  # [b, 1, 1, cols] additive
    norm = rms_norm if dec.exact_norm else call_module
    for i, layer in enumerate(dec.inner.layers):
        q, k, v = dec._qkv(i, layer, norm(layer.input_layernorm, h), cos, ssin, None)
        dec.k[i].view(-1, D).index_put_((flat,), k[:, 0])
        dec.v[i].view(-1, D).index_put_((flat,), v[:, 0])
        o = F.scaled_dot_product_attention(q.view(b, dec.n_kv, g, D), dec.k[i, :b, :, :cols],
                                           dec.v[i, :b, :, :cols], attn_mask=mask, scale=dec.scale)
        h = h + layer.self_attn.o_proj(o.reshape(b, 1, dec.n_heads * D))
        h = h + dec._mlp(i, layer, norm(layer.post_attention_layernorm, h), None)
    return dec.model.lm_head(norm(dec.inner.norm, h)[:, -1])


def batch_bucket(n: int) -> int:
    """The graph batch size for ``n`` running rows: the next power of two.

    >>> [batch_bucket(n) for n in (1, 3, 8, 9, 100)]
    [1, 4, 8, 16, 128]
    """
    return 1 << max(0, n - 1).bit_length()


def column_bucket(cols: int, capacity: int | None = None) -> int:
    """Columns for a longest row of ``cols`` tokens, at most ``capacity``: multiples of 128 up to 512, then
    half-octave steps (768, 1024, 1536, 2048, ...). A step reads every bucket column of the cache; past 256
    columns a bucket is less than 1.5x the filled ones (power-of-two buckets: up to 2x), for about twice as
    many graphs.

    >>> [column_bucket(c, 4096) for c in (1, 128, 129, 300, 600, 1100, 5000)]
    [128, 128, 256, 384, 768, 1536, 4096]
    """
    step = max(COLUMN_STEP, 1 << max(0, (max(cols, 1) - 1).bit_length() - 2))
    b = max(COLUMN_STEP, -(-cols // step) * step)
    return b if capacity is None else min(b, capacity)


def _step(dec: FastDecoder, tok: torch.Tensor, temps: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
          u: torch.Tensor, cols: int, use_top_k: bool, use_top_p: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One device-loop step of rows ``0 .. len(tok)-1``: the forward over ``cols`` cache columns, then sampling."""
    logits = decode_static(dec, tok, cols)
    return sample_rows(logits, temps, top_p, top_k, u, use_top_k=use_top_k, use_top_p=use_top_p)


class DecodeGraphs:
    """Static buffers and captured graphs of the device loop for one :class:`FastDecoder` (see the module doc).

    ``tok`` holds each running row's last sampled token, which is the next step's input: a step
    reads ``tok[:b]`` and writes the new tokens back into it, with their log-probs in ``lp``.
    """

    def __init__(self, dec: FastDecoder, rows: int, *, capture: bool, compile: bool = False) -> None:
        dev = dec.device
        self.dec, self.rows = dec, rows
        self.capture = capture and dev.type == "cuda"
        self.fn = torch.compile(_step) if compile else _step
        self.tok = torch.zeros(rows, dtype=torch.long, device=dev)
        self.lp = torch.zeros(rows, dtype=torch.float32, device=dev)
        self.u = torch.zeros(rows, dtype=torch.float32, device=dev)
        self.temps = torch.ones(rows, dtype=torch.float32, device=dev)
        self.top_p = torch.ones(rows, dtype=torch.float32, device=dev)
        self.top_k = torch.zeros(rows, dtype=torch.long, device=dev)
        self.graphs: dict[tuple[int, int, bool, bool], torch.cuda.CUDAGraph] = {}
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        self.stream = torch.cuda.Stream(dev) if self.capture else None
        self.layout = self._layout()

    def _layout(self) -> tuple[int, ...]:
        d = self.dec
        fused = d.weights.tensors() if isinstance(d.weights, DeviceWeights) else []
        return (d.k.data_ptr(), d.v.data_ptr(), d.lens.data_ptr(), *(p.data_ptr() for p in d.model.parameters()),
                *(t.data_ptr() for t in fused))

    def valid(self) -> bool:
        """Whether the cache, every parameter and the fused weights still live where the graphs were captured."""
        return self._layout() == self.layout

    def set_sampling(self, temps: list[float], top_p: list[float], top_k: list[int]) -> None:
        """Per-row sampling settings of rows ``0 .. n-1`` (copied to the device)."""
        n = len(temps)
        self.temps[:n].copy_(torch.tensor(temps, dtype=torch.float32), non_blocking=True)
        self.top_p[:n].copy_(torch.tensor(top_p, dtype=torch.float32), non_blocking=True)
        self.top_k[:n].copy_(torch.tensor(top_k, dtype=torch.long), non_blocking=True)

    def sample_new(self, logits: torch.Tensor, first: int, u: list[float], use_top_k: bool,
                   use_top_p: bool) -> tuple[list[int], list[float]]:
        """Sample the first token of rows ``first .. first+k-1`` from their prefill logits [k, V] (eagerly);
        returns them on the host and leaves them in ``tok`` as those rows' next input."""
        k = logits.shape[0]
        end = first + k
        self.u[first:end].copy_(torch.tensor(u, dtype=torch.float32), non_blocking=True)
        tok, lp = sample_rows(logits, self.temps[first:end], self.top_p[first:end], self.top_k[first:end],
                                   self.u[first:end], use_top_k=use_top_k, use_top_p=use_top_p)
        self.tok[first:end] = tok
        self.lp[first:end] = lp
        return self._fetch(first, end)

    def launch(self, n: int, longest: int, u: list[float], use_top_k: bool, use_top_p: bool) -> None:
        """Feed ``tok[:n]`` to rows ``0 .. n-1`` (the longest holding ``longest`` tokens) and sample their next
        tokens with variates ``u`` into ``tok`` / ``lp``, without waiting for the GPU; advances the rows' lengths.
        :meth:`fetch` reads the results."""
        b = min(batch_bucket(n), self.rows)
        cols = column_bucket(longest + 1, self.dec.k.shape[3])
        self.u[:n].copy_(torch.tensor(u, dtype=torch.float32), non_blocking=True)
        key = (b, cols, use_top_k, use_top_p)
        if not self.capture:
            self._body(*key)
        elif key in self.graphs:
            self.graphs[key].replay()
        else:
            self._capture(key)
        self.dec.lens[:n] += 1

    def fetch(self, n: int) -> tuple[list[int], list[float]]:
        """The tokens and log-probs in rows ``0 .. n-1`` on the host (waits for the launched step)."""
        return self._fetch(0, n)

    def _body(self, b: int, cols: int, use_top_k: bool, use_top_p: bool) -> None:
        tok, lp = self.fn(self.dec, self.tok[:b], self.temps[:b], self.top_p[:b], self.top_k[:b], self.u[:b], cols,
                          use_top_k, use_top_p)
        self.tok[:b].copy_(tok)
        self.lp[:b].copy_(lp)

    def _capture(self, key: tuple[int, int, bool, bool]) -> None:
        """Run the step once eagerly on a side stream (its results are this step's; it also warms up the
        libraries' lazy state, as capture requires), then capture it for later replays."""
        assert self.stream is not None
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            self._body(*key)
        torch.cuda.current_stream().wait_stream(self.stream)
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g, pool=self.pool, stream=self.stream):
                self._body(*key)
        except RuntimeError as exc:  # an op of this model that cannot be captured: decode eagerly from now on
            log.warning("hf engine: decode steps could not be captured as a CUDA graph (%s); running them "
                        "kernel by kernel (models.<name>.cuda_graphs: false silences this)", str(exc).splitlines()[0])
            self.capture = False
            return
        self.graphs[key] = g

    def _fetch(self, first: int, end: int) -> tuple[list[int], list[float]]:
        """Tokens and log-probs of rows ``first .. end-1`` on the host (one synchronising copy)."""
        both = torch.stack([self.tok[first:end].double(), self.lp[first:end].double()]).cpu()
        return [int(t) for t in both[0].tolist()], both[1].tolist()

    def move(self, src: list[int], dst: list[int]) -> None:
        """Rows ``src`` take the places ``dst`` (their next-input tokens and log-probs follow them, also those of a
        launched step not fetched yet; the cache is moved by the decoder)."""
        s = torch.tensor(src, device=self.tok.device)
        d = torch.tensor(dst, device=self.tok.device)
        self.tok[d] = self.tok[s]
        self.lp[d] = self.lp[s]


class DeviceLoop:
    """The ``hf`` engine's device loop over the engine's queue and running rows (``engine._rows``; row ``j`` lives in
    cache row ``j``): admission into free rows, one fixed-shape step per call through :class:`DecodeGraphs`, the
    sampled tokens handed back to the rows, finished rows moved out.

    With ``engine.overlap`` a call launches the next step *before* it hands this step's tokens to the rows
    (stop checks, outputs, moving finished rows out), so the GPU computes while the host works: the next call
    fetches that step's results. A row that ends gets one step computed for nothing, dropped with it.
    """

    def __init__(self, engine: LoopEngine) -> None:
        self.engine = engine
        self.weights: DeviceWeights | None = None  # fused weights (engine.fuse), made once
        self.graphs: DecodeGraphs | None = None  # buffers and graphs, kept between batches
        self.pending: tuple[list[int], list[float]] = ([], [])  # each running row's next token and its log-prob
        self.inflight = False  # a launched step's results wait in the buffers (overlap)
        self.flags: tuple[bool, bool] | None = None  # (any top-k, any top-p) of the rows; None: settings to copy

    def reset(self) -> None:
        """Forget the running batch (the engine dropped its rows) and the graphs."""
        self.graphs, self.pending, self.inflight, self.flags = None, ([], []), False, None

    def step(self) -> list[tuple[int, GenOutput]]:
        """Admit queued requests, hand every running row its next token; returns (id, output) of those that ended."""
        eng = self.engine
        if self.inflight:  # the step launched by the previous call: its tokens are the ones to hand out now
            self.pending = cast(DecodeGraphs, self.graphs).fetch(len(eng._rows))
            self.inflight = False
        self._admit()
        rows = eng._rows
        if not rows:
            return []
        graphs = cast(DecodeGraphs, self.graphs)
        if eng.overlap:
            self._launch(graphs, ahead=1)
            self.inflight = True
        finished: list[int] = []
        for j, (row, t, l) in enumerate(zip(rows, *self.pending)):
            row.tokens.append(t)
            row.logps.append(l)
            if eng._done(row):
                finished.append(j)
        outputs = [(rows[j].id, eng._output(rows[j])) for j in finished]
        if finished:
            self._drop(finished)
        if not eng._rows:
            self.pending, self.inflight = ([], []), False
            return outputs
        if not eng.overlap:
            self._launch(graphs, ahead=0)
            self.pending = graphs.fetch(len(eng._rows))
        return outputs

    def _launch(self, graphs: DecodeGraphs, ahead: int) -> None:
        """Launch the step that samples each running row's token number ``len(tokens) + ahead`` (``ahead`` 1: the
        pending tokens are not handed out yet; a row that ends with its pending token gets variate 0.5 for a
        step whose results are dropped)."""
        rows = self.engine._rows
        top_k, top_p = self._sampling(graphs)
        longest = max(len(r.req.prompt_ids) + len(r.tokens) - 1 for r in rows) + ahead  # filled columns
        u = [r.u[i] if (i := len(r.tokens) + ahead) < len(r.u) else 0.5 for r in rows]
        graphs.launch(len(rows), longest, u, top_k, top_p)

    def _admit(self) -> None:
        """Prefill queued requests into free rows and sample their first tokens on the device."""
        eng = self.engine
        room = eng.max_batch_size - len(eng._rows)
        if not eng._queue or room <= 0:
            return
        new = [eng._queue.popleft() for _ in range(min(room, len(eng._queue)))]
        prompts = [r.req.prompt_ids for r in new]
        max_new = [r.req.sampling.max_new_tokens for r in new]
        need = FastDecoder.columns_for(prompts, max_new)
        rows = batch_bucket(eng.max_batch_size)
        # Parameters cannot change while rows are decoding: they are checked when a batch starts.
        if not eng._rows and self.weights is not None:
            self.weights.refresh()
        if self.graphs is None or need > self.graphs.dec.k.shape[3] or (not eng._rows and not self.graphs.valid()):
            if self.graphs is not None:
                dec = self.graphs.dec
            else:  # first batch, or after reset(): the fused weights are kept (made once)
                if eng.fuse and self.weights is None:
                    self.weights = DeviceWeights(eng.model, own=eng.model is not eng.source)
                dec = FastDecoder(eng.model, self.weights)
            dec.reserve(rows, column_bucket(need))  # grows the cache only where needed (new addresses: recapture)
            old = self.graphs
            self.graphs = DecodeGraphs(dec, rows, capture=eng.cuda_graphs, compile=eng.compile)
            if old is not None and eng._rows:  # running rows keep their next-input tokens
                self.graphs.tok.copy_(old.tok)
        first = len(eng._rows)
        self.graphs.dec.store = eng.prefix_store()
        logits = self.graphs.dec.prefill(prompts, first, max_new, share_prefix=eng.share_prefix)  # [k, V]
        eng._rows += new
        self.flags = None
        top_k, top_p = self._sampling(self.graphs)
        tok, lp = self.graphs.sample_new(logits, first, [r.u[0] for r in new], top_k, top_p)
        self.pending = (self.pending[0] + tok, self.pending[1] + lp)

    def _sampling(self, graphs: DecodeGraphs) -> tuple[bool, bool]:
        """Copy the running rows' sampling settings to the device when they changed; (any top-k, any top-p)."""
        if self.flags is None:
            s = [r.req.sampling for r in self.engine._rows]
            graphs.set_sampling([x.temperature for x in s], [x.top_p for x in s], [x.top_k for x in s])
            self.flags = (any(x.top_k > 0 for x in s), any(x.top_p < 1 for x in s))
        return self.flags

    def _drop(self, finished: list[int]) -> None:
        """Remove finished rows; the moved rows' cache, next-input tokens and log-probs follow them."""
        eng = self.engine
        src, dst = eng._compact(finished)
        self.flags = None
        if src:
            graphs = cast(DecodeGraphs, self.graphs)
            # filled columns from the host's count (+1: a launched step's), so the GPU need not be waited for
            cols = max(len(eng._rows[j].req.prompt_ids) + len(eng._rows[j].tokens) for j in dst) + 1
            graphs.dec.move(src, dst, cols)
            graphs.move(src, dst)
