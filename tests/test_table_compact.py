"""The compact table and the analysis's low-memory paths give the results of the plain ones.

A large trace's peak memory is set by its per-row columns and the analysis's per-row temporaries
(docs/analysis-scale.md); each lean path here is checked against the straightforward formulation
it replaced, on random data and on real traces.
"""

from __future__ import annotations

import gzip
import types

import numpy as np
import pandas as pd
import pytest
from tracegen import launch, memcpy, runtime, step, write_trace

import perfscope
import perfscope.analysis.run
from perfscope.analysis import chunked, trace_counts, waits
from perfscope.analysis.intervals import locate
from perfscope.analysis.rank import analyze_file
from perfscope.analysis.steps import Launches
from perfscope.trace import assemble, quality
from perfscope.trace.kinds import GPU_KINDS, EventKind, is_gpu_work_call, is_stream_wait
from perfscope.trace.load import read_table
from perfscope.trace.rows import Column
from perfscope.trace.values import narrow, smallest_int


def test_narrow_keeps_int32_when_every_value_fits_and_int64_otherwise():
    small = np.array([-1, 5, 2**31 - 1], np.int64)
    assert narrow(small).dtype == np.int32 and narrow(small).tolist() == small.tolist()
    big = np.array([-1, 2**31], np.int64)
    assert narrow(big).dtype == np.int64 and narrow(big) is big
    already = np.array([1, 2], np.int32)
    assert narrow(already) is already
    assert narrow(np.zeros(0, np.int64)).dtype == np.int32


def test_smallest_int_picks_the_narrowest_signed_type_that_holds_every_value():
    cases = [([-128, 127], np.int8), ([-129, 0], np.int16), ([0, 2**15], np.int32), ([-(2**31) - 1], np.int64)]
    for values, want in cases:
        got = smallest_int(np.array(values, np.int64))
        assert got.dtype == want and got.tolist() == values
    floats = np.array([1.5])
    assert smallest_int(floats) is floats
    same = np.array([1, 2], np.int8)
    assert smallest_int(same) is same
    assert smallest_int(np.zeros(0, np.int64)).dtype == np.int8


@pytest.mark.parametrize("seed", range(4))
def test_a_column_grown_a_batch_at_a_time_equals_the_batches_joined(monkeypatch, seed):
    monkeypatch.setattr(Column, "_FIRST", 4)  # many doublings, and widening after them
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(30):
        bound = int(rng.choice([100, 30_000, 2**40]))
        batches.append(rng.integers(-bound, bound, int(rng.integers(0, 20)), dtype=np.int64))
    c = Column()
    for b in batches:
        c.append(b)
    got = c.array()
    want = np.concatenate(batches)
    assert got.tolist() == want.tolist()
    assert got.dtype == smallest_int(want).dtype


def test_a_column_of_floats_keeps_them_exactly():
    c = Column()
    parts = [np.array([0.1, 2.5e300]), np.array([], np.float64), np.array([-3.0])]
    for p in parts:
        c.append(p)
    got = c.array()
    assert got.dtype == np.float64 and got.tolist() == np.concatenate(parts).tolist()
    assert Column().array().size == 0


@pytest.mark.parametrize("chunk", [1, 3, 1 << 20])
def test_times_converted_in_place_equal_the_formula(monkeypatch, chunk):
    monkeypatch.setattr(assemble, "_NS_CHUNK", chunk)
    rng = np.random.default_rng(1)
    us = np.concatenate([rng.uniform(1.7e15, 1.7e15 + 1e6, 50), [1.7e15, 0.0, -0.0, 12.3456789]])
    origin = float(us.min())
    want = np.rint((us - origin) * 1000.0).astype(np.int64)
    got = assemble._ns_in_place(us.copy(), origin)
    assert got.dtype == np.int64 and got.tolist() == want.tolist()
    view = us[::2]  # not contiguous: converted from a copy, the input left as it was
    before = view.copy()
    assert assemble._ns_in_place(view, origin).tolist() == np.rint((before - origin) * 1000.0).astype(np.int64).tolist()
    assert view.tolist() == before.tolist()


