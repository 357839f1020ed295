"""Collection on a busy machine: the profiling window is lengthened while too few of its steps ran
without waiting for a core (perfscope.collect.window), and is exactly the planned one otherwise.

The unit tests drive the window with host records and a clock of their own; the end-to-end ones
make the machine busy in a known way: the profiled run and two busy processes share one core.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from collectkit import loop_script  # noqa: E402
from conftest import on_one_core  # noqa: E402

from perfscope.collect import ProfileSchedule  # noqa: E402
from perfscope.collect.errors import ScheduleError  # noqa: E402
from perfscope.collect.window import EXTEND_MIN_STEPS, Window, max_recorded  # noqa: E402

A = torch.profiler.ProfilerAction
BUSY = {"wall_us": 10_000.0, "thread_cpu_us": 3_000.0, "run_queue_us": 7_000.0}
CLEAN = {"wall_us": 10_000.0, "thread_cpu_us": 9_500.0, "run_queue_us": 200.0}
UNKNOWN = {"wall_us": 10_000.0, "thread_cpu_us": 3_000.0, "run_queue_us": None}


class Run:
    """Steps a Window as the profiler does: asks for each step's action as it begins, after the host
    record of the step before it was written (by ``kind(step)``); the clock moves ``step_s`` a step."""

    def __init__(self, schedule, kind, *, extend=True, step_s=0.01):
        self.records, self.lines, self.now = [], [], 0.0
        self.window = Window(torch, schedule, records=lambda: self.records, extend=extend,
                             clock=lambda: self.now, say=self.lines.append)
        self.kind, self.step_s = kind, step_s

    def actions(self, steps):
        out = []
        for n in range(steps):
            if n:
                self.records.append({"step": n - 1, **self.kind(n - 1)})
                self.now += self.step_s
            out.append(self.window(n))
        return out


def torch_actions(schedule, steps):
    plain = torch.profiler.schedule(skip_first=schedule.skip_first + 1, wait=0, warmup=schedule.warmup,
                                    active=schedule.active, repeat=1)
    return [plain(n) for n in range(steps)]


@pytest.mark.parametrize("kind", [lambda n: CLEAN, lambda n: UNKNOWN])
def test_a_quiet_machine_or_a_record_that_cannot_tell_gets_the_planned_window(kind):
    s = ProfileSchedule(skip_first=2, warmup=1, active=4, extend_s=60)
    run = Run(s, kind)
    assert run.actions(15) == torch_actions(s, 15)
    assert run.window.outcome_dict() is None and run.lines == []


def test_extension_off_gives_the_planned_window_even_when_every_step_waited():
    s = ProfileSchedule(skip_first=1, warmup=1, active=3, extend_s=60)
    assert Run(s, lambda n: BUSY, extend=False).actions(12) == torch_actions(s, 12)
    s0 = ProfileSchedule(skip_first=1, warmup=1, active=3)  # extend_s defaults to 0
    assert Run(s0, lambda n: BUSY).actions(12) == torch_actions(s0, 12)


def test_every_step_waiting_lengthens_the_window_to_the_step_cap_with_a_progress_line():
    s = ProfileSchedule(skip_first=1, warmup=1, active=3, extend_s=600)
    run = Run(s, lambda n: BUSY)
    got = run.actions(40)
    first = s.skip_first + 1 + s.warmup
    recorded = [n for n, a in enumerate(got) if a in (A.RECORD, A.RECORD_AND_SAVE)]
    assert recorded == list(range(first, first + EXTEND_MIN_STEPS)) == list(range(first, first + max_recorded(s)))
    assert got[recorded[-1]] == A.RECORD_AND_SAVE and got.count(A.RECORD_AND_SAVE) == 1
    assert set(got[recorded[-1] + 1:]) == {A.NONE}
    out = run.window.outcome_dict()
    assert out["planned"] == 3 and out["recorded"] == EXTEND_MIN_STEPS and out["clean"] == 0
    assert out["reason"].startswith("the step cap")
    assert "waited for a core" in run.lines[0] and "lengthened by 17 steps" in run.lines[-1]


def test_the_time_cap_ends_the_lengthened_window_and_progress_is_said_every_ten_seconds():
    s = ProfileSchedule(skip_first=0, warmup=0, active=5, extend_s=30)
    run = Run(s, lambda n: BUSY, step_s=4.0)
    got = run.actions(40)
    last = got.index(A.RECORD_AND_SAVE)
    out = run.window.outcome_dict()
    assert out["reason"] == "the time cap of 30 s" and out["seconds"] >= 30
    # decided at the planned last step (t0), then 4 s a step: 8 steps reach 32 s
    assert last == 5 + 8
    progress = [x for x in run.lines if "clean steps after" in x]
    assert 2 <= len(progress) <= 3


def test_the_window_closes_at_the_first_step_that_would_make_enough_clean_steps():
    s = ProfileSchedule(skip_first=0, warmup=0, active=3, extend_s=600)
    # steps 1..4 wait, then steps run clean: 5 and 6 clean, so step 7 (if clean too) gives 3
    run = Run(s, lambda n: BUSY if n <= 4 else CLEAN)
    got = run.actions(20)
    assert got.index(A.RECORD_AND_SAVE) == 7
    out = run.window.outcome_dict()
    assert out == {**out, "recorded": 7, "clean": 2, "reason": "enough clean steps"}


@pytest.mark.parametrize("cuda", [False, True], ids=["cpu run", "gpu run"])
def test_intra_op_workers_that_wait_lengthen_a_cpu_runs_window_only(cuda, monkeypatch):
    # the training thread ran clean; its two intra-op workers waited 60% of the step for a core
    workers = {**CLEAN, "intra_op_threads": 2, "sibling_run_queue_us": 6_000.0}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: cuda)
    s = ProfileSchedule(skip_first=1, warmup=1, active=3, extend_s=600)
    got = Run(s, lambda n: workers).actions(30)
    if cuda:  # a GPU step's math is not on the workers: the planned window
        assert got == torch_actions(s, 30)
    else:
        assert got.count(A.RECORD) + got.count(A.RECORD_AND_SAVE) == max_recorded(s)


def test_asking_twice_for_a_step_gives_the_same_answer():
    s = ProfileSchedule(skip_first=0, warmup=0, active=2, extend_s=600)
    run = Run(s, lambda n: BUSY)
    run.actions(3)  # step 2 is past the planned last (1... 2): asked for once
    assert run.window(2) == run.window(2) == A.RECORD


def test_the_users_own_max_steps_bounds_the_lengthened_window():
    s = ProfileSchedule(skip_first=1, warmup=1, active=3, max_steps=8, extend_s=600)
    got = Run(s, lambda n: BUSY).actions(20)
    assert got.index(A.RECORD_AND_SAVE) == 8


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), 10**6, True, "5"])
def test_extend_s_out_of_range_is_refused_by_name(bad):
    with pytest.raises(ScheduleError, match="extend_s"):
        ProfileSchedule(extend_s=bad)


# --------------------------------------------------------------------------- end to end, one core
# 20 ms of wall time per step, spent running: beside two busy processes on its core the thread
# waits for the core for most of it.
SPIN = "import time as _t\n        _s = _t.perf_counter()\n        while _t.perf_counter() - _s < 0.02: pass"


def _profile(tmp_path, *extra):
    script = loop_script(tmp_path, iterations=200, extra=SPIN)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "perfscope", "profile", str(script), "--out", str(out),
                           "--skip-first", "1", "--warmup", "1", "--active", "3", *extra],
                          capture_output=True, text=True, timeout=300, preexec_fn=on_one_core)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc, json.loads((out / "summary.json").read_text())


@pytest.mark.slow
def test_profile_beside_busy_processes_lengthens_its_window_and_says_so(tmp_path, busy_core):
    proc, summary = _profile(tmp_path, "--extend-s", "5")
    ext = summary["run"]["window_extension"]
    assert ext["planned"] == 3 and ext["recorded"] > 3 and ext["reason"].split(" ")[1] in ("step", "time", "clean")
    assert "recording more steps" in proc.stderr and "window lengthened by" in proc.stderr
    assert len(summary["steps"]) == ext["recorded"]


@pytest.mark.slow
def test_profile_with_extend_s_zero_records_exactly_the_planned_steps_beside_busy_processes(tmp_path, busy_core):
    proc, summary = _profile(tmp_path, "--extend-s", "0")
    assert "window_extension" not in summary["run"] and len(summary["steps"]) == 3
    assert "recording more steps" not in proc.stderr
