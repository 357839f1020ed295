"""Hand-written trace cases: several ranks -- clocks aligned on each file's base time, the
straggler from collective arrivals, files that do not form one job, and header values that are not
what the format says (see tracekit.py for the conventions)."""

from __future__ import annotations

import pytest
from tracegen import cpu_op, kernel, launch, step, write_trace
from tracekit import NCCL_NEW

import perfscope
from perfscope.errors import AnalysisError

BASE = 1_700_000_000_000_000_000  # ns


def _rank(path, rank, base_ns, compute_us, world=2, shift_us=0):
    """Two steps of 10 ms: compute (``compute_us``, or one figure per step) then one all-reduce, which ends for every rank at the same
    absolute time (it completes together). Timestamps are written relative to ``base_ns`` (None:
    no base time in the file) and shifted by ``shift_us``, so that the same absolute times can be
    written against another base."""
    events = []
    per_step = compute_us if isinstance(compute_us, tuple) else (compute_us, compute_us)
    for n, c in enumerate(per_step):
        s = 10_000 * n + shift_us
        end = s + 9_000  # end of the collective, the same absolute time on every rank
        events += [step(n + 1, s, 10_000), cpu_op("aten::mm", s, 9_500),
                   *launch("gemm", s + 1, s + 10, c, correlation=10 * n + 1),
                   *launch(NCCL_NEW, s + 2, s + 10 + c, end - (s + 10 + c), correlation=10 * n + 2, stream=20)]
    meta = {"distributedInfo": {"rank": rank, "world_size": world}}
    if base_ns is not None:
        meta["baseTimeNanoseconds"] = base_ns
    return write_trace(path, events, **meta)


def test_ranks_are_compared_on_base_time_plus_ts(tmp_path):
    # rank 0 computes 3 ms then joins the all-reduce; rank 1 computes 6 ms: rank 1 arrives 3 ms
    # later and is the straggler. Rank 1's file counts from a base 5 ms later, so on raw ts rank 1
    # would seem to arrive 2 ms *earlier* -- the wrong answer.
    d = tmp_path / "run"
    d.mkdir()
    _rank(d / "rank0.json", 0, BASE, 3_000)
    _rank(d / "rank1.json", 1, BASE + 5_000_000, 6_000, shift_us=-5_000)  # the same absolute times
    a = perfscope.analyze(d)
    st = a.details.straggler
    # per step: rank 0 arrives at s+3010, rank 1 at s+6010 (absolute): rank 1 is 3000 us late
    assert st.rank == 1 and st.steps_last == 2 and st.steps == 2
    assert st.median_late_us == pytest.approx(3000)
    # rank 0's all-reduce lasts 9000 - 3010 = 5990 us, rank 1's 2990: rank 0 waits 3000 us in it
    assert st.median_others_wait_us == pytest.approx(3000)
    rows = {r.rank: r for r in a.details.ranks}
    assert rows[0].median_collective_wait_us == pytest.approx(3000) and rows[1].median_late_us == pytest.approx(3000)
    s = a.summary()
    assert s["details"]["straggler"]["rank"] == 1
    from perfscope.reports import render_report

    ranks = render_report(s, find_traces=False).split('id="ranks"')[1].split("</section>")[0]
    assert "Rank 1 is the straggler" in ranks and "2 of 2 steps" in ranks