def test_refactorize_and_threads_match_factorizing_every_row():
    rng = np.random.default_rng(2)
    # codes in the narrowest type that holds the distinct count: 40 texts fit a byte, 300 do not
    for n_texts, dtype in ((40, np.int8), (300, np.int16)):
        texts = np.array([f"t{i}" for i in range(n_texts)], dtype=object)
        codes = rng.integers(0, n_texts, 5000).astype(np.int32)
        local, uniq = assemble._refactorize(codes, texts)
        ref_local, ref_uniq = pd.factorize(codes)
        assert local.dtype == dtype and local.tolist() == ref_local.tolist()
        assert uniq.tolist() == texts[ref_uniq].tolist()
    k = {"pid": rng.integers(0, 5, 5000).astype(np.int32), "tid": rng.integers(0, 7, 5000).astype(np.int32)}
    tx = {"pid": np.array([f"p{i}" for i in range(5)], object), "tid": np.array([f"{i}" for i in range(7)], object)}
    thread_id, threads = assemble._threads(k, tx, {})
    pid_c, pid_u = pd.factorize(k["pid"])
    tid_c, tid_u = pd.factorize(k["tid"])
    pairs, ref = np.unique(pid_c.astype(np.int64) * len(tid_u) + tid_c, return_inverse=True)
    assert thread_id.dtype == np.int32 and thread_id.tolist() == ref.reshape(-1).tolist()
    assert threads["pid"].tolist() == [str(tx["pid"][pid_u[j // len(tid_u)]]) for j in pairs]


def _sorted_events_inside(table, active, steps):
    rows = np.flatnonzero(active)
    starts = np.sort(table.ts_ns[rows])
    ends = np.sort(np.maximum(table.end_of(rows), table.ts_ns[rows] + 1))
    return np.searchsorted(starts, steps.end, side="left") - np.searchsorted(ends, steps.start, side="right")


class _Windows:
    def __init__(self, start, end):
        self.start, self.end = start, end

    def __len__(self):
        return len(self.start)


@pytest.mark.parametrize("seed", range(40))
def test_events_inside_counted_in_chunks_equals_sorting_every_event(monkeypatch, seed):
    rng = np.random.default_rng(seed)
    monkeypatch.setattr(chunked, "CHUNK_ROWS", int(rng.integers(1, 9)))
    n = int(rng.integers(0, 60))
    ts, dur = rng.integers(0, 100, n), rng.integers(0, 20, n)
    table = types.SimpleNamespace(ts_ns=ts, dur_ns=dur, end_of=lambda r: ts[r] + dur[r])
    k = int(rng.integers(0, 6))
    start = np.sort(rng.integers(0, 100, k))
    windows = _Windows(start, start + rng.integers(0, 40, k))  # may overlap: ends not sorted
    active = rng.random(n) < 0.7
    got = trace_counts.events_inside(table, active, windows)
    assert got.tolist() == _sorted_events_inside(table, active, windows).tolist()


@pytest.mark.parametrize("seed", range(30))
def test_rows_selected_in_chunks_equal_one_selection_of_every_row(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 50))
    mask, values = rng.random(n) < 0.6, rng.integers(-100, 100, n)
    chunk = int(rng.integers(1, 12))
    rows = np.flatnonzero(mask)
    got = chunked.select_rows(mask, lambda r: values[r] > 0, chunk)
    assert got.dtype == np.int64 and got.tolist() == rows[values[rows] > 0].tolist()
    assert np.concatenate(list(chunked.row_chunks(mask, chunk)) or [np.zeros(0, np.int64)]).tolist() == rows.tolist()
    assert chunked.max_of(mask, lambda r: values[r], chunk) == (values[rows].max() if rows.size else None)


def test_quality_counts_of_the_analysis_do_not_depend_on_the_chunk(monkeypatch, shared_traces):
    """The data-quality record of a real trace, its per-row counts taken a chunk at a time, is the
    one of chunks holding the whole trace (test_trace_cases_quality checks each count by hand)."""
    path = shared_traces / "hta" / "a100_rank3_of8_train.json.gz"
    whole = analyze_file(path)[1].quality.entries
    monkeypatch.setattr(chunked, "CHUNK_ROWS", 4093)  # a prime: chunks end anywhere
    assert analyze_file(path)[1].quality.entries == whole
    assert any(e.reason.startswith("outside every step") and e.count > 0 for e in whole)


@pytest.mark.parametrize("seed", range(20))
def test_locate_in_place_equals_its_definition(seed):
    rng = np.random.default_rng(seed)
    starts = np.sort(rng.choice(200, size=int(rng.integers(0, 8)), replace=False)).astype(np.int64)
    ends = np.minimum(starts + rng.integers(0, 30, starts.size), np.append(starts[1:], 10**9))
    points = rng.integers(-10, 250, 100)
    want = [next((i for i in range(starts.size) if starts[i] <= p < ends[i]), -1) for p in points]
    got = locate(points, starts, ends)
    assert got.dtype == np.int64 and got.tolist() == want


def test_launches_are_looked_up_for_any_rows():
    launches = Launches(np.array([2, 5, 9]), np.array([10, -1, 30]), np.array([11, -1, 31]))
    assert launches.start_of(np.array([9, 0, 2, 5, 100])).tolist() == [30, -1, 10, -1, -1]
    assert launches.end_of(np.array([2, 9])).tolist() == [11, 31]
    assert launches.start_of(launches.rows) is launches.call_start_ns
    assert launches.linked().tolist() == [2, 9]
    empty = Launches(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert empty.start_of(np.array([1, 2])).tolist() == [-1, -1]


def _gpu_trace(offset: int, stream_offset: int = 0, device_offset: int = 0) -> list[dict]:
    events = []
    for s in range(4):
        t0 = 1000 * s
        events.append(step(s + 1, t0, 900))
        for j in range(3):
            corr = offset + 10 * s + j
            events += launch(f"gemm_{j}", t0 + 10 + 50 * j, t0 + 100 + 200 * j, 150, corr, stream=stream_offset + 7 + j % 2,
                             device=device_offset)
    return events


def test_identifiers_past_int32_widen_the_column_and_change_no_number(tmp_path):
    small = write_trace(tmp_path / "small.json", _gpu_trace(1))
    large = write_trace(tmp_path / "large.json", _gpu_trace(2**40))
    t_small, t_large = read_table(small), read_table(large)
    assert t_small.correlation.dtype == np.int32 and t_large.correlation.dtype == np.int64
    a, b = analyze_file(small)[1], analyze_file(large)[1]
    pd.testing.assert_frame_equal(a.metrics, b.metrics)
    assert a.evidence.status.tolist() == b.evidence.status.tolist()


@pytest.mark.parametrize("stream_offset, device_offset, want", [(200, 0, np.int16), (70_000, 0, np.int32),
                                                                (2**40, 0, np.int64), (0, 300, np.int16)])
def test_identifier_columns_take_the_type_their_values_need_and_change_no_number(tmp_path, stream_offset,
                                                                                  device_offset, want):
    small = write_trace(tmp_path / "small.json", _gpu_trace(1))
    large = write_trace(tmp_path / "large.json", _gpu_trace(1, stream_offset, device_offset))
    t_small, t_large = read_table(small), read_table(large)
    assert t_small.stream.dtype == np.int8 and t_small.device.dtype == np.int8
    assert (t_large.device if device_offset else t_large.stream).dtype == want
    gpu = t_large.kind == perfscope.trace.kinds.EventKind.KERNEL
    assert sorted(set(t_large.stream[gpu].tolist())) == [stream_offset + 7, stream_offset + 8]
    a, b = analyze_file(small)[1], analyze_file(large)[1]
    pd.testing.assert_frame_equal(a.metrics, b.metrics)
    assert a.evidence.status.tolist() == b.evidence.status.tolist()


def test_a_real_trace_keeps_its_identifier_columns_narrow(shared_traces):
    table = read_table(shared_traces / "hta" / "a100_rank3_of8_train.json.gz")
    assert {table.correlation.dtype, table.copy_bytes.dtype} == {np.dtype(np.int32)}
    # 407 names, 8 threads, devices 0-3, streams up to 22: 5 bytes a row for the four identifiers
    assert [table.name_id.dtype, table.thread_id.dtype, table.device.dtype, table.stream.dtype] == [
        np.int16, np.int8, np.int8, np.int8]
    assert table.dur_ns.dtype == np.int32  # its longest event: 479 ms
    per_row = sum(getattr(table, c).itemsize for c in ("kind", "name_id", "ts_ns", "dur_ns", "thread_id", "device",
                                                       "stream", "correlation", "copy_bytes"))
    assert per_row == 26  # as perfscope.trace.table says
    assert table.copy_bytes.max() == 290422784  # the largest copy, as written


@pytest.mark.parametrize("kernel_s, want", [(1.9, np.int32), (2.2, np.int64)])
def test_durations_summed_past_int32_are_not_wrapped(tmp_path, kernel_s, want):
    # steps of 2.5 s (int64) or 2 s (int32 when every kernel fits), each with one long kernel:
    # the run's kernel total is far past int32's 2.1 s of nanoseconds
    step_us, kernel_us = int((kernel_s + 0.3) * 1e6), int(kernel_s * 1e6)
    events = []
    for s in range(4):
        t0 = s * (step_us + 100)
        events.append(step(s + 1, t0, step_us))
        events += launch("gemm_long", t0 + 10, t0 + 50, kernel_us, 100 + s)
    if want == np.int32:
        events = [dict(e, dur=min(e["dur"], 2_000_000)) for e in events]
    path = write_trace(tmp_path / "long.json", events)
    table = read_table(path)
    assert table.dur_ns.dtype == want
    a = perfscope.analyze(path)
    top = a.details.top_kernels[0]
    assert top.name == "gemm_long" and top.count == 4
    assert top.total_us == pytest.approx(4 * kernel_us)
    assert a.steps["compute_us"].sum() == pytest.approx(4 * kernel_us)


def test_copy_bytes_summed_past_int32_are_not_wrapped(tmp_path):
    # each copy's size fits int32, so the column is int32; their sum does not
    events = []
    for s in range(2):
        t0 = 1000 * s
        events.append(step(s + 1, t0, 900))
        for j in range(3):
            corr = 10 * s + j
            events.append(runtime("cudaMemcpyAsync", t0 + 10 + 100 * j, 2, corr))
            copy = memcpy("Memcpy HtoD (Pinned -> Device)", t0 + 20 + 100 * j, 50, correlation=corr)
            copy["args"]["bytes"] = 2**30
            events.append(copy)
    path = write_trace(tmp_path / "copies.json", events)
    assert read_table(path).copy_bytes.dtype == np.int32
    (h2d,) = perfscope.analyze(path).details.memcpy
    assert h2d.count == 6 and h2d.bytes == 6 * 2**30


def test_gzip_trace_gives_the_same_compact_table(tmp_path):
    plain = write_trace(tmp_path / "t.json", _gpu_trace(7))
    packed = tmp_path / "t.json.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    a, b = read_table(plain), read_table(packed)
    for name in ("kind", "name_id", "ts_ns", "dur_ns", "thread_id", "device", "stream", "correlation", "copy_bytes"):
        assert getattr(a, name).dtype == getattr(b, name).dtype
        assert getattr(a, name).tolist() == getattr(b, name).tolist()


@pytest.mark.parametrize("seed", range(30))
def test_exact_copies_found_with_one_mixed_key_are_those_of_comparing_every_column(monkeypatch, seed):
    rng = np.random.default_rng(seed)
    monkeypatch.setattr(quality, "_MIX_CHUNK", int(rng.integers(1, 9)))
    n = int(rng.integers(0, 80))
    keys = [rng.integers(0, 3, n).astype(np.int8), rng.integers(-1, 4, n).astype(np.int32), rng.integers(0, 2, n)]
    extra = rng.integers(0, 2, n)  # a field only the full event holds: equal keys, different events
    got = quality.duplicate_rows(keys, lambda rows: [(tuple(int(k[r]) for k in keys), int(extra[r])) for r in rows])
    seen, want = set(), []
    for r in range(n):
        fp = (tuple(int(k[r]) for k in keys), int(extra[r]))
        (want.append(r) if fp in seen else seen.add(fp))
    assert got.dtype == np.int64 and got.tolist() == want


def test_stream_overruns_compute_the_ends_of_the_gpu_rows_only():
    ts = np.array([0, 10, 5, 12, 100], np.int64)
    dur = np.array([15, 5, 20, 1, 1], np.int64)
    device = np.array([0, 0, 0, 0, -1])
    stream = np.array([7, 7, 8, 8, 7])
    over, clip_to = quality.stream_overruns(ts, dur, device, stream, np.arange(5))
    # stream 7: [0, 15) runs past 10; stream 8: [5, 25) runs past 12; the last row has no device
    assert over.tolist() == [0, 2] and clip_to.tolist() == [10, 12]


def _next_gpu_rows_sorting_every_row(t, times):
    gpu_rows = np.flatnonzero(t.mask(*GPU_KINDS))
    order = gpu_rows[np.argsort(t.ts_ns[gpu_rows], kind="stable")]
    return order[np.clip(np.searchsorted(t.ts_ns[order], times, side="left"), 0, max(order.size - 1, 0))]


@pytest.mark.parametrize("seed", range(40))
def test_next_gpu_event_found_in_chunks_equals_sorting_every_gpu_row(monkeypatch, seed):
    rng = np.random.default_rng(seed)
    monkeypatch.setattr(chunked, "CHUNK_ROWS", int(rng.integers(1, 9)))
    n = int(rng.integers(1, 60))
    kinds = np.array([EventKind.KERNEL, EventKind.MEMCPY, EventKind.RUNTIME, EventKind.CPU_OP], np.int8)
    kind = rng.choice(kinds, n)
    kind[rng.integers(0, n)] = EventKind.KERNEL  # the function requires GPU events
    ts = rng.integers(0, 30, n)  # few distinct starts: ties across and inside chunks
    table = types.SimpleNamespace(kind=kind, ts_ns=ts, mask=lambda *k: np.isin(kind, np.array(k, np.int8)))
    times = np.sort(rng.integers(-5, 40, int(rng.integers(0, 20))))
    got = waits._next_gpu_rows(table, times)
    assert got.tolist() == _next_gpu_rows_sorting_every_row(table, times).tolist()


def test_what_the_gpu_waited_on_does_not_depend_on_the_chunk(monkeypatch, shared_traces):
    """The causes of other idle time on a real rank are those found with chunks holding the whole
    trace, and the launches that follow a stream wait are those of the formulation over every
    runtime row (the real traces show no cross-stream wait: test_trace_cases_waits has one)."""
    path = shared_traces / "hta" / "a100_rank3_of8_train.json.gz"
    whole = perfscope.analysis.run.analyze(path).details.other_waits
    monkeypatch.setattr(chunked, "CHUNK_ROWS", 4093)
    assert perfscope.analysis.run.analyze(path).details.other_waits == whole
    assert whole.other_idle_us > 0
    t = read_table(path)
    rt_rows = np.flatnonzero(t.kind == EventKind.RUNTIME)
    wait, work = t.name_flag(is_stream_wait)[rt_rows], t.name_flag(is_gpu_work_call)[rt_rows]
    rows, wait, work = rt_rows[wait | work], wait[wait | work], work[wait | work]
    order = np.lexsort((t.ts_ns[rows], t.thread_id[rows]))
    rows, wait, work = rows[order], wait[order], work[order]
    same_thread = np.concatenate([[False], t.thread_id[rows][1:] == t.thread_id[rows][:-1]])
    want = rows[work & np.concatenate([[False], wait[:-1]]) & same_thread]
    assert want.size and waits._waited_launches(t).tolist() == want.tolist()
