"""The weights the ``hf`` engine's fast decode loop (:mod:`teamrl.engines.fast_decoder`) multiplies by:
fused q/k/v and gate/up copies and, on CPU, oneDNN-prepacked copies of every linear of a decode step,
remade when the model's weights change (the CPU products themselves: :mod:`teamrl.engines.cpu.products`)."""

from __future__ import annotations

import logging
import platform
from typing import Any

import torch

from teamrl.engines.cpu import attention as cpu_attention
from teamrl.engines.cpu import panel as panel_product
from teamrl.engines.cpu.panel import PanelWeight
from teamrl.engines.cpu.products import (  # noqa: F401  (the products' names stay importable from here)
    MKL_BUCKETS,
    PACK_MAX_ROWS,
    MklWeight,
    _float32_pack_works,
    _mkl_pack_works,
    _step_weights,
    mkl_linear,
    mkl_pack,
    packed_linear,
    pick_product,
    time_step_linears,
)

log = logging.getLogger(__name__)


class DecodeWeights:
    """The weights the fast loop multiplies by, prepared once per model version.

    ``fused[i]``: layer ``i``'s concatenated q/k/v weight (and bias) and concatenated gate/up
    weight (None if the MLP differs): one matmul instead of three (five with the MLP) per layer.
    ``packed``: on CPU in bf16 (where oneDNN supports it) and in float32 (x86-64), every linear of a
    decode step prepacked into oneDNN's blocked layout: per layer (q/k/v, o, gate/up or None, down or
    None), then the lm_head. A plain ``F.linear`` lays the weight out again on every call; at decode
    batch sizes that costs as much as the product (docs/results/speed.md). In bf16, for the batch
    sizes of a decode step (<= 256 rows), the prepacked product is bit-identical to ``F.linear``. In
    float32 oneDNN sums in another order than the BLAS behind ``F.linear`` (each product agrees with
    float64 to 1e-6 relative, the engine samples the same tokens with log-probs within 1e-5; tested), so a float32 decode step of more than 256 rows, which uses ``F.linear``,
    can differ from a smaller one in the last bits. Prefills (many rows, where oneDNN picks other
    kernels) keep ``fused``. In float32, where the C library has its panel product (``lib``), every decode step
    multiplies by copies packed for it instead and nothing is prepacked for oneDNN (``packed`` None): one copy of
    the step's weights, not two or three; elsewhere steps of some row counts multiply by MKL-packed copies
    (:meth:`for_step`).
    """

    def __init__(self, fused: list, packed: list | None, head: torch.Tensor | None, model=None,
                 mkl: bool = False, lib=None) -> None:
        self.fused, self.packed, self.head = fused, packed, head
        self.model = model
        self.mkl = mkl  # float32: also try MKL-packed copies per row bucket (see for_step)
        self.lib = lib  # float32: the C library whose panel product every decode step uses (None: not used)
        self._buckets: dict[int, tuple[list, MklWeight] | None] = {}  # bucket -> MKL copies; None: tried, not used
        self._panel: tuple[list, PanelWeight] | None = None  # the panel-packed copies, made at the first step
        self._setup: tuple | None = None  # what the per-process choices are keyed by, besides the thread count

    def for_step(self, rows: int) -> tuple[list | None, Any]:
        """The prepacked weights a decode step of ``rows`` rows multiplies by: per layer (q/k/v, o, gate/up, down),
        and the lm_head's; (None, None) where nothing is prepacked for that many rows.

        In float32 with the C library's panel product (``lib``, :func:`~teamrl.engines.cpu.panel.panel_linear`):
        its copies, for every row count up to :data:`PACK_MAX_ROWS`, made once per model version. It timed fastest
        at most bucket sizes on the CPUs measured, and keeping it alone keeps one copy of the step's weights
        instead of oneDNN's, MKL's and its own (docs/memory.md).

        Otherwise, in float32, MKL's packed product (``mkl``) can be picked per bucket of row counts (16, 32, 64, 128
        or 256: a step's rows round up to one) by a timing of a whole step's products at the bucket's row count on
        this model's weights, at first use (once per process, bucket, thread count and shapes;
        docs/results/speed.md), for steps in the top quarter of the bucket (``3/4 * bucket < rows <= bucket``),
        their input padded to the bucket's rows: MKL's kernel for a packed weight is fixed by the row count it was
        packed for. It is picked where it timed at least 5% faster than oneDNN's prepacked product. At most one
        bucket's copies are kept (one more copy of the weights); each bucket is packed at most once per model
        version.
        """
        if rows > PACK_MAX_ROWS:
            return None, None
        if self.lib is not None:
            return self._panel_copies()
        if self.packed is None:
            return None, None
        if not self.mkl:
            return self.packed, self.head
        bucket = next(b for b in MKL_BUCKETS if b >= rows)
        top, low = self._choose(bucket)
        pick = top if 4 * rows > 3 * bucket else low
        if pick == "mkl":
            got = self._mkl_copies(bucket)
            if got is not None:
                return got
        return self.packed, self.head

    def _choose(self, bucket: int) -> tuple[str, str]:
        """The product for the top quarter of ``bucket`` and for its other row counts (timed at first use)."""
        if self._setup is None:
            layers = self.model.model.layers
            self._setup = (self.mkl, self.lib is not None, len(layers), tuple(self.model.lm_head.weight.shape),
                           tuple(w.shape for w in _step_weights(layers[0], self.fused[0]) if w is not None))
        choices = _CHOICE.setdefault((torch.get_num_threads(), *self._setup), {})
        if bucket not in choices:
            assert self.packed is not None  # for_step returned earlier otherwise
            cands: dict[str, tuple[list, Any]] = {"oneDNN": (self.packed, self.head)}
            if self.mkl:
                cands["mkl"] = self._mkl_copies(bucket) or self._mkl_make(bucket)
            times = time_step_linears(cands, self.model, self.fused, bucket)
            choices[bucket] = pick_product(times)
            log.info("decode linears at %d rows: %s: %s for the top quarter of the bucket, %s below", bucket,
                     ", ".join(f"{n} {t * 1e3:.1f} ms" for n, t in times.items()), *choices[bucket])
        top, low = choices[bucket]
        if top != "mkl" and self._buckets.get(bucket) is not None:
            self._buckets[bucket] = None
        return top, low

    def _mkl_copies(self, bucket: int) -> tuple[list, MklWeight] | None:
        """MKL's copies for ``bucket`` (made on first use, replacing another bucket's); None once dropped."""
        if bucket not in self._buckets:
            for b, kept in self._buckets.items():  # keep one bucket's copies at a time
                if kept is not None:
                    self._buckets[b] = None
            self._buckets[bucket] = self._mkl_make(bucket)
        return self._buckets[bucket]

    def _mkl_make(self, bucket: int) -> tuple[list, MklWeight]:
        with torch.no_grad():
            packed = [tuple(None if w is None else mkl_pack(w, bucket) for w in _step_weights(layer, f))
                      for layer, f in zip(self.model.model.layers, self.fused)]
            return packed, mkl_pack(self.model.lm_head.weight, bucket)

    def _panel_copies(self) -> tuple[list, PanelWeight]:
        if self._panel is None:
            lib = self.lib
            with torch.no_grad():
                packed = [tuple(None if w is None else panel_product.panel_pack(lib, w) for w in _step_weights(layer, f))
                          for layer, f in zip(self.model.model.layers, self.fused)]
                self._panel = packed, panel_product.panel_pack(lib, self.model.lm_head.weight)
        return self._panel

    @staticmethod
    def can_pack(model) -> bool:
        p = next(model.parameters())
        if p.device.type != "cpu" or not torch.backends.mkldnn.is_available():
            return False
        if p.dtype == torch.bfloat16:
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        return p.dtype == torch.float32 and platform.machine() in ("x86_64", "AMD64") and _float32_pack_works()

    @staticmethod
    def can_mkl_pack(model) -> bool:
        """MKL's packed float32 product runs here (float32 on an x86-64 CPU with MKL) and agrees with ``F.linear``."""
        p = next(model.parameters())
        return p.device.type == "cpu" and p.dtype == torch.float32 and _mkl_pack_works()


