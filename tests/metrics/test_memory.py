"""Memory freed in one phase goes back to the system before the next, and each phase's peak is its own."""

from __future__ import annotations

import os
import sys

import pytest

from teamrl.metrics.memory import PeakMemory, return_memory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")

MB = 1 << 20


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def fragmented_heap(total: int) -> list[bytes]:
    """``total`` bytes in 64 KiB objects (under glibc's mmap threshold: they live in its heap), of which every
    16th is returned to be kept: the freed ones lie between live ones, so free() alone cannot shrink the heap."""
    chunks = [bytes(64 * 1024) for _ in range(total // (64 * 1024))]
    return chunks[::16]


def test_return_memory_gives_freed_heap_pages_back():
    kept = fragmented_heap(256 * MB)  # 256 MiB allocated, 16 MiB of it still alive
    before = rss()
    return_memory()
    after = rss()
    assert before - after > 128 * MB, f"RSS {before / MB:.0f} -> {after / MB:.0f} MiB: the freed 240 MiB stayed"
    del kept


def test_each_phase_reports_its_own_peak():
    meter = PeakMemory(release=True)
    with meter.phase("big"):
        kept = fragmented_heap(256 * MB)
    with meter.phase("small"):
        pass
    big, small = meter.metrics()["perf/peak_rss_gb/big"], meter.metrics()["perf/peak_rss_gb/small"]
    assert big - small > 128 / 1024, (big, small)  # GiB: the small phase does not read the big one's peak
    # the run's peak keeps the big phase's, though its mark was reset (and so lost to getrusage)
    assert meter.metrics()["perf/peak_rss_gb/run"] >= big
    del kept


TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"


@pytest.mark.skipif(not os.path.exists(TCMALLOC), reason=f"gperftools tcmalloc not installed ({TCMALLOC})")
def test_return_memory_releases_tcmallocs_free_pages():
    # teamrl train preloads tcmalloc, which keeps freed pages for reuse; at a phase's start they are released too,
    # so the next phase's peak is its own (run in a child process: the allocator is chosen when a process starts)
    import subprocess

    code = f"""
import os, sys
sys.path.insert(0, {str(os.getcwd())!r})
from tests.metrics.test_memory import fragmented_heap, rss
from teamrl.metrics.memory import return_memory, tcmalloc_release
assert tcmalloc_release() is not None
kept = fragmented_heap(256 * 2**20)
before = rss(); return_memory(); after = rss()
print(before - after)
"""
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, LD_PRELOAD=TCMALLOC), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) > 128 * MB, out.stdout


_KERNEL_CACHE_CHILD = """
import sys
if sys.argv[1] == "teamrl":
    import teamrl  # noqa: F401  (bounds oneDNN's kernel caches unless the environment sets them)
import torch
torch.set_num_threads(1)
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # SmolLM2-135M's q/k/v, o, gate/up and down
try:
    ws = [torch.ops.mkldnn._reorder_linear_weight(torch.randn(s)) for s in shapes]
except (RuntimeError, AttributeError):
    print("unsupported"); sys.exit()
with torch.no_grad():
    for rows in range(1, 200):  # a decode step's row count changes as rows finish: a new kernel per shape
        if rows == 9:
            start = rss()
        for w, s in zip(ws, shapes):
            torch.ops.mkldnn._linear_pointwise(torch.randn(rows, s[1]), w, None, "none", [], "")
print(rss() - start)
"""


@pytest.mark.slow  # a process of its own running hundreds of product shapes (about 9 s)
def test_import_teamrl_bounds_onednns_per_shape_kernel_caches(tmp_path):
    """oneDNN keeps a compiled kernel per input shape (two caches of 1024 entries by default, about 0.6 MB each
    here); after ``import teamrl`` 764 shapes of prepacked products grow the process far less."""
    import subprocess

    script = tmp_path / "kernels.py"
    script.write_text(_KERNEL_CACHE_CHILD)
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")}

    def growth(mode: str) -> str:
        return subprocess.run([sys.executable, str(script), mode], env=env, capture_output=True, text=True,
                              check=True, timeout=300).stdout.strip()

    bounded, default = growth("teamrl"), growth("plain")
    if "unsupported" in (bounded, default):
        pytest.skip("no oneDNN prepacked linear on this CPU")
    assert float(default) > 200 and float(bounded) < float(default) / 3, (bounded, default)


def test_a_kernel_cache_size_set_in_the_environment_wins():
    import subprocess

    import teamrl

    code = "import os, teamrl; print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'], os.environ['LRU_CACHE_CAPACITY'])"
    env = {k: v for k, v in os.environ.items() if k != "LRU_CACHE_CAPACITY"} | {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "5"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["5", str(teamrl.KERNEL_CACHE_ENTRIES)]


def test_a_frozen_heap_keeps_its_objects_out_of_each_collection_and_frees_their_cycles_after():
    import gc
    import weakref

    from teamrl.metrics.memory import heap_frozen

    class Node:
        pass

    a = Node()
    a.self = a  # a cycle alive when the block starts
    gone = weakref.ref(a)
    with heap_frozen():
        assert gc.get_freeze_count() > 1000  # the modules and everything alive now
        del a
        gc.collect()
        assert gone() is not None  # frozen: not collected inside the block
        young = [Node() for _ in range(500)]  # a nested freeze would take these in
        frozen = gc.get_freeze_count()
        with heap_frozen():  # nested: the outer block's freeze stays as it is
            pass
        # frozen objects another thread frees leave the count; none joins it
        assert frozen - 100 < gc.get_freeze_count() <= frozen
        del young
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert gone() is None
