"""Peak memory per phase of a training step: resident set size, and CUDA memory on a GPU.

At the start of each phase the memory the previous one freed is given back to the system
(:func:`return_memory`: Python's garbage cycles collected, glibc's free heap pages trimmed), and on
Linux the kernel's peak-RSS mark (``VmHWM``) is reset (writing 5 to ``/proc/self/clear_refs``), so
``perf/peak_rss_gb/rollout`` is the peak of that phase alone: what it allocated on top of what stays
(weights, AdamW moments). Without the trim, glibc keeps an update's freed activations in its heap and
the rollout's figure would read the update's. Where the mark cannot be reset the value is the
process's peak so far (``ru_maxrss``). ``perf/peak_rss_gb/run`` is the process's peak since it started: a reset
mark is lost to ``getrusage`` too, so ``/usr/bin/time``'s maximum resident set size reads only what came after
the last reset.
"""

from __future__ import annotations

import contextlib
import gc
import resource
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from teamrl.allocator import malloc_trim, tcmalloc_release

_GB = 1024**3


def _reset_rss_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _vmhwm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


def _maxrss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def peak_rss_gb() -> float:
    """The process's peak resident set size in GiB (since the last reset where resets work)."""
    try:
        return _vmhwm_bytes() / _GB
    except OSError:
        return _maxrss_bytes() / _GB


def return_memory() -> None:
    """Give the memory this process freed back to the system: collect Python's garbage cycles, then trim
    glibc's heaps (``malloc_trim(0)``: free pages of every arena) or, under tcmalloc, release its free pages. Costs
    tens of milliseconds, and the next phase's first touch of the pages it needs again; CUDA's caching allocator is
    left as it is (its cache is reused by the next phase)."""
    gc.collect()
    release = tcmalloc_release()
    if release is not None:
        release()
        return
    trim = malloc_trim()
    if trim is not None:
        trim(0)


@contextlib.contextmanager
def heap_frozen() -> Iterator[None]:
    """Collect once, then move every object alive now (modules, models, the run's setup) out of the garbage
    collector's view until the block ends (``gc.freeze``): :func:`return_memory`'s collection at each phase then walks
    only what the run allocated since, about 0.1-0.3 s less per phase with torch and transformers loaded. Objects
    frozen here that become cyclic garbage inside the block are collected after it (``gc.unfreeze``). Inside a block
    already frozen (a nested run, or a caller's own ``gc.freeze``) it changes nothing."""
    if gc.get_freeze_count():
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class PeakMemory:
    """Records peak RSS (and CUDA max allocated, when CUDA is in use) of named phases.

    ``release``: call :func:`return_memory` when a phase starts (``train.release_memory``)."""

    def __init__(self, *, release: bool = True) -> None:
        self.release = release
        self.cuda = torch.cuda.is_available()
        self._cuda_peak: Callable[[], float] = (lambda: torch.cuda.max_memory_allocated() / _GB) if self.cuda else (lambda: 0.0)
        self.peaks: dict[str, float] = {}
        self.run_peak = 0.0
        """The process's peak so far: resetting the kernel's mark also clears the peak that ``getrusage`` (and so
        ``/usr/bin/time``) reports, so each phase's mark is folded in here before it is reset."""

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Measure the peaks of the code run inside this block under ``name``."""
        if self.release:
            return_memory()
        self.run_peak = max(self.run_peak, peak_rss_gb())
        _reset_rss_peak()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        try:
            yield
        finally:
            self.peaks[f"perf/peak_rss_gb/{name}"] = peak_rss_gb()
            self.run_peak = max(self.run_peak, self.peaks[f"perf/peak_rss_gb/{name}"])
            self.peaks["perf/peak_rss_gb/run"] = self.run_peak
            if self.cuda:
                self.peaks[f"perf/cuda_max_allocated_gb/{name}"] = self._cuda_peak()

    def metrics(self) -> dict[str, float]:
        """The peaks of the phases measured so far."""
        return dict(self.peaks)


AUTO_FRACTION = {"cuda": 0.8, "cpu": 0.5}  # share of the free memory an update may plan to use
AUTO_MIN_TOKENS, AUTO_MAX_TOKENS, AUTO_STEP = 256, 1 << 20, 256


def free_memory_bytes(device: torch.device) -> int:
    """Memory free for a new allocation on ``device``: CUDA's free memory, or the host's available RAM."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    import psutil  # a dependency of accelerate, itself a dependency of teamrl

    return psutil.virtual_memory().available


