"""The C allocator's hooks for giving freed memory back to the system: glibc's ``malloc_trim`` and, where ``teamrl
train`` preloaded it, tcmalloc's ``MallocExtension_ReleaseFreeMemory`` (:mod:`teamrl.metrics.memory` calls them at
each phase start, the hf engine before allocating a large KV cache buffer). Imports nothing of teamrl."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from collections.abc import Callable


@functools.cache
def malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None on another C library."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # musl has no malloc_trim
        return None


@functools.cache
def tcmalloc_release() -> Callable[[], None] | None:
    """gperftools tcmalloc's ``MallocExtension_ReleaseFreeMemory`` when tcmalloc is this process's allocator (``teamrl
    train`` preloads it where it is installed), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).MallocExtension_ReleaseFreeMemory
    except (OSError, AttributeError):
        return None


RELEASE_BEFORE_BYTES = 64 << 20
""":func:`release_before` gives tcmalloc's free pages back before an allocation of at least this many bytes."""


def release_before(nbytes: int) -> None:
    """Before allocating ``nbytes`` of CPU memory: under tcmalloc, give its free pages back when ``nbytes`` is at least
    :data:`RELEASE_BEFORE_BYTES`. tcmalloc keeps freed buffers as free pages, and a larger buffer does not fit in them,
    so without this both would be resident (docs/memory.md). glibc maps allocations this large on its own and unmaps
    them when freed: nothing to do there."""
    if nbytes >= RELEASE_BEFORE_BYTES:
        release = tcmalloc_release()
        if release is not None:
            release()
