"""Hand-written trace cases from a hostile pass: shapes no profiler writes on purpose, each of which
once ended in an internal error, a silent wrong number or a slow analysis (see tracekit.py)."""

from __future__ import annotations

import gzip
import sys

import pytest
from test_bad_input import run_cli
from tracegen import annotation, cpu_op, kernel, launch, runtime, step, trace_bytes, write_trace
from tracekit import analyze, check_partition, only_row

import perfscope


def _entries(a, part):
    return [e for e in a.summary()["data_quality"] if part in e["reason"]]


def test_a_list_as_ph_is_counted_not_fatal(tmp_path):
    events = [step(1, 0, 100), cpu_op("aten::mm", 0, 90), {"ph": [], "name": "x"}, {"ph": {"a": 1}}]
    a = analyze(tmp_path, events)
    assert only_row(a)["operator_us"] == pytest.approx(90)
    assert _entries(a, "phase (ph)")[0]["count"] == 2


def test_many_events_alike_but_for_args_are_all_kept(tmp_path):
    # 20,000 zero-length ops with one name, thread, ts and dur, told apart only by args: none is a
    # copy of another (finding them once compared every pair: 80 s)
    events = [step(1, 0, 1000), cpu_op("aten::mm", 500, 400)]
    for i in range(20_000):
        e = cpu_op("aten::empty", 150, 0)
        e["args"] = {"External id": i}
        events.append(e)
    row = only_row(analyze(tmp_path, events))
    assert row["operator_count"] == 20_001


def test_a_complete_event_without_dur_is_dropped_not_zero(tmp_path):
    k = kernel("gemm", 10, 50, correlation=1)
    del k["dur"]
    a = analyze(tmp_path, [step(1, 0, 100), cpu_op("aten::mm", 0, 95), runtime("cudaLaunchKernel", 2, 1, correlation=1), k])
    assert _entries(a, "non-numeric or out-of-range ts or dur")[0]["examples"] == {"gemm": 1}


def test_a_correlation_id_shared_by_many_calls_links_none_of_them(tmp_path):
    # every launch and kernel says correlation 1: which call launched which kernel is unknowable
    events = [step(1, 0, 1000), cpu_op("aten::mm", 0, 990)]
    for i in range(4):
        events += launch("k", 10 + 200 * i, 50 + 200 * i, 100, correlation=1)
    a = analyze(tmp_path, events)
    assert _entries(a, "runtime calls sharing their correlation id")[0]["count"] == 4
    assert _entries(a, "GPU events without a launch record")[0]["count"] == 4
    check_partition(a.steps)


def test_a_float_correlation_is_an_unusable_value(tmp_path):
    events = [step(1, 0, 100), cpu_op("aten::mm", 0, 95), *launch("k", 2, 10, 50, correlation=1.5)]
    a = analyze(tmp_path, events)
    (e,) = _entries(a, "values of args that are not integers")
    assert e["examples"] == {"correlation": 2}  # the call's and the kernel's


def test_truncation_inside_an_event_with_many_braces_is_recovered(tmp_path):
    events = [step(1, 0, 100), cpu_op("aten::mm", 0, 90), step(2, 100, 100), cpu_op("aten::mm", 100, 90)]
    data = trace_bytes(events)
    # the last event is cut after 70 small objects of its args: more ends of objects than any quick try takes
    tail = b',\n  {"ph": "X", "cat": "cpu_op", "name": "aten::x", "args": {"Input Dims": [' + b'{"a": 1}, ' * 70
    path = tmp_path / "t.json"
    path.write_bytes(data[: data.rfind(b"\n  ]")] + tail)
    a = perfscope.analyze(path)
    assert a.traces[0].events == 4 and list(a.steps["step"]) == [1, 2]
    assert any("1 file truncated" in w for w in a.warnings)


def test_nested_and_interleaved_step_markers_get_no_verdict(tmp_path):
    events = []
    for n in range(3):
        s = 1000 * n
        events += [step(n + 1, s, 1000), cpu_op("aten::mm", s, 990)]
    events += [step(99, 2100, 100)]  # a marker nested inside step 3
    events += [annotation(f"ProfilerStep#{n}", 50 + 300 * n, 10, tid=2) for n in range(10, 13)]  # another thread
    a = analyze(tmp_path, events)
    st = a.steps.set_index("step")
    assert list(st.index) == [1, 2, 3, 99]  # the other thread's markers are not steps
    assert st.loc[3, "status"] == "incomplete" and st.loc[99, "status"] == "incomplete"
    assert "overlaps another step" in st.loc[99, "status_reason"]
    assert st.loc[1, "status"] == "ok" and st.loc[2, "status"] == "ok"
    assert any("3 ProfilerStep# markers on another thread than the training loop's ignored" in w for w in a.warnings)


