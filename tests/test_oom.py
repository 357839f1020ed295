"""Out of memory during `perfscope profile`: the allocator's history is recorded once the script
uses CUDA, and a failed allocation leaves what held the memory (a stand-in for torch.cuda here:
this machine has no GPU)."""

from __future__ import annotations

import json
import sys
import types

import pytest

from perfscope.collect import oom as oom_mod
from perfscope.collect.oom import OomWatch, largest_live
from perfscope.console_views import oom_lines
from perfscope.reports.sections import memory

MiB = 2**20


def _snapshot():
    frames = [{"filename": "train.py", "line": 42, "name": "forward"}, {"filename": "train.py", "line": 90, "name": "main"}]
    return {"segments": [
        {"device": 0, "total_size": 600 * MiB, "blocks": [
            {"size": 256 * MiB, "requested_size": 250 * MiB, "state": "active_allocated", "frames": frames},
            {"size": 100 * MiB, "requested_size": 100 * MiB, "state": "inactive", "frames": []},
            {"size": 200 * MiB, "requested_size": 200 * MiB, "state": "active_allocated", "frames": []}]},
        {"device": 0, "total_size": 64 * MiB, "blocks": [
            {"size": 64 * MiB, "requested_size": 60 * MiB, "state": "active_allocated",
             "frames": [{"filename": "model.py", "line": 7, "name": "__init__"}]}]},
    ]}


class FakeCuda:
    def __init__(self, initialized=True):
        self.initialized = initialized
        self.history = []
        self.dumped = []
        self.memory = types.SimpleNamespace(
            _record_memory_history=lambda **kw: self.history.append(kw), _snapshot=_snapshot,
            _dump_snapshot=lambda path: self.dumped.append(path))

    def is_initialized(self):
        return self.initialized


@pytest.fixture
def fake_torch(monkeypatch):
    observers = []
    cuda = FakeCuda(initialized=False)
    torch = types.SimpleNamespace(cuda=cuda, _C=types.SimpleNamespace(_cuda_attach_out_of_memory_observer=observers.append))
    monkeypatch.setitem(sys.modules, "torch", torch)
    return cuda, observers


def test_the_largest_live_allocations_come_from_the_snapshot():
    live = largest_live(_snapshot())
    assert [b["bytes"] for b in live] == [256 * MiB, 200 * MiB, 64 * MiB]  # the inactive block is not live
    assert live[0]["frames"] == ["train.py:42 forward", "train.py:90 main"] and live[1]["frames"] == []


def test_the_watch_arms_once_cuda_is_used_and_keeps_what_held_the_memory(tmp_path, fake_torch):
    cuda, observers = fake_torch
    watch = OomWatch(tmp_path, rank=3)
    watch.arm()
    assert not watch.armed and cuda.history == [] and observers == []  # never initialises CUDA itself
    cuda.initialized = True
    watch.arm()
    watch.arm()
    assert cuda.history == [{"context": "alloc", "stacks": "python", "max_entries": oom_mod.MAX_ENTRIES}]
    (observer,) = observers
    observer(0, 512 * MiB, 520 * MiB, 10 * MiB)
    record = json.loads((tmp_path / "oom-rank3.json").read_text())
    assert record == watch.record
    assert record["requested_bytes"] == 512 * MiB and record["reserved_bytes"] == 664 * MiB
    assert [b["bytes"] for b in record["largest"]] == [256 * MiB, 200 * MiB, 64 * MiB]
    assert cuda.dumped == [str(tmp_path / "oom-rank3.pickle")]
    watch.close()
    assert cuda.history[-1] == {"enabled": None}
    lines = oom_lines(record)
    assert lines[0] == "out of memory on cuda:0: 512 MiB asked for, 520 MiB allocated, 10 MiB free; the largest live allocations:"
    assert lines[1] == "  256.0 MiB  train.py:42 forward" and lines[2] == "  200.0 MiB  (no stack recorded)"
    html = memory.render({"run": {"oom": record}, "details": {}, "steps": []})
    assert "Out of memory" in html and "train.py:42 forward" in html and "256.0 MiB" in html


def test_a_failing_snapshot_never_reaches_the_script(tmp_path, fake_torch):
    cuda, observers = fake_torch
    cuda.initialized = True

    def broken():
        raise RuntimeError("no snapshot")

    cuda.memory._snapshot = broken
    watch = OomWatch(tmp_path, rank=0)
    watch.arm()
    observers[0](0, MiB, MiB, 0)  # does not raise
    assert watch.record is None and not (tmp_path / "oom-rank0.json").exists()
