"""The GPU catches up before the profiler's window opens (perfscope.collect.host): the recorder
waits once, at the boundary before the first recorded step, so that the window never opens on
work launched before it (docs/metrics.md, "Work from before the window")."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch

from perfscope.collect import host
from perfscope.collect.host import HostStepRecorder


# torch warns of a warm-up of 0 and of events cleared between the cycles of a repeating schedule
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _steps_synced(schedule: Callable, steps: int) -> list[int]:
    synced = []
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule)
    rec = HostStepRecorder(prof, sync=lambda: synced.append(prof.step_num))
    with rec:
        for _ in range(steps):
            torch.ones(4).sum()
            rec.step()
    return synced


def test_the_wait_comes_once_at_the_end_of_the_last_warmup_step():
    # steps 0-1 skipped, 2-3 warm-up, 4-6 recorded: the wait ends step 3
    assert _steps_synced(torch.profiler.schedule(skip_first=2, wait=0, warmup=2, active=3, repeat=1), 9) == [3]


def test_every_window_of_a_repeating_schedule_gets_its_wait():
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=2)
    assert _steps_synced(schedule, 10) == [1, 5]


def test_without_warmup_the_wait_ends_the_step_before_the_window():
    assert _steps_synced(torch.profiler.schedule(wait=2, warmup=0, active=2, repeat=1), 6) == [1]


def test_the_default_wait_leaves_a_process_without_cuda_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append(a))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    host.sync_cuda()
    assert calls == []  # never initialises CUDA for a CPU run
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    host.sync_cuda()
    assert calls == [()]


def test_the_profiler_is_entered_at_the_boundary_before_its_window_and_numbers_its_steps_as_before(tmp_path):
    # steps 0-3 not traced, 4 warm-up, 5-6 recorded: torch's own step() runs from the boundary 3 -> 4 on
    ready, inner_steps = [], []
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], on_trace_ready=ready.append,
                                  schedule=torch.profiler.schedule(skip_first=4, wait=0, warmup=1, active=2, repeat=1))
    real_step = prof.step
    prof.step = lambda: (inner_steps.append(prof.step_num), real_step())[1]
    rec = HostStepRecorder(prof)
    seen = []
    with rec:
        for _ in range(8):
            torch.ones(4).sum()
            rec.step()
            seen.append(rec.step_num)
    assert seen == list(range(1, 9))  # the recorder's count is the profiler's numbering throughout
    assert inner_steps[0] == 3  # no profiler work at the boundaries before its window
    (done,) = ready
    done.export_chrome_trace(str(tmp_path / "t.json"))
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert sorted({e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}) == \
        ["ProfilerStep#5", "ProfilerStep#6"]
    assert [r["step"] for r in rec.steps] == [4, 5, 6]  # the host record of the traced steps


def test_a_run_that_ends_before_its_window_never_enters_the_profiler():
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                  schedule=torch.profiler.schedule(skip_first=10, wait=0, warmup=1, active=1, repeat=1))
    with HostStepRecorder(prof) as rec:
        for _ in range(3):
            rec.step()
    assert rec.step_num == 3 and prof.step_num == 0 and prof.step_rec_fn is None
