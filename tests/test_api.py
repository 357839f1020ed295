"""The Python API: analysis without torch, the frame's shape, and re-rendering from the summary."""

from __future__ import annotations

import subprocess
import sys

import orjson

import perfscope
from perfscope.record import load_summary, write_summary
from perfscope.reports import render_report
from tracegen import annotation, cpu_op, kernel, runtime, write_trace


def small_gpu_trace(path):
    events = []
    for i, t0 in enumerate((0, 1000)):
        events += [
            annotation(f"ProfilerStep#{i + 1}", t0, 1000),
            cpu_op("aten::mm", t0 + 100, 200),
            runtime("cudaLaunchKernel", t0 + 110, 20, correlation=10 + i),
            kernel("gemm", t0 + 150, 600, correlation=10 + i),
        ]
    return write_trace(path, events)


def test_analysis_never_imports_torch(tmp_path):
    trace = small_gpu_trace(tmp_path / "t.json")
    code = (
        "import sys, perfscope; a = perfscope.analyze(sys.argv[1]); a.summary(); "
        "import perfscope.outputs, reports; reports.render_report(a.summary()); "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code, str(trace)], check=True)


def test_frame_has_one_row_per_rank_and_step(tmp_path):
    a = perfscope.analyze(small_gpu_trace(tmp_path / "t.json"))
    assert list(a.steps["step"]) == [1, 2]
    assert set(a.steps["rank"]) == {0}
    assert {"step_time_us", "gpu_busy_us", "gpu_busy_frac", "verdict", "runner_up"} <= set(a.steps.columns)
    # kernel 600 us of a 1000 us window; the rest of the window the GPU waits for the host
    assert a.steps["gpu_busy_us"].tolist() == [600.0, 600.0]


def test_summary_round_trip_re_renders_without_traces(tmp_path):
    trace = small_gpu_trace(tmp_path / "t.json")
    summary = perfscope.analyze(trace).summary()
    write_summary(summary, tmp_path / "out" / "summary.json")
    trace.unlink()
    loaded = load_summary(tmp_path / "out")
    assert loaded == orjson.loads(orjson.dumps(summary))
    html = render_report(loaded)
    assert loaded["overall"]["verdict"] in html
