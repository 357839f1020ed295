"""The whole run: every step timed outside the profiler (record, timer, analysis, console, report,
check). The timer is driven with a fake clock; the end-to-end tests profile tiny scripts here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from perfscope.analysis import run_view
from perfscope.analysis.run_view import memory_creep, periodic, rank_run_view, run_findings, slow_steps, window_view
from perfscope.collect import run_timer
from perfscope.record.schema import RunPeriodic, RunSlowStep
from perfscope.record.run_steps import (
    RunStep, decode_run_steps, encode_run_step, read_run_steps, run_steps_path,
)

from conftest import HANG_TIMEOUT_S, on_one_core  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def steps(seconds: list[float], **kw) -> list[RunStep]:
    """Steps 1..n of the given times (all in `forward`), with per-step extras from ``kw`` lists."""
    out, end = [], 0.0
    for i, s in enumerate(seconds):
        end += s
        extra = {k: v[i] for k, v in kw.items()}
        out.append(RunStep(step=i + 1, end=end, seconds=s, forward=s - extra.pop("other", 0.0), **extra))
    return out


# ----------------------------------------------------------------------------- the record

def test_record_lines_round_trip_and_a_torn_line_is_dropped(tmp_path):
    a = RunStep(step=1, end=0.5, seconds=0.5, input=0.1, forward=0.2, backward=0.15, optimizer=0.01, rss=1 << 30)
    b = RunStep(step=2, end=0.9, seconds=0.4, profiler=0.1, traced=True, device_allocated=5, device_reserved=8)
    data = encode_run_step(a) + encode_run_step(b) + b'[3,1.0,"x"]\n' + encode_run_step(a)[:9]
    assert decode_run_steps(data) == [a, b]
    assert a.other == pytest.approx(0.04) and b.own == pytest.approx(0.3)
    assert run_steps_path(Path("/x/rank3.pt.trace.json.gz")) == Path("/x/rank3.run.jsonl")
    assert run_steps_path(Path("/x/w.json")) == Path("/x/w.run.jsonl")
    assert read_run_steps(tmp_path / "rank0.pt.trace.json.gz").steps is None
    (tmp_path / "rank0.run.jsonl").write_bytes(data + b"\n")
    record = read_run_steps(tmp_path / "rank0.pt.trace.json.gz")
    assert record.steps == [a, b] and record.dropped == 2 and record.problem is None  # blank lines are not lines


def test_a_record_past_its_bound_or_not_a_file_is_not_read_and_says_why(tmp_path, monkeypatch):
    from perfscope import atomic

    path = tmp_path / "rank0.run.jsonl"
    path.write_bytes(encode_run_step(RunStep(step=1, end=0.5, seconds=0.5)) * 10)
    monkeypatch.setattr(atomic, "MAX_RECORD_BYTES", 100)
    record = read_run_steps(tmp_path / "rank0.pt.trace.json.gz")
    assert record.steps is None and record.problem.endswith("more than the 100 a record of perfscope's holds; not read")
    path.unlink()
    os.mkfifo(path)  # nobody writes it: reading would wait for ever
    assert read_run_steps(tmp_path / "rank0.pt.trace.json.gz").problem == "not a regular file; not read"


# ----------------------------------------------------------------------------- the timer

class Clock:
    def __init__(self):
        self.ns = 0

    def __call__(self):
        return self.ns

    def run(self, ms: float):
        self.ns += int(ms * 1e6)


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(run_timer.time, "perf_counter_ns", c)
    return c


def test_timer_splits_a_step_into_its_phases_and_leaves_the_profiler_out(tmp_path, clock):
    traced = iter([False, True])
    t = run_timer.RunTimer(tmp_path / "r.run.jsonl", traced=lambda: next(traced))
    t.start()
    for profiler_ms in (0, 30):
        clock.run(1)  # zero_grad, before the fetch: other
        t.fetch_begin(); clock.run(4); t.fetch_end()  # noqa: E702
        clock.run(2)
        if profiler_ms:  # the profiler's boundary work lands inside the forward
            t.profiler_begin(); clock.run(profiler_ms); t.profiler_end()  # noqa: E702
        clock.run(8)  # forward
        t.backward_begin(); clock.run(16); t.backward_end()  # noqa: E702
        clock.run(1)  # clipping: other
        t.optimizer_begin(); clock.run(2); t.optimizer_end()  # noqa: E702
        t.step_end()
    t.flush()
    first, second = read_run_steps(tmp_path / "r.pt.trace.json.gz").steps or [None, None]
    for s in (first, second):
        assert (s.input, s.forward, s.backward, s.optimizer) == pytest.approx((0.004, 0.010, 0.016, 0.002))
        assert s.other == pytest.approx(0.002)
    assert (first.step, first.seconds, first.profiler, first.traced) == (1, pytest.approx(0.034), 0.0, False)
    assert (second.step, second.seconds, second.profiler, second.traced) == (2, pytest.approx(0.064), pytest.approx(0.03), True)
    assert second.own == pytest.approx(0.034) and second.end == pytest.approx(0.098)


def test_timer_counts_accumulated_micro_batches_and_keeps_what_it_could_not_write(tmp_path, clock):
    t = run_timer.RunTimer(tmp_path / "r.run.jsonl")
    t.start()
    for _ in range(4):  # no DataLoader: each forward runs from the step's start or the last backward
        clock.run(5)
        t.backward_begin(); t.backward_begin(); clock.run(10); t.backward_end(); t.backward_end()  # noqa: E702
    t.step_end()
    t.flush()
    (s,) = read_run_steps(tmp_path / "r.pt.trace.json.gz").steps
    assert (s.forward, s.backward, s.seconds) == pytest.approx((0.020, 0.040, 0.060))
    blocked = run_timer.RunTimer(tmp_path / "missing" / "r.run.jsonl")
    blocked.start()
    blocked.step_end()
    blocked.flush()
    assert blocked.error and "could not write" in blocked.error


# ----------------------------------------------------------------------------- the analysis

def test_slow_steps_at_one_interval_are_periodic_even_with_a_stray_one():
    seconds = [0.5, 0.2] + [0.010] * 98
    other = [0.0] * 100
    for n in (10, 30, 50, 70, 90):  # every 20 steps, in `other` (a checkpoint)
        seconds[n - 1], other[n - 1] = 0.060, 0.050
    seconds[44] = 0.040  # one stray slow step (step 45, in forward)
    view = rank_run_view(steps(seconds, other=other), window=[])
    slow = view.slow_steps
    assert {r.step for r in slow} == {10, 30, 45, 50, 70, 90} and view.slow_count == 6
    assert view.periodic == RunPeriodic(every=20, steps=[10, 30, 50, 70, 90], phase="other")
    assert any("a slow step every 20 steps (10, 30, 50, 70, 90), mostly in other" in f for f in run_findings(view))
    assert view.startup_s == pytest.approx(0.7)  # the first two steps: start-up, not slow steps
    assert periodic([RunSlowStep(step=n, phase="forward") for n in (5, 9, 40, 41, 66)]) is None


def test_a_periodic_task_is_found_among_many_short_stray_slow_steps():
    import numpy as np

    rng = np.random.default_rng(1)
    stray = [RunSlowStep(step=int(n), phase="forward", extra_s=0.004, seconds=0.005)
             for n in rng.choice(np.arange(3, 400), size=40, replace=False) if n % 50]
    task = [RunSlowStep(step=n, phase="other", extra_s=0.5, seconds=0.501) for n in range(50, 400, 50)]
    found = periodic(stray + task)
    assert found is not None and found.every == 50 and found.phase == "other"
    assert found.steps == list(range(50, 400, 50))
    assert periodic(stray) is None  # the strays alone: no period holds half of their time


def test_strays_between_a_periodic_tasks_steps_do_not_halve_its_interval():
    # seen on a busy machine: a task every 12 steps, and short strays that fell halfway between
    # its steps filled the slots of a period of 6
    task = [RunSlowStep(step=n, phase="other", extra_s=0.25, seconds=0.26) for n in range(13, 98, 12)]
    stray = [RunSlowStep(step=n, phase="forward", extra_s=0.004, seconds=0.005) for n in (7, 19, 31, 43, 55, 4, 28, 60)]
    assert periodic(task + stray) == RunPeriodic(every=12, steps=list(range(13, 98, 12)), phase="other")
    # a genuine shorter period, its time spread evenly, keeps its interval
    every6 = [RunSlowStep(step=n, phase="other", extra_s=0.25, seconds=0.26) for n in range(7, 98, 6)]
    assert periodic(every6 + stray[5:]).every == 6


def test_noise_alone_makes_no_slow_step():
    import numpy as np

    rng = np.random.default_rng(0)
    seconds = list(0.010 * (1 + 0.1 * rng.standard_normal(300)))
    assert slow_steps(steps(seconds))[0] == []


def test_memory_that_keeps_growing_is_creep_and_a_flat_level_is_not():
    n = 60
    growing = steps([0.05] * n, rss=[(1 << 30) + k * (4 << 20) for k in range(n)])
    (creep,) = memory_creep(growing)
    assert creep.memory == "rss" and creep.bytes_per_step == pytest.approx(4 << 20)
    assert creep.growth_bytes == pytest.approx((n - 3) * (4 << 20)) and creep.first_step == 3
    flat = steps([0.05] * n, rss=[(1 << 30) + (k % 3) * (8 << 20) for k in range(n)])
    assert memory_creep(flat) == []
    small = steps([0.05] * n, device_allocated=[(8 << 30) + k * 1024 for k in range(n)])  # 60 KiB in all
    assert memory_creep(small) == []
    view = rank_run_view(growing, window=[])
    assert any(f.startswith("memory creep: host memory (resident set) grew 228 MiB") for f in run_findings(view))


def test_the_window_is_compared_with_the_untraced_steps_only():
    seconds = [0.3, 0.2] + [0.010] * 8 + [0.013] * 5 + [0.010] * 20
    traced = [False] * 35
    for n in range(9, 16):
        traced[n - 1] = True  # warm-up 9-10, window 11-15
    record = steps(seconds, traced=traced)
    w = window_view(record, window=range(11, 16))
    assert (w.first, w.last, w.steps) == (11, 15, 5)
    assert w.ratio == pytest.approx(1.3) and w.representative is False and w.percentile == 1.0
    view = rank_run_view(record, window=range(11, 16))
    assert view.steady_untraced and view.steady_steps == 26 and view.traced_steps == 7
    assert view.median_s == pytest.approx(0.010)
    # a run perfscope ended with its window has nothing to compare it with
    short = steps([0.3, 0.2, 0.010] + [0.013] * 7, traced=[False] * 3 + [True] * 7)  # the default schedule
    ended = rank_run_view(short, window=range(6, 11))
    assert ended.window.ratio is None and not ended.steady_untraced
    assert "`--max-steps 0`" in run_findings(ended)[0]


def test_a_long_run_keeps_a_bounded_curve_and_an_even_sample():
    record = steps([0.01] * 5000)
    view = rank_run_view(record, window=[])
    assert len(view.curve) == run_view.CURVE_POINTS
    assert len(view.sample_s) <= run_view.SAMPLE_STEPS and len(view.sample_s) > run_view.SAMPLE_STEPS // 2  # one stride


# ----------------------------------------------------------------------------- end to end

LOOP = """
import sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(512, 8), torch.randn(512, 1)), batch_size=4)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for it, (x, y) in enumerate(loader, 1):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    if it % 12 == 0:
        time.sleep(0.25)  # a periodic task: lands in the next step, before its fetch
    if it == 100:
        break
