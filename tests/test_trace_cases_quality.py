"""Hand-written trace cases: corrupt durations and copies of events are repaired in the documented
order, and every repair lands in the data-quality record of summary.json and the report (see
tracekit.py for the conventions)."""

from __future__ import annotations

import json

import pytest
from tracegen import cpu_op, kernel, launch, memcpy, runtime, step, write_trace
from tracekit import analyze, check_partition, only_row

import perfscope
from perfscope.analysis import chunked
from perfscope.reports import render_report


def _entry(a, reason_part, action=None):
    hits = [e for e in a.summary()["data_quality"] if reason_part in e["reason"] and (action is None or e["action"] == action)]
    assert len(hits) == 1, a.summary()["data_quality"]
    return hits[0]


def test_a_kernel_overrunning_the_next_one_on_its_stream_is_clipped(tmp_path):
    # step [0, 2000): k1 launched at 1 starts at 10 and claims 3.1 s; k2 on the same stream starts at 60,
    # 50 us after k1 began. A stream runs one kernel at a time: k1 ends at 60 at the latest.
    events = [step(1, 0, 2000), *launch("k1", 1, 10, 3_100_000, correlation=1),
              *launch("k2", 2, 60, 40, correlation=2), cpu_op("aten::mm", 0, 1990)]
    a = analyze(tmp_path, events)
    row = only_row(a)
    assert row["step_time_us"] == pytest.approx(2000)  # not 3.1 s
    assert row["compute_us"] == pytest.approx(90)  # [10, 60) + [60, 100)
    e = _entry(a, "runs past the start of the next event on its stream", "clipped")
    assert e["count"] == 1 and e["examples"] == {"k1": 1}


def test_kernels_on_two_streams_may_overlap(tmp_path):
    events = [step(1, 0, 200), *launch("a", 1, 10, 100, correlation=1, stream=7),
              *launch("b", 2, 20, 50, correlation=2, stream=13)]
    a = analyze(tmp_path, events)
    assert only_row(a)["compute_us"] == pytest.approx(100)  # the union [10, 110)
    assert not [e for e in a.summary()["data_quality"] if e["action"] == "clipped"]


def test_negative_absurd_and_zeroed_events_are_not_counted_as_work(tmp_path):
    events = [
        step(1, 0, 100), cpu_op("aten::mm", 10, 40),  # [10, 50): the only real work
        cpu_op("aten::negative", 60, -30),
        cpu_op("aten::absurd", 60, 3 * 86_400e6),  # three days
        {"ph": "X", "cat": "cpu_op", "name": "aten::lost", "pid": 100, "tid": 1, "ts": 0, "dur": 0},
    ]
    a = analyze(tmp_path, events)
    row = only_row(a)
    assert row["operator_us"] == pytest.approx(40)
    assert row["framework_overhead_us"] == pytest.approx(60)
    assert _entry(a, "negative duration", "dropped")["examples"] == {"aten::negative": 1}
    assert _entry(a, "duration longer than a day", "dropped")["examples"] == {"aten::absurd": 1}
    assert _entry(a, "ts and dur both 0", "set aside")["count"] == 1
    assert a.traces[0].events == 2  # the step marker and aten::mm


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
def test_every_event_written_twice_is_counted_once(tmp_path, gpu):
    events = [step(1, 0, 100), cpu_op("aten::mm", 10, 40), cpu_op("aten::add", 60, 10)]
    if gpu:
        events += launch("gemm", 20, 30, 20, correlation=5)
    a = analyze(tmp_path, events + [dict(e) for e in events])
    row = only_row(a)
    if gpu:
        assert row["kernel_count"] == 1 and row["compute_us"] == pytest.approx(20)
    else:
        assert row["operator_count"] == 2  # not 4
    assert _entry(a, "exact copy of an earlier event", "dropped")["count"] == len(events)
    assert not any("step marker repeated" in w for w in a.warnings)  # the copies are gone before steps are found


def test_two_ops_that_differ_only_in_args_are_both_kept(tmp_path):
    a1 = cpu_op("aten::empty", 10, 0)
    a2 = dict(cpu_op("aten::empty", 10, 0), args={"External id": 2})
    a1["args"] = {"External id": 1}
    row = only_row(analyze(tmp_path, [step(1, 0, 100), a1, a2]))
    assert row["operator_count"] == 2


@pytest.mark.parametrize("chunk_rows", [None, 1, 3])
def test_the_record_counts_what_the_analysis_could_not_place(tmp_path, monkeypatch, chunk_rows):
    if chunk_rows:  # rows are counted a chunk at a time (perfscope.analysis.chunked): any cut gives the same
        monkeypatch.setattr(chunked, "CHUNK_ROWS", chunk_rows)
    events = [
        cpu_op("aten::before", 0, 5),  # before the first step
        step(1, 10, 100), cpu_op("aten::mm", 20, 30),
        cpu_op("aten::straddles", 90, 40),  # starts in step 1 [10, 110), ends at 130 in step 2
        step(2, 110, 100), cpu_op("aten::mm", 140, 30),
        runtime("cudaLaunchKernel", 30, 2, correlation=1), kernel("gemm", 40, 20, correlation=1),
        kernel("orphan", 150, 10, correlation=None),  # no launch record
    ]
    a = analyze(tmp_path, events)
    check_partition(a.steps)
    assert _entry(a, "outside every step")["examples"] == {"aten::before": 1}
    assert _entry(a, "start in one step and end after it")["examples"] == {"aten::straddles": 1}
    assert _entry(a, "GPU events without a launch record")["examples"] == {"orphan": 1}


def test_the_record_is_in_summary_json_and_the_report(tmp_path):
    events = [step(1, 0, 100), cpu_op("aten::mm", 10, 40), cpu_op("aten::neg", 60, -3)]
    path = write_trace(tmp_path / "t.json", events)
    a = perfscope.analyze(path)
    s = json.loads(json.dumps(a.summary()))  # JSON-able as written
    assert s["schema_version"] == 2
    (e,) = [x for x in s["data_quality"] if x["action"] == "dropped"]
    assert e == {"action": "dropped", "reason": "negative duration", "unit": "event", "count": 1, "traces": 1,
                 "examples": {"aten::neg": 1}}
    assert s["traces"][0]["data_quality"][0]["reason"] == "negative duration"
    html = render_report(s, find_traces=False)
    top = html.split('<section id="verdict"')[0]
    assert 'id="warnings"' in top and "1 event dropped: negative duration" in top  # warnings before the verdict
    quality = html.split('id="quality"')[1].split("</section>")[0]
    assert "negative duration" in quality and "aten::neg (1)" in quality


def test_zero_duration_copies_are_counted_but_not_in_the_bandwidth(tmp_path):
    # two H2D copies of 1 MB: one takes 10 us, one is recorded with 0 us
    c1 = memcpy("Memcpy HtoD (Pinned -> Device)", 10, 10, correlation=1)
    c2 = memcpy("Memcpy HtoD (Pinned -> Device)", 30, 0, correlation=2)
    for c in (c1, c2):
        c["args"]["bytes"] = 1_000_000
    events = [step(1, 0, 100), runtime("cudaMemcpyAsync", 1, 1, correlation=1),
              runtime("cudaMemcpyAsync", 25, 1, correlation=2), c1, c2]
    (h2d,) = analyze(tmp_path, events).details.memcpy
    assert h2d.count == 2 and h2d.zero_duration == 1
    assert h2d.bytes == 2_000_000
    assert h2d.gb_per_s == pytest.approx(1e6 / 1e9 / 10e-6)  # 1 MB in 10 us = 100 GB/s, not 200