# (threads, candidates, shapes) -> bucket -> the products timed fastest here: (top quarter of the bucket, below it)
_CHOICE: dict[tuple, dict[int, tuple[str, str]]] = {}


def decode_weights(model, cache: dict, pack: bool = False, mkl: bool = True, panel: bool = False) -> DecodeWeights:
    """The fast loop's weights (see :class:`DecodeWeights`), remade when a source weight changed. ``panel``: with
    ``pack`` in float32, decode steps multiply by copies for the C library's panel product
    (:mod:`~teamrl.engines.cpu.attention`, loaded and built if needed) and nothing is prepacked for oneDNN or MKL;
    where it has none (or ``panel`` is False), oneDNN's prepacked copies, and with ``mkl`` MKL's per row bucket.

    Changes in place (an optimizer step, :meth:`HFEngine.sync_weights`) are detected by the tensors'
    version counters and storage addresses; ``cache`` (the engine's) holds the last copies.
    """
    layers = model.model.layers
    pack = pack and DecodeWeights.can_pack(model)
    srcs = []
    for layer in layers:
        a, m = layer.self_attn, layer.mlp
        srcs += [t for g in fused_groups(layer) if g is not None for t in group_parts(g)]
        if pack:
            srcs += [a.o_proj.weight] + ([m.down_proj.weight] if gated_mlp(m) else [])
    if pack:
        srcs.append(model.lm_head.weight)
    lib = cpu_attention.load() if pack and panel and next(model.parameters()).dtype == torch.float32 else None
    lib = lib if lib is not None and panel_product.available(lib) else None
    mkl = pack and mkl and lib is None and DecodeWeights.can_mkl_pack(model)
    key = (pack, mkl, lib is not None) + tuple(t._version for t in srcs) + tuple(t.data_ptr() for t in srcs)
    if cache.get("key") == key:
        return cache["weights"]
    cache.clear()  # free the old copies before making new ones
    fused: list[Any] = []
    packed: list[Any] | None = [] if pack and lib is None else None  # the panel product's copies are made on use
    reorder = torch.ops.mkldnn._reorder_linear_weight
    with torch.no_grad():
        for layer in layers:
            a, m = layer.self_attn, layer.mlp
            w, b, gu = (None if g is None else torch.cat(group_parts(g)) for g in fused_groups(layer))
            fused.append((w, b, gu))
            if packed is not None:
                packed.append(tuple(None if x is None else reorder(x) for x in _step_weights(layer, (w, b, gu))))
        head = reorder(model.lm_head.weight) if packed is not None else None
    out = DecodeWeights(fused, packed, head, model, mkl, lib)
    cache.update(key=key, weights=out)
    return out