def auto_micro_batch_tokens(free: int, *, device_type: str, layers: int, hidden: int, intermediate: int,
                            vocab: int, trainable: int, elem: int = 4, autocast: bool = False, checkpointing: float = 0.0,
                            logits_chunk: int = 4096, moment_bytes: int = 8) -> int:
    """The token budget of one micro-batch (``loss.micro_batch_tokens: auto``) that fits in ``free`` bytes.

    The formula (documented in docs/architecture.md)::

        reserve   = (8 B + moments) x trainable params   (gradients, their per-agent sum, AdamW's two moments:
                                                       8 B in float32, 2 B in 8 bit)
        logits    = 12 B x vocab x logits_chunk    (fp32 logits, their exp and gradient, one chunk)
        per_token = layers x layer_bytes                            without checkpointing
                  = elem x layers x hidden + layer_bytes            with checkpointing
                  = elem x k x hidden + (layers - k + 1) x layer_bytes   with k layers of them checkpointed
                    (layer_bytes: teamrl.plan.layer_bytes, the memory plan's; + 12 B x vocab when
                    logits_chunk is 0: the logits grow with the tokens)
        tokens    = (fraction x (free - reserve) - logits) / per_token

    with ``fraction`` 0.8 on CUDA and 0.5 on the CPU (whose RAM other processes share), rounded
    down to a multiple of 256 and clamped to [256, 2^20].

    Args:
        free: bytes free on the device once the model (and a KL reference) are loaded.
        device_type: ``cuda`` or ``cpu``.
        layers, hidden, intermediate, vocab: the model's shape.
        trainable: number of trained parameters.
        elem: bytes per activation value (4 for fp32 weights, also under bf16 autocast, whose
            residual stream and norms stay fp32; 2 for bf16 weights).
        autocast: bf16 autocast of fp32 weights (``train_autocast``).
        checkpointing: the fraction of layers checkpointed (``models.<m>.gradient_checkpointing`` and
            ``checkpoint_layers``; 0 or False: none, 1 or True: every layer).
        logits_chunk: ``loss.logits_chunk_tokens``.
        moment_bytes: bytes of AdamW's two moments per parameter (8 in float32, 2 with
            ``optim.states: 8bit``).

    Returns:
        Tokens per micro-batch.

    >>> gib = 1 << 30  # SmolLM2-135M shape with 20 GiB free on a GPU
    >>> shape = dict(layers=30, hidden=576, intermediate=1536, vocab=49152, trainable=134_515_008)
    >>> auto_micro_batch_tokens(20 * gib, device_type="cuda", **shape)
    7936
    >>> auto_micro_batch_tokens(20 * gib, device_type="cuda", checkpointing=True, **shape)
    106240
    """
    from teamrl.plan import activation_bytes_per_token, checkpointed_layers, layer_bytes  # the memory plan's

    layer = layer_bytes(hidden, intermediate, fp32=elem == 4, autocast=autocast)
    ckpt = len(checkpointed_layers(layers, float(checkpointing))) if checkpointing else 0
    per_token = activation_bytes_per_token(layers, ckpt, hidden=hidden, layer=layer, elem=elem)
    logits = 12 * vocab * logits_chunk
    if logits_chunk == 0:
        per_token += 12 * vocab
    budget = AUTO_FRACTION.get(device_type, 0.5) * (free - (8 + moment_bytes) * trainable) - logits
    tokens = int(budget // per_token) // AUTO_STEP * AUTO_STEP
    return max(AUTO_MIN_TOKENS, min(AUTO_MAX_TOKENS, tokens))
