"""The GPU catches up before the profiler's window opens (perfscope.collect.host): the recorder
waits once, at the boundary before the first recorded step, so that the window never opens on
work launched before it (docs/metrics.md, "Work from before the window")."""

from __future__ import annotations

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