def test_a_duplicate_rank_names_both_files(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    _rank(d / "a.json", 0, BASE, 3_000)
    _rank(d / "b.json", 0, BASE, 3_000)
    with pytest.raises(AnalysisError, match=r"a\.json and b\.json both hold step 1 of rank 0"):
        perfscope.analyze(d)


def test_traces_of_different_world_sizes_are_different_jobs(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    _rank(d / "rank0.json", 0, BASE, 3_000, world=8)
    _rank(d / "rank1.json", 1, BASE, 3_000, world=16)
    with pytest.raises(AnalysisError, match=r"different jobs \(rank0\.json has world size 8, rank1\.json has world size 16\)"):
        perfscope.analyze(d)


def test_a_rank_taken_from_the_file_name_is_said(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    for r in (0, 1):
        write_trace(d / f"rank{r}.json", [step(1, 0, 100), cpu_op("aten::mm", 0, 90)])
    a = perfscope.analyze(d)
    assert sorted(t.rank for t in a.traces) == [0, 1]
    assert any("rank0.json: no usable rank in distributedInfo; rank 0 taken from the file name" in w for w in a.warnings)


@pytest.mark.parametrize("rank, why", [(-1, "not a whole number from 0"), (True, "not a whole number from 0"),
                                       (5, "out of range for world size 2"), ("3", "not a whole number from 0"),
                                       (10**12, "not a whole number from 0")])
def test_a_rank_that_is_not_a_rank_is_refused(tmp_path, rank, why):
    path = write_trace(tmp_path / "worker.json", [step(1, 0, 100), cpu_op("aten::mm", 0, 90)],
                       distributedInfo={"rank": rank, "world_size": 2})
    a = perfscope.analyze(path)
    assert any(w.startswith("worker.json: distributedInfo.rank") and str(rank) in w and why in w for w in a.warnings)
    assert a.traces[0].rank == 0  # no rank: numbered among the traces analyzed


def test_a_rank_less_distributed_info_is_warned_about_not_read_as_rank_0(tmp_path):
    events = [step(1, 0, 100), cpu_op("aten::mm", 0, 90)]
    a = perfscope.analyze(write_trace(tmp_path / "worker.json", events, distributedInfo={"world_size": 8}))
    assert [w for w in a.warnings if "no rank" in w] == [
        "worker.json: distributedInfo gives world size 8 but no rank; the rank shown is the file's place among those "
        "analyzed, not its rank in the job"]
    # one process (world size 1) or a rank in the file name: nothing to say
    one = perfscope.analyze(write_trace(tmp_path / "one.json", events, distributedInfo={"world_size": 1}))
    named = perfscope.analyze(write_trace(tmp_path / "rank3.json", events, distributedInfo={"world_size": 8}))
    assert not [w for w in one.warnings + named.warnings if "no rank" in w]
    assert named.traces[0].rank == 3


def test_values_past_64_bits_and_odd_shapes_are_refused_not_fatal(tmp_path):
    huge = 2**64 + 5
    k = kernel("gemm", 20, 30, correlation=2**63 + 7, device=0, stream=7)  # a u64 correlation id
    k["args"]["bytes"] = huge
    events = [step(1, 0, 100), cpu_op("aten::mm", 0, 95),
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": huge, "tid": 1, "ts": 10, "dur": 2,
               "args": {"correlation": 2**63 + 7}}, k,
              {"ph": "M", "name": "thread_name", "pid": 100, "tid": 1, "args": ["not", "an", "object"]}]
    path = write_trace(tmp_path / "t.json", events,
                       deviceProperties=[{"id": 0, "name": ["A100"]}, {"id": 1, "name": {"x": 1}}, "gpu"])
    a = perfscope.analyze(path)
    row = a.steps.iloc[0]
    assert row["compute_us"] == pytest.approx(30)
    assert row["launch_wait_us"] + row["kernel_wait_us"] + row["other_idle_us"] == pytest.approx(70)
    # the u64 correlation still links the launch to its kernel: the gap [0, 20) is host wait until 12
    assert row["launch_wait_us"] == pytest.approx(12 + 50)
    assert a.traces[0].devices == []
    assert any("deviceProperties entries (or their names) are not what the format says" in w for w in a.warnings)


def test_one_bad_file_does_not_stop_a_directory(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    _rank(d / "rank0.json", 0, BASE, 3_000)
    bad = b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1 @ }]}'
    (d / "rank1.json").write_bytes(bad)
    col = bad.index(b"@") + 1
    a = perfscope.analyze(d)
    assert [t.rank for t in a.traces] == [0]
    (skipped,) = a.skipped
    assert skipped.damaged and f"rank1.json:1:{col}: invalid JSON that cannot be repaired" in skipped.reason
    assert any(w.startswith("skipped ") and "rank1.json" in w for w in a.warnings)


