"""The ``hf`` engine's device loop: decode steps with sampling on the model's device, replayed as CUDA graphs.

On a GPU the fast loop's cost is the host, not the GPU: a 30-layer decode step launches a few
hundred small kernels from Python, and sampling on the host copies ``[rows x vocabulary]`` logits
out every step. The device loop instead runs one step as

* :meth:`~teamrl.engines.fast_decoder.FastDecoder.decode_static`: the forward of rows ``0 .. b-1``
  over cache columns ``0 .. cols-1`` (shapes fixed by ``(b, cols)``, no host synchronisation);
* :func:`~teamrl.engines.sampling.sample_rows`: temperature / top-p / top-k sampling and the
  sampled token's log-prob, per row, from the uniform variates the engine drew when the request
  was added (so results do not depend on the batch, as on the host);

and on CUDA captures that pair once per ``(b, cols, top-k on, top-p on)`` as a CUDA graph and
replays it. ``b`` is the running batch rounded up to a power of two and ``cols`` the longest row
rounded up to 128 x a power of two, so a handful of graphs serve a whole rollout; padding rows
(``n .. b-1``) write only into free cache rows. Only the sampled token ids and their log-probs
cross to the host (one copy of ``2 x n`` numbers per step).

A graph reads the cache, the parameters and the sampling buffers at the addresses it was captured
with. Weight updates keep those addresses (the optimizer and :meth:`HFEngine.sync_weights
<teamrl.engines.hf.HFEngine.sync_weights>` write in place), so the weight sync stays free; when
any address changes (a reallocated cache, parameters replaced) the graphs are dropped and
captured again (:meth:`DecodeGraphs.valid`).
"""

from __future__ import annotations

import logging

import torch

from teamrl.engines.fast_decoder import FastDecoder
from teamrl.engines.sampling import sample_rows

log = logging.getLogger(__name__)

COLUMN_STEP = 128


def batch_bucket(n: int) -> int:
    """The graph batch size for ``n`` running rows: the next power of two.

    >>> [batch_bucket(n) for n in (1, 3, 8, 9, 100)]
    [1, 4, 8, 16, 128]
    """
    return 1 << max(0, n - 1).bit_length()


def column_bucket(cols: int, capacity: int | None = None) -> int:
    """Columns for a longest row of ``cols`` tokens: 128 x the next power of two, at most ``capacity``.

    >>> [column_bucket(c, 4096) for c in (1, 128, 129, 600, 5000)]
    [128, 128, 256, 1024, 4096]
    """
    b = COLUMN_STEP
    while b < cols:
        b *= 2
    return b if capacity is None else min(b, capacity)


class DecodeGraphs:
    """Static buffers and captured graphs of the device loop for one :class:`FastDecoder` (see the module doc).

    ``tok`` holds each running row's last sampled token, which is the next step's input: a step
    reads ``tok[:b]`` and writes the new tokens back into it, with their log-probs in ``lp``.
    """

    def __init__(self, dec: FastDecoder, rows: int, *, capture: bool) -> None:
        dev = dec.device
        self.dec, self.rows = dec, rows
        self.capture = capture and dev.type == "cuda"
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
        return (d.k.data_ptr(), d.v.data_ptr(), d.lens.data_ptr(), *(p.data_ptr() for p in d.model.parameters()))

    def valid(self) -> bool:
        """Whether the cache and every parameter still live where the graphs were captured."""
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

    def step(self, n: int, longest: int, u: list[float], use_top_k: bool,
             use_top_p: bool) -> tuple[list[int], list[float]]:
        """Feed ``tok[:n]`` to rows ``0 .. n-1`` (the longest holding ``longest`` tokens), sample their next
        tokens with variates ``u``; returns (tokens, log-probs) on the host and advances the rows' lengths."""
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
        return self._fetch(0, n)

    def _body(self, b: int, cols: int, use_top_k: bool, use_top_p: bool) -> None:
        logits = self.dec.decode_static(self.tok[:b], cols)
        tok, lp = sample_rows(logits, self.temps[:b], self.top_p[:b], self.top_k[:b], self.u[:b],
                                   use_top_k=use_top_k, use_top_p=use_top_p)
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
        """Rows ``src`` take the places ``dst`` (their next-input tokens follow them; the cache is moved by the
        decoder)."""
        s = torch.tensor(src, device=self.tok.device)
        d = torch.tensor(dst, device=self.tok.device)
        self.tok[d] = self.tok[s]
