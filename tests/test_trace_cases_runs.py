"""Hand-written trace cases: runs of several trace files. Ranks from distributedInfo or the file
name, steps that must agree across ranks, TensorBoard windows of one worker, and a folder holding
an earlier summary beside its traces (see tracekit.py)."""

from __future__ import annotations

import json

import pytest
from tracegen import cpu_op, launch, step, write_trace
from tracekit import check_partition

import perfscope
from perfscope.errors import AnalysisError

# ---------------------------------------------------------------- ranks


def _rank_trace(tmp_path, rank, first_step):
    events = []
    for i in range(2):
        n, t0 = first_step + i, 100 * i
        events += [step(n, t0, 100), *launch("gemm", t0 + 1, t0 + 5, 90, correlation=10 * n)]
    return write_trace(tmp_path / f"worker{'ab'[rank]}.pt.trace.json", events,
                       distributedInfo={"backend": "nccl", "rank": rank, "world_size": 2})


def test_two_ranks(tmp_path):
    _rank_trace(tmp_path, 0, 1)
    _rank_trace(tmp_path, 1, 1)
    a = perfscope.analyze(tmp_path)
    assert list(a.steps["rank"]) == [0, 0, 1, 1]
    assert list(a.steps["step"]) == [1, 2, 1, 2]
    assert a.world_size == 2
    check_partition(a.steps)
    assert list(a.steps["compute_us"]) == pytest.approx([90] * 4)  # [t0+5, t0+95) in every step


def test_ranks_with_different_steps_are_an_error(tmp_path):
    _rank_trace(tmp_path, 0, 1)
    _rank_trace(tmp_path, 1, 5)
    with pytest.raises(AnalysisError, match="step"):
        perfscope.analyze(tmp_path)


def test_ranks_that_stopped_at_different_steps_keep_the_common_ones(tmp_path):
    from perfscope.analysis.run import analyze_files

    def rank_trace(rank, steps):
        events = [e for n in steps for e in (step(n, 100 * n, 100), cpu_op("aten::mm", 100 * n + 5, 90))]
        return write_trace(tmp_path / f"rank{rank}.json", events, distributedInfo={"rank": rank, "world_size": 2})

    files = [rank_trace(0, [6, 7, 8, 9]), rank_trace(1, [6, 7, 8])]
    with pytest.raises(AnalysisError):
        analyze_files(files)
    a = analyze_files(files, common_steps_only=True)
    assert sorted(set(a.steps["step"])) == [6, 7, 8]
    assert len(a.steps) == 6
    assert any("different steps" in n for n in a.notes)


@pytest.mark.parametrize(
    "name, rank",
    [("trace_rank1_20240101.json", 1), ("rank-3.json", 3), ("rank_12.pt.trace.json", 12), ("frankfurt-node3_1234.json", None)],
)
def test_rank_from_file_name(tmp_path, name, rank):
    from perfscope.trace import build_table, read_trace

    table = build_table(read_trace(write_trace(tmp_path / name, [step(1, 0, 10)])))
    assert table.rank == rank


# ---------------------------------------------------------------- layouts


def test_directory_with_a_previous_summary_analyzes_its_traces(tmp_path):
    # `perfscope profile --out D` leaves D/traces/*.pt.trace.json.gz next to D/summary.json
    (tmp_path / "traces").mkdir()
    write_trace(tmp_path / "traces" / "rank0.pt.trace.json.gz", [step(1, 0, 100), *launch("k", 1, 5, 90, 1)])
    first = perfscope.analyze(tmp_path / "traces")
    (tmp_path / "summary.json").write_text(json.dumps(first.summary()))
    a = perfscope.analyze(tmp_path)
    assert len(a.steps) == 1
    assert a.steps.iloc[0]["compute_us"] == pytest.approx(90)


def test_two_windows_of_one_worker_are_one_rank(tmp_path):
    # TensorBoard layout <worker>.<span>.pt.trace.json: no distributedInfo, same worker name
    for span, first in ((1, 1), (2, 3)):
        events = []
        for i in range(2):
            n, t0 = first + i, 100 * i
            events += [step(n, t0, 100), *launch("gemm", t0 + 1, t0 + 5, 90, correlation=n)]
        write_trace(tmp_path / f"host_123.{span}.pt.trace.json", events)
    a = perfscope.analyze(tmp_path)
    assert list(a.steps["rank"]) == [0, 0, 0, 0]
    assert list(a.steps["step"]) == [1, 2, 3, 4]
    assert a.world_size == 1


def test_one_step_in_two_traces_of_a_rank_is_an_error(tmp_path):
    _rank_trace(tmp_path, 0, 1)
    write_trace(tmp_path / "again.json", [step(2, 0, 100), *launch("gemm", 1, 5, 90, correlation=1)],
                distributedInfo={"rank": 0, "world_size": 2})
    with pytest.raises(AnalysisError, match="step 2"):
        perfscope.analyze(tmp_path)


def test_rank_without_markers_next_to_marked_rank_is_an_error(tmp_path):
    _rank_trace(tmp_path, 0, 1)  # steps 1, 2
    write_trace(tmp_path / "workerb.pt.trace.json",  # same work, no ProfilerStep# markers
                [*launch("gemm", 1, 5, 90, correlation=1), *launch("gemm", 101, 105, 90, correlation=2)],
                distributedInfo={"backend": "nccl", "rank": 1, "world_size": 2})
    with pytest.raises(AnalysisError):
        perfscope.analyze(tmp_path)
