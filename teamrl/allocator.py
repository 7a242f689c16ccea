"""The C allocator's hooks for giving freed memory back to the system: glibc's ``malloc_trim`` and, where ``teamrl
train`` preloaded it, tcmalloc's ``MallocExtension_ReleaseFreeMemory`` (:mod:`teamrl.metrics.memory` calls them at
each phase start, the engines before allocating a large buffer). Imports nothing of teamrl."""

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
