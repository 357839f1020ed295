"""perfscope.heap: the C heap's free pages go back to the system after a trace is analyzed."""

from __future__ import annotations

import subprocess
import sys

import pytest

import perfscope
from perfscope import heap

# In a fresh process: 100 MiB of small objects made and freed (as a trace's decoded events are),
# then the resident size before and after release_free_memory.
CHILD = """
import re
from perfscope.heap import release_free_memory
def rss():
    return int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) // 1024
events = [bytes(1000) + str(i).encode() for i in range(100_000)]
keep = events[::1000]  # a few survivors, scattered over the heap as a table's strings are
del events
before = rss()
released = release_free_memory()
print(before, rss(), released)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or heap._malloc_trim() is None,
                    reason="glibc's malloc_trim and /proc are Linux's")
def test_freed_objects_leave_the_resident_size():
    before, after, released = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                                             check=True).stdout.split()
    assert released == "True"
    assert int(before) - int(after) >= 50, (before, after)  # most of the 100 MiB freed (kept: 110 -> 110)


class _Musl:
    """A C library without malloc_trim: ctypes raises AttributeError for the missing symbol."""

    def __getattr__(self, name):
        raise AttributeError(name)


@pytest.mark.parametrize("where", ["macOS", "musl", "no C library", "no ctypes"])
def test_a_c_library_without_malloc_trim_is_left_alone(monkeypatch, where):
    import ctypes

    def no_library(_name):
        raise OSError("cannot load")

    if where == "macOS":
        monkeypatch.setattr(heap.sys, "platform", "darwin")
    elif where == "musl":
        monkeypatch.setattr(ctypes, "CDLL", lambda _name: _Musl())
    elif where == "no C library":
        monkeypatch.setattr(ctypes, "CDLL", no_library)
    else:
        monkeypatch.setitem(sys.modules, "ctypes", None)  # import ctypes raises ImportError
    heap._malloc_trim.cache_clear()
    try:
        assert heap.release_free_memory() is False
    finally:
        heap._malloc_trim.cache_clear()


def test_each_analyzed_trace_releases_its_garbage(monkeypatch, tmp_path):
    from streamkit import gpu_trace

    from perfscope.analysis import rank

    calls = []
    monkeypatch.setattr(rank, "release_free_memory", lambda: calls.append(1) or True)
    for i in range(2):
        (tmp_path / f"rank{i}.json").write_bytes(gpu_trace(3, distributedInfo={"rank": i, "world_size": 2}))
    assert perfscope.analyze(tmp_path).verdict is not None
    assert len(calls) == 2


# In a fresh process: a 16 MiB array made and freed (which raises glibc's mmap threshold to 16 MiB),
# then 40 arrays of 8 MiB alive together, each followed by a small survivor, and all freed: without
# a fixed threshold they come from the heap and may stay resident between the survivors; with one,
# each was a mapping of its own, unmapped when freed.
LARGE = """
import re, sys
import numpy as np
from perfscope.heap import map_large_blocks
def rss():
    return int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) // 1024
fixed = map_large_blocks()
big = np.ones(2 << 20)
del big
base = rss()
blocks, keep = [], []
for i in range(40):
    blocks.append(np.ones(1 << 20))  # 8 MiB, touched
    keep.append(np.ones(1000))  # a small survivor after each, as an analysis leaves results
del blocks
print(fixed, rss() - base)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or heap._malloc_trim() is None,
                    reason="glibc's mallopt and /proc are Linux's")
def test_large_freed_blocks_leave_the_resident_size_with_a_fixed_threshold():
    def grown():
        return subprocess.run([sys.executable, "-c", LARGE], capture_output=True, text=True,
                              check=True).stdout.split()

    # Without the fixed threshold this grows by the whole 320 MiB on an idle machine (glibc 2.36);
    # that case is not asserted: what glibc keeps then depends on the heap's state.
    fixed, fixed_growth = grown()
    assert fixed == "True"
    assert int(fixed_growth) < 16, fixed_growth  # the 320 MiB were unmapped
