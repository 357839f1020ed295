"""The field's viewers: `perfscope merge` puts several ranks' traces in one file on one clock for
Perfetto, and perfscope's output folder still loads with the TensorBoard profiler plugin's own
loader -- a check of the trace layout (the plugin was removed from kineto in 2026; its last
release, torch-tb-profiler 0.4.3, is what this loads with)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from tracegen import cpu_op, launch, step, write_trace

import perfscope
from perfscope.trace.merge import MERGED_NAME, PID_STRIDE, merge_traces
from test_bad_input import assert_one_line_error, run_cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_tensorboard_profiler_plugin_loads_a_profile_output(tmp_path):
    pytest.importorskip("torch_tb_profiler")
    pytest.importorskip("torch")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "perfscope", "profile", "--out", out, ROOT / "examples" / "compute_bound.py",
                        "--", "--steps", "12"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    loaded = subprocess.run([sys.executable, ROOT / "tests" / "scripts" / "tb_plugin_load.py", out / "traces"],
                            capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    found = json.loads(loaded.stdout.strip().splitlines()[-1])
    summary = json.loads((out / "summary.json").read_text())
    (profile,) = found["profiles"]
    assert profile["worker"] == "rank0"
    assert [int(s) for s in profile["steps"]] == [s["step"] for s in summary["steps"]]


def two_ranks(tmp_path, base1_ns=1_000_000_000_000):
    """Two ranks' traces, rank 1's base time 2 ms after rank 0's; a launch -> kernel flow in each."""
    files = []
    for rank, base in ((0, base1_ns), (1, base1_ns + 2_000_000)):
        events = [step(1, 0, 1000), cpu_op("aten::mm", 5, 100), *launch("gemm", 10, 20, 900, correlation=7),
                  {"ph": "s", "id": 7, "pid": 99, "tid": 1, "ts": 10, "name": "ac2g", "cat": "ac2g"},
                  {"ph": "M", "name": "process_name", "pid": 99, "args": {"name": "python"}}]
        files.append(write_trace(tmp_path / f"rank{rank}.json", events, baseTimeNanoseconds=base,
                                 distributedInfo={"backend": "nccl", "rank": rank, "world_size": 2}))
    return files


def test_merge_moves_ranks_onto_one_clock_and_keeps_them_apart(tmp_path):
    files = two_ranks(tmp_path)
    merged, lines = merge_traces(files)
    ev = merged["traceEvents"]
    steps = {e["pid"] // PID_STRIDE - 1: e["ts"] for e in ev if e.get("name") == "ProfilerStep#1"}
    assert steps == {0: 0, 1: 2000}  # rank 1's step starts 2 ms later on the shared clock
    flows = sorted(e["id"] for e in ev if e.get("ph") == "s")
    assert flows == ["0:7", "1:7"]
    names = {e["pid"]: e["args"]["name"] for e in ev if e.get("name") == "process_name"}
    assert "rank 0: python" in names.values() and "rank 1: python" in names.values()
    assert len({e["pid"] for e in ev if "pid" in e}) == len({(e["pid"]) for e in ev if "pid" in e})
    assert lines[1].startswith("rank 1: rank1.json") and "+2000.0 µs" in lines[1]
    merged, _ = merge_traces(files, node_offsets_us={1: 2000.0})
    assert {e["pid"] // PID_STRIDE - 1: e["ts"] for e in merged["traceEvents"]
            if e.get("name") == "ProfilerStep#1"} == {0: 0, 1: 0}


def test_merge_command_writes_a_view_that_analyze_leaves_out(tmp_path):
    run = tmp_path / "out"
    two_ranks((run / "traces").mkdir(parents=True) or run / "traces")
    r = run_cli(tmp_path, "merge", run)  # an output directory: the view goes into it
    assert r.returncode == 0, r.stderr
    out = run / MERGED_NAME
    assert "ui.perfetto.dev" in r.stdout and out.is_file()
    data = orjson.loads(gzip.decompress(out.read_bytes()))
    assert data["perfscope_merged"]["ranks"] == [0, 1]
    assert perfscope.analyze(run).ranks_analyzed == 2  # the merged view is not a third rank
    assert run_cli(tmp_path, "analyze", run / "traces", "--out", run).returncode == 0  # run/summary.json
    again = run_cli(tmp_path, "merge", run / "traces")  # the traces/ folder of an output: that output
    assert "replaced" in again.stdout and f"replaced {out}" in again.stdout
    assert sorted(p.name for p in (run / "traces").iterdir()) == ["rank0.json", "rank1.json"]


def test_merge_never_writes_into_a_folder_of_traces_by_default(tmp_path):
    traces = tmp_path / "shared-traces"
    traces.mkdir()
    two_ranks(traces)
    work = tmp_path / "work"
    work.mkdir()
    r = run_cli(work, "merge", traces)
    assert r.returncode == 0, r.stderr
    (written,) = (work / "perfscope-out").glob(f"merge-*/{MERGED_NAME}")
    assert f"wrote {written}" in r.stdout
    assert sorted(p.name for p in traces.iterdir()) == ["rank0.json", "rank1.json"]


def test_merge_refuses_two_files_of_one_rank_and_non_traces(tmp_path):
    files = two_ranks(tmp_path)
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "again.json").write_bytes(files[0].read_bytes())
    r = run_cli(tmp_path, "merge", files[0], tmp_path / "copy" / "again.json")
    assert_one_line_error(r)
    assert "several traces claim rank 0" in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert_one_line_error(run_cli(tmp_path, "merge", bad))


def test_a_merged_view_under_any_name_is_left_out_and_inputs_are_never_overwritten(tmp_path):
    files = two_ranks(tmp_path)
    before = files[0].read_bytes()
    r = run_cli(tmp_path, "merge", tmp_path, "--out", files[0])
    assert_one_line_error(r)
    assert "one of the inputs" in r.stderr and files[0].read_bytes() == before
    assert run_cli(tmp_path, "merge", tmp_path, "--out", tmp_path / "all.json.gz").returncode == 0
    a = perfscope.analyze(tmp_path)
    assert a.ranks_analyzed == 2 and any("merged by perfscope merge" in s.reason for s in a.skipped)
    again = run_cli(tmp_path, "merge", tmp_path)
    assert again.returncode == 0, again.stderr
    assert "left out all.json.gz: a view merged earlier" in again.stdout
    alone = run_cli(tmp_path, "analyze", tmp_path / "all.json.gz")
    assert_one_line_error(alone)


def test_a_trace_without_a_base_time_keeps_its_times(tmp_path):
    files = two_ranks(tmp_path)
    data = orjson.loads(files[1].read_bytes())
    del data["baseTimeNanoseconds"]
    files[1].write_bytes(orjson.dumps(data))
    merged, lines = merge_traces(files)
    assert "no baseTimeNanoseconds: times kept as written" in lines[1]
    assert {e["pid"] // PID_STRIDE - 1: e["ts"] for e in merged["traceEvents"]
            if e.get("name") == "ProfilerStep#1"} == {0: 0, 1: 0}


def test_merge_takes_an_analyze_output_directory(tmp_path):
    two_ranks(tmp_path)
    assert run_cli(tmp_path, "analyze", tmp_path, "--out", tmp_path / "out").returncode == 0
    r = run_cli(tmp_path, "merge", tmp_path / "out", "--out", tmp_path / "m.json.gz")
    assert r.returncode == 0, r.stderr
    assert orjson.loads(gzip.decompress((tmp_path / "m.json.gz").read_bytes()))["perfscope_merged"]["ranks"] == [0, 1]