def test_leading_zeros_are_not_a_step_number(tmp_path):
    a = analyze(tmp_path, [step(1, 0, 100), cpu_op("aten::mm", 0, 90), annotation("ProfilerStep#01", 100, 100)])
    assert list(a.steps["step"]) == [1]
    assert any("ProfilerStep#01" in w and "not a step number" in w for w in a.warnings)


def test_names_that_are_not_text_are_counted(tmp_path):
    events = [step(1, 0, 100), cpu_op("aten::mm", 0, 90),
              {"ph": "X", "cat": "cpu_op", "name": {"x": "ProfilerStep#2"}, "pid": 100, "tid": 1, "ts": 5, "dur": 1}]
    a = analyze(tmp_path, events)
    assert list(a.steps["step"]) == [1]
    assert _entries(a, "name or category that is not text")[0]["count"] == 1


def test_a_windows_path_in_a_clean_file_keeps_its_backslashes(tmp_path):
    # "C:\new\tmp" is valid JSON -- a newline and a tab -- but a drive letter says it is a path
    events = [step(1, 0, 100), cpu_op("aten::mm", 0, 90),
              {"ph": "X", "cat": "python_function", "name": "C:\\new\\tmp\\train.py(1): f", "pid": 100, "tid": 1,
               "ts": 5, "dur": 1}]
    data = trace_bytes(events).replace(b"C:\\\\new\\\\tmp\\\\train", b"C:\\new\\tmp\\train")
    path = tmp_path / "t.json"
    path.write_bytes(data)
    a = perfscope.analyze(path)
    assert "C:\\new\\tmp\\train.py(1): f" in set(a.tables[next(iter(a.tables))].names)
    assert _entries(a, "Windows path")[0]["unit"] == "name"


def test_an_event_far_from_the_rest_is_dropped(tmp_path):
    events = [step(1, 1e12, 100), cpu_op("aten::mm", 1e12, 90), cpu_op("aten::far", -3.9e15, 1)]
    a = analyze(tmp_path, events)
    row = only_row(a)
    assert row["step_time_us"] == pytest.approx(100) and row["operator_us"] == pytest.approx(90)
    assert _entries(a, "more than a day from the rest")[0]["examples"] == {"aten::far": 1}
    assert not any("overlap" in w for w in a.warnings)


def test_numbers_past_a_float_are_read_as_null(tmp_path):
    data = trace_bytes([step(1, 0, 100), cpu_op("aten::mm", 0, 90), cpu_op("aten::huge", 5, 1)])
    data = data.replace(b'"aten::huge", "pid": 100, "tid": 1, "ts": 5', b'"aten::huge", "pid": 100, "tid": 1, "ts": 1e400')
    path = tmp_path / "t.json"
    path.write_bytes(data)
    a = perfscope.analyze(path)
    assert only_row(a)["operator_us"] == pytest.approx(90)
    assert _entries(a, "too large for a float")[0]["examples"] == {"1e400": 1}


def test_bytes_after_a_gzip_stream_are_counted(tmp_path):
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(trace_bytes([step(1, 0, 100), cpu_op("aten::mm", 0, 90)])) + b"junk")
    a = perfscope.analyze(path)
    assert any("4 bytes not read: after the gzip stream" in w for w in a.warnings)


def test_plain_text_is_not_called_truncated(tmp_path):
    (tmp_path / "t.json").write_text("hello")
    r = run_cli(tmp_path, "analyze", tmp_path / "t.json", "--out", tmp_path / "o")
    assert r.returncode == 2 and "not a JSON trace" in r.stderr and "truncated" not in r.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="escape characters in file names")
def test_terminal_escapes_in_a_file_name_do_not_reach_the_terminal(tmp_path):
    path = tmp_path / "rank1\x1b[31mRED\x1b]0;pwned\x07\u202e.json"
    path.write_bytes(b'{"traceEvents": [@]}')
    r = run_cli(tmp_path, "analyze", path, "--out", tmp_path / "o")
    assert r.returncode == 2
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr and "\u202e" not in r.stderr
    assert "rank1?[31mRED?]0;pwned??.json" in r.stderr


def test_thousands_of_streams_draw_a_bounded_timeline(tmp_path):
    events = [step(1, 0, 4000), cpu_op("aten::mm", 0, 3990)]
    events += [kernel("k", 10 + (i % 3900), 1, stream=1000 + i) for i in range(5000)]
    path = write_trace(tmp_path / "t.json", events)
    r = run_cli(tmp_path, "analyze", path, "--out", tmp_path / "o")
    assert r.returncode == 0, r.stderr
    html = (tmp_path / "o" / "report.html").read_text()
    from perfscope.reports.timeline_data import MAX_STREAM_LANES

    assert html.count("· stream ") <= MAX_STREAM_LANES * 3  # lane labels (and their tooltips)
    assert "other streams" in html
    assert len(html) < 3_000_000
