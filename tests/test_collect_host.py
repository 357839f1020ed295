"""Collection: the host's CPU time per step is recorded in perfscope's own traces and read back by
the analysis. Each test profiles a tiny script in this process (live, on the CPU).
"""

from __future__ import annotations

import gzip
import json

import pytest

torch = pytest.importorskip("torch")

from collectkit import SMALL, loop_script, profiler_steps, trace_events  # noqa: E402

import perfscope  # noqa: E402
from perfscope.collect import collect  # noqa: E402
from perfscope.record.host_steps import FIELDS, HOST_STEPS_KEY  # noqa: E402


def test_profile_records_cpu_time_beside_wall_time_for_every_profiled_step(tmp_path):
    result = collect(loop_script(tmp_path), [], out_dir=tmp_path / "out", schedule=SMALL)
    (trace,) = result.trace_files
    with gzip.open(trace, "rt") as f:
        header = json.load(f)[HOST_STEPS_KEY]
    assert header["version"] == 1
    by_step = {s["step"]: s for s in header["steps"]}
    recorded = [int(s["name"].split("#")[1]) for s in profiler_steps(trace_events(trace))]
    assert recorded == [3, 4, 5] and set(recorded) <= set(by_step)
    for n in recorded:
        rec = by_step[n]
        assert set(FIELDS) <= set(rec)
        assert rec["wall_us"] > 0 and rec["thread_cpu_us"] > 0
        # a thread cannot get more CPU time than the wall-clock time that passed (1 ms of slack for
        # the two clocks being read one after the other)
        assert rec["thread_cpu_us"] <= rec["wall_us"] + 1000
    a = perfscope.analyze(trace)
    assert a.traces[0].host_steps_recorded >= 3
    # either is a fair reading of this machine; on a busy one the profiler's stop can come long after
    # the last step's few events, and that step reads as running past the trace's end
    statuses = a.steps["status"].tolist()
    assert set(statuses[:-1]) <= {"ok", "host-contended"}, a.steps
    last = a.steps.iloc[-1]
    assert last["status"] in ("ok", "host-contended") or "past the last event" in last["status_reason"], last
