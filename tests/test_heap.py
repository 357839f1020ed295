"""perfscope.heap: the C heap's free pages go back to the system after a trace is analyzed."""

from __future__ import annotations

import subprocess
import sys

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


def test_freed_objects_leave_the_resident_size():
    before, after, released = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                                             check=True).stdout.split()
    assert released == "True"
    assert int(before) - int(after) >= 50, (before, after)  # most of the 100 MiB freed


def test_a_c_library_without_malloc_trim_is_left_alone(monkeypatch):
    heap._malloc_trim.cache_clear()
    monkeypatch.setattr(heap.sys, "platform", "darwin")
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
