"""Hand-written trace cases: damaged input. Traces without events, truncated JSON and gzip files,
garbage bytes, malformed events and out-of-range values give a clear error or are read as far as
they are sound (see tracekit.py)."""

from __future__ import annotations

import gzip

import pytest
from tracegen import annotation, cpu_op, launch, step, trace_bytes
from tracekit import analyze, check_partition, only_row

import perfscope
from perfscope.errors import TraceFormatError

# ---------------------------------------------------------------- no events


def test_metadata_only_trace_is_a_clear_error(tmp_path):
    events = [
        {"ph": "M", "name": "process_name", "pid": 100, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": 100, "tid": 1, "args": {"name": "main"}},
    ]
    with pytest.raises(TraceFormatError, match="no events"):
        analyze(tmp_path, events)


def test_empty_trace_is_a_clear_error(tmp_path):
    (tmp_path / "empty.json").write_text('{"traceEvents": []}')
    with pytest.raises(TraceFormatError, match="no events"):
        perfscope.analyze(tmp_path / "empty.json")


# ---------------------------------------------------------------- truncated and garbage files


def _many_steps(n_steps=40):
    events = []
    for n in range(n_steps):
        t0 = 100 * n
        events += [step(n + 1, t0, 100), cpu_op("aten::mm", t0 + 5, 80), cpu_op("aten::add", t0 + 90, 5)]
    return events


def test_truncated_json_keeps_complete_events(tmp_path):
    events = _many_steps(3)  # 9 events, one per line
    data = trace_bytes(events, schemaVersion=1)
    last = data.rfind(b'"name"')  # inside the last event: aten::add of step 3
    path = tmp_path / "cut.json"
    path.write_bytes(data[:last + 3])
    a = perfscope.analyze(path)
    assert a.traces[0].events == 8  # the last event is lost
    assert any("truncated" in w for w in a.warnings)
    assert list(a.steps["step"]) == [1, 2, 3]
    assert a.steps.iloc[0]["operator_us"] == pytest.approx(85)  # 80 + 5
    assert a.steps.iloc[2]["operator_us"] == pytest.approx(80)  # aten::add of step 3 is gone


def test_truncated_gzip_keeps_complete_events(tmp_path):
    events = _many_steps(200)
    data = gzip.compress(trace_bytes(events, schemaVersion=1))
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[: len(data) * 3 // 5])
    a = perfscope.analyze(path)
    assert any("truncated" in w for w in a.warnings)
    assert 0 < a.traces[0].events < len(events)
    check_partition(a.steps)


@pytest.mark.parametrize("content", [b"\x00\x01\x02 not a trace \xff", b"<html>oops</html>", b"\x1f\x8b\x08\x00garbage"])
def test_garbage_is_a_trace_format_error(tmp_path, content):
    path = tmp_path / ("bad.json.gz" if content.startswith(b"\x1f\x8b") else "bad.json")
    path.write_bytes(content)
    with pytest.raises(TraceFormatError):
        perfscope.analyze(path)


# ---------------------------------------------------------------- malformed events and values


@pytest.mark.parametrize(
    "bad",
    [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100, "tid": 1, "ts": "abc", "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100, "tid": 1, "ts": None, "dur": 5},
    ],
    ids=["ts-string", "ts-null"],
)
def test_event_without_a_usable_time_is_dropped_and_counted(tmp_path, bad):
    events = [step(1, 0, 100), *launch("k", 1, 10, 30, correlation=1), bad]
    a = analyze(tmp_path, events)
    # the bad event is left out: the step is still [0, 100) with compute [10, 40)
    row = only_row(a)
    assert row["step_time_us"] == pytest.approx(100)
    assert row["compute_us"] == pytest.approx(30)
    (entry,) = [e for e in a.traces[0].data_quality if e.action == "dropped"]
    assert entry.count == 1 and entry.examples == {"aten::mm": 1}
    assert any("1 event dropped: missing, non-numeric or out-of-range ts or dur" in w for w in a.warnings)


def test_gpu_event_with_args_that_are_not_an_object_keeps_its_stream_from_pid_and_tid(tmp_path):
    # args "oops": no correlation, device or stream in it; pid 0 and tid 7 still say GPU 0, stream 7
    bad = {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 20, "dur": 5, "args": "oops"}
    events = [step(1, 0, 100), *launch("k", 1, 10, 30, correlation=1), bad]
    row = only_row(analyze(tmp_path, events))
    # k [10, 40) and gemm [20, 25) cannot both run on stream 7: k is clipped at 20 (repair 6);
    # compute = [10, 20) + [20, 25) = 15
    assert row["compute_us"] == pytest.approx(15)


def test_out_of_range_values_are_skipped_not_overflowed(tmp_path):
    events = [
        step(1, 0, 100), cpu_op("aten::mm", 10, 50),
        cpu_op("aten::huge_dur", 20, 1e17), cpu_op("aten::far_future", 1e16, 5),
        annotation("ProfilerStep#99999999999999999999", 0, 10),  # not an int64 step number
        {"ph": "X", "cat": ["odd"], "name": ["odd"], "pid": 100, "tid": 1, "ts": 30, "dur": 5},
    ]
    a = analyze(tmp_path, events)
    row = only_row(a)
    assert row["step"] == 1
    assert row["step_time_us"] == pytest.approx(100)
    assert any("1 event dropped: missing, non-numeric or out-of-range ts or dur (aten::far_future" in w for w in a.warnings)
    assert any("1 event dropped: duration longer than a day (aten::huge_dur" in w for w in a.warnings)
    assert any("1 ProfilerStep# marker with a number that is not a step number" in w for w in a.warnings)
    assert any("1 event not read: category perfscope does not know (['odd']" in w for w in a.warnings)