def test_a_file_that_breaks_perfscope_is_skipped_in_a_directory_and_named(tmp_path, monkeypatch):
    import perfscope.analysis.rank as rank

    d = tmp_path / "run"
    d.mkdir()
    _rank(d / "rank0.json", 0, BASE, 3_000)
    _rank(d / "rank1.json", 1, BASE, 3_000)
    real = rank.read_table

    def read(path, **kw):  # a bug of perfscope's, simulated on one file
        if path.name == "rank1.json":
            raise OverflowError("simulated")
        return real(path, **kw)

    monkeypatch.setattr(rank, "read_table", read)
    a = perfscope.analyze(d)
    assert [t.rank for t in a.traces] == [0]
    (skipped,) = a.skipped
    assert skipped.damaged and "internal error: OverflowError: simulated; please report it" in skipped.reason
    with pytest.raises(OverflowError):  # a single file is not skipped: the error reaches the caller
        perfscope.analyze(d / "rank1.json")


def test_clocks_that_disagree_give_the_straggler_from_collective_waits(tmp_path):
    # rank 1's file lacks its base time: its ts cannot be placed on rank 0's clock (they differ by
    # 1.7e18 ns). Rank 0 computes 3 ms and rank 1 6 ms before the all-reduce that ends for both at
    # s + 9000: rank 0's all-reduce lasts 5990 us, rank 1's 2990 us. Rank 1 waits least: the straggler.
    d = tmp_path / "run"
    d.mkdir()
    _rank(d / "rank0.json", 0, BASE, 3_000)
    _rank(d / "rank1.json", 1, None, 6_000)  # no baseTimeNanoseconds
    a = perfscope.analyze(d)
    st = a.details.straggler
    assert a.details.clocks_agree is False
    assert st.rank == 1 and st.basis == "collective waits" and st.median_late_us is None
    assert st.median_others_wait_us == pytest.approx(3000)  # 5990 - 2990
    assert any("clocks do not agree" in w for w in a.warnings)
    assert all(r.median_late_us is None for r in a.details.ranks)


def test_a_rank_missing_from_the_job_is_noted(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    _rank(d / "rank0.json", 0, BASE, 3_000, world=8)
    _rank(d / "rank1.json", 1, BASE, 3_000, world=8)
    a = perfscope.analyze(d)
    assert any("2 of the job's 8 ranks were analyzed (ranks 0, 1)" in n for n in a.notes)


def test_a_trace_without_gpu_activity_in_a_gpu_run_gets_no_verdict(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    _rank(d / "rank0.json", 0, BASE, 3_000)
    write_trace(d / "rank1.json", [step(1, 0, 10_000), cpu_op("aten::mm", 0, 9_000), step(2, 10_000, 10_000),
                                   cpu_op("aten::mm", 10_000, 9_000)],
                baseTimeNanoseconds=BASE, distributedInfo={"rank": 1, "world_size": 2})
    a = perfscope.analyze(d)
    assert a.steps[a.steps["rank"] == 1]["status"].tolist() == ["incomplete", "incomplete"]
    assert a.steps[a.steps["rank"] == 0]["status"].tolist() == ["ok", "ok"]
    assert any("rank1.json: this trace holds no GPU activity while the other traces of the run do" in w for w in a.warnings)


def test_a_file_name_that_contradicts_distributed_info_is_said(tmp_path):
    path = write_trace(tmp_path / "rank0.json", [step(1, 0, 100), cpu_op("aten::mm", 0, 90)],
                       distributedInfo={"rank": 1, "world_size": 2})
    a = perfscope.analyze(path)
    assert a.traces[0].rank == 1
    assert any("the file name says rank 0, distributedInfo says rank 1; used distributedInfo" in w for w in a.warnings)


def test_no_straggler_when_the_last_rank_changes_from_step_to_step(tmp_path):
    # step 1: rank 0 computes 6 ms, rank 1 3 ms (rank 0 last); step 2 the other way round
    d = tmp_path / "run"
    d.mkdir()
    _rank(d / "rank0.json", 0, BASE, (6_000, 3_000))
    _rank(d / "rank1.json", 1, BASE, (3_000, 6_000))
    det = perfscope.analyze(d).details
    assert det.straggler is None
    assert det.last_counts == {"0": 1, "1": 1}


def test_two_windows_of_one_worker_are_said(tmp_path):
    d = tmp_path / "tb"
    d.mkdir()
    write_trace(d / "worker0.1.pt.trace.json", [step(1, 0, 100), cpu_op("aten::mm", 0, 90)])
    write_trace(d / "worker0.2.pt.trace.json", [step(7, 0, 100), cpu_op("aten::mm", 0, 90)])
    a = perfscope.analyze(d)
    assert any("2 files read as one rank" in n for n in a.notes)