def gated_mlp(m) -> bool:
    """A Llama-style MLP, down(act(gate(x)) * up(x)), whose gate and up have no bias (so they fuse)."""
    return all(hasattr(m, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")) and \
        m.gate_proj.bias is None and m.up_proj.bias is None


Group = tuple[list, str]
"""Modules whose parameter of one name is concatenated (along dim 0) into one fused tensor."""


def fused_groups(layer) -> tuple[Group, Group | None, Group | None]:
    """What fuses in a decoder layer: the q/k/v weights, the q/k/v biases (None without) and the gate/up weights
    (None unless :func:`gated_mlp`)."""
    a, m = layer.self_attn, layer.mlp
    qkv = [a.q_proj, a.k_proj, a.v_proj]
    return ((qkv, "weight"), (qkv, "bias") if a.q_proj.bias is not None else None,
            ([m.gate_proj, m.up_proj], "weight") if gated_mlp(m) else None)


def group_parts(group: Group) -> list[torch.Tensor]:
    """The parameters of a :data:`Group`, in the order they are concatenated."""
    modules, name = group
    return [getattr(mod, name) for mod in modules]


class DeviceWeights(DecodeWeights):
    """The device loop's fused q/k/v (and bias) and gate/up weights, at addresses that never change: CUDA graphs
    read them where they were captured (:mod:`~teamrl.engines.cuda_graphs`). Nothing is prepacked.

    Fusing turns a layer's five projections before ``o_proj`` and ``down_proj`` into two matmuls and lets the
    queries and keys be rotated together: on a GPU, where a decode step's time at rollout batch sizes is
    largely kernel count, about 7 fewer kernels per layer.

    ``own=True`` (the engine decodes its own copy, e.g. the bf16 rollout copy of fp32 weights): the fused
    tensors become the storage of that copy's q/k/v and gate/up parameters, which are rebound as views into
    them. No extra memory, and nothing to refresh: :meth:`HFEngine.sync_weights
    <teamrl.engines.hf.HFEngine.sync_weights>` writes through the views. ``own=False`` (the engine decodes
    the learner's module itself): the fused tensors are copies (the same memory the host loop's
    :func:`decode_weights` takes), which :meth:`refresh` rewrites in place when a source weight changed.
    """

    def __init__(self, model, *, own: bool) -> None:
        super().__init__([], None, None)
        self.model, self.own = model, own
        self._key: tuple = ()
        self._build()

    def _groups(self) -> list[Group]:
        return [g for layer in self.model.model.layers for g in fused_groups(layer) if g is not None]

    def tensors(self) -> list[torch.Tensor]:
        """The fused tensors, in the order of their groups."""
        return [t for layer in self.fused for t in layer if t is not None]

    def _key_now(self) -> tuple:
        srcs = [t for g in self._groups() for t in group_parts(g)]
        return tuple(t._version for t in srcs) + tuple(t.data_ptr() for t in srcs)

    def _build(self) -> None:
        """Make the fused tensors (and, when ``own``, rebind the parameters as views into them)."""
        with torch.no_grad():
            self.fused = [tuple(None if g is None else self._fuse(g) for g in fused_groups(layer))
                          for layer in self.model.model.layers]
        self._key = self._key_now()

    def _fuse(self, group: Group) -> torch.Tensor:
        fused = torch.cat(group_parts(group))
        if self.own:
            modules, name = group
            start = 0
            for mod in modules:
                n = getattr(mod, name).shape[0]
                setattr(mod, name, torch.nn.Parameter(fused[start : start + n], requires_grad=False))
                start += n
        return fused

    def aliased(self) -> bool:
        """``own``: whether every q/k/v and gate/up parameter still lives inside the fused tensors (a ``.to()``
        or an assigned tensor moves it out)."""
        for f, g in zip(self.tensors(), self._groups(), strict=True):
            offset = f.data_ptr()
            for t in group_parts(g):
                if t.data_ptr() != offset:
                    return False
                offset += t.numel() * t.element_size()
        return True

    def refresh(self) -> None:
        """Bring the fused tensors up to date with the model, at the start of a batch. Copies (``own=False``) are
        rewritten in place when a source changed; where the parameters no longer alias them (``own=True``),
        they are made anew (new addresses: the graphs over them are captured again)."""
        if self.own:
            if not self.aliased():
                self._build()
            return
        key = self._key_now()
        if key != self._key:
            with torch.no_grad():
                for f, g in zip(self.tensors(), self._groups(), strict=True):
                    torch.cat(group_parts(g), out=f)
            self._key = key