"""


@pytest.mark.slow
@pytest.mark.parametrize("busy", [False, True], ids=["as-is", "beside-two-busy-processes-on-one-core"])
def test_profile_times_every_step_of_the_run_and_reports_it(tmp_path, busy, request):
    pytest.importorskip("torch")
    if busy:
        request.getfixturevalue("busy_core")
    script = tmp_path / "train.py"
    script.write_text(LOOP)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "perfscope", "profile", "--out", str(out), "--max-steps", "0",
                           "--skip-first", "2", "--warmup", "1", "--active", "3", "--extend-s", "0", str(script)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          preexec_fn=on_one_core if busy else None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = read_run_steps(out / "traces" / "rank0.pt.trace.json.gz").steps
    assert [s.step for s in record] == list(range(1, 101))
    traced = [s.step for s in record if s.traced]
    # step 2: its FLOPs counted; 3: the warm-up; 4-6 the window, which may have grown on a busy machine
    assert traced[:5] == [2, 3, 4, 5, 6]
    assert all(s.input > 0 and s.backward > 0 and s.optimizer > 0 for s in record[1:])
    assert all(s.input + s.forward + s.backward + s.optimizer <= s.own + 1e-6 for s in record)
    assert any(s.profiler > 0 for s in record)  # the trace was written at a boundary
    summary = json.loads((out / "summary.json").read_text())
    (view,) = summary["details"]["run_steps"]
    assert view["steps"] == 100 and view["window"]["first"] == 4
    slow = {r["step"] for r in view["slow_steps"]}
    slept = {13, 25, 37, 49, 61, 73, 85, 97}  # the sleep after step 12k lands in step 12k + 1
    late = {n for n in slept if n > max(traced) + 1}  # the steps the profiler did not trace
    assert len(late) >= 3 and late <= slow
    assert all(r["phase"] == "other" for r in view["slow_steps"] if r["step"] in late)
    assert view["periodic"] is not None and view["periodic"]["every"] == 12, [(r["step"], r["phase"]) for r in view["slow_steps"]]
    assert "whole run: 100 steps" in proc.stdout and "a slow step every 12 steps" in proc.stdout
    html = (out / "report.html").read_text()
    assert 'id="run"' in html and "Whole run" in html and "profiled window" in html
    # check compares every step where both runs have them: the plumbing on this run's record, the
    # statistics on a steady sample (this loop's sleeps make its own steps too spread to show a
    # 30% shift at 1% on every machine): a run whose every step is 30% slower fails the gate
    import math

    median = view["median_s"]
    steady = [median * (1 + 0.02 * math.sin(k)) for k in range(60)]
    for name, factor in (("baseline", 1.0), ("slower", 1.3)):
        record = json.loads((out / "summary.json").read_text())
        for v in record["details"]["run_steps"]:
            v["sample_s"] = [t * factor for t in steady]
        for row in record["steps"]:
            row["step_time_us"] *= factor
        (tmp_path / f"{name}.json").write_text(json.dumps(record))
    check = subprocess.run([sys.executable, "-m", "perfscope", "check", str(tmp_path / "slower.json"), "--baseline",
                            str(tmp_path / "baseline.json"), "--all-steps"], cwd=ROOT, capture_output=True, text=True,
                           timeout=HANG_TIMEOUT_S)
    assert check.returncode == 1, check.stdout + check.stderr
    assert "60 and 60 steps of the whole runs" in check.stdout and "REGRESSION" in check.stdout
    assert "smallest slowdown found 80% of the time" in check.stdout


def test_a_malformed_line_is_counted_and_named_and_the_whole_run_view_kept(tmp_path):
    import perfscope
    from tracegen import step, write_trace

    trace = write_trace(tmp_path / "rank0.pt.trace.json", [step(n, 100 * (n - 1), 90) for n in range(1, 4)])
    lines = [encode_run_step(RunStep(step=n, end=0.01 * n, seconds=0.01, forward=0.005)) for n in range(1, 41)]
    lines[7] = b'[8,"hand-edited",0.01]\n'
    (tmp_path / "rank0.run.jsonl").write_bytes(b"".join(lines) + lines[0][:6])  # and a torn last line
    a = perfscope.analyze(trace)
    (view,) = a.details.run_steps
    assert view.steps == 39
    (entry,) = [e for e in a.traces[0].data_quality if e.reason == run_view.MALFORMED_LINES]
    assert (entry.action, entry.count, entry.unit, entry.examples) == (
        "dropped", 2, "line", {"rank0.run.jsonl": 2})
    assert any(w.startswith("rank0.pt.trace.json: 2 lines dropped: torn or malformed lines") for w in a.warnings)


def test_a_closures_forward_and_backward_inside_the_optimizer_are_theirs(tmp_path, clock):
    # optimizer.step(closure): 1 ms before it, then inside it 8 ms forward, 16 ms backward, 2 ms update
    t = run_timer.RunTimer(tmp_path / "r.run.jsonl")
    t.start()
    clock.run(1)
    t.optimizer_begin()
    clock.run(8)
    t.backward_begin(); clock.run(16); t.backward_end()  # noqa: E702
    clock.run(2)
    t.optimizer_end()
    t.step_end()
    t.flush()
    (s,) = read_run_steps(tmp_path / "r.pt.trace.json.gz").steps
    assert (s.forward, s.backward, s.optimizer) == pytest.approx((0.009, 0.016, 0.002))
    assert s.seconds == pytest.approx(0.027)


def test_time_before_the_models_call_is_other_and_only_the_first_call_starts_a_forward(tmp_path, clock):
    t = run_timer.RunTimer(tmp_path / "r.run.jsonl")
    t.start()
    clock.run(10)  # a batch made by hand, no DataLoader
    t.forward_begin(); clock.run(6); t.forward_begin(); clock.run(2)  # noqa: E702 - a second call: same forward
    t.backward_begin(); t.forward_begin(); clock.run(16); t.backward_end()  # noqa: E702 - a recomputation
    t.fetch_begin(); t.forward_begin(); clock.run(4); t.fetch_end()  # noqa: E702 - the dataset's module
    clock.run(3)  # moving the batch: other
    t.forward_begin(); clock.run(8)  # noqa: E702 - the next micro-batch
    t.backward_begin(); clock.run(16); t.backward_end()  # noqa: E702
    t.optimizer_begin(); clock.run(2); t.optimizer_end()  # noqa: E702
    t.step_end()
    t.flush()
    (s,) = read_run_steps(tmp_path / "r.pt.trace.json.gz").steps
    assert (s.input, s.forward, s.backward, s.optimizer) == pytest.approx((0.004, 0.016, 0.032, 0.002))
    assert s.other == pytest.approx(0.013)


HAND_MADE_BATCH = """
import time, torch
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for it in range(30):
    t = time.perf_counter()
    while time.perf_counter() - t < 0.02:  # 20 ms making the batch by hand, no DataLoader
        pass
    loss = model(torch.randn(32, 64)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.mark.slow
def test_a_batch_made_without_a_dataloader_is_other_not_forward(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(HAND_MADE_BATCH)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "perfscope", "profile", "--out", str(out), "--max-steps", "0",
                           str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = read_run_steps(out / "traces" / "rank0.pt.trace.json.gz").steps
    assert len(record) == 30
    # the loop's 20 ms of wall time are other in every step, whatever the load (a forward counted from
    # the step's start would hold them, and other next to nothing)
    assert all(s.other >= 0.019 for s in record[1:]), [(s.forward, s.other) for s in record]
