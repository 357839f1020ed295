"""Helpers of the streaming-reader tests (``test_stream_reader.py``): the old whole-file read
(:func:`perfscope.trace.reader.read_trace` then :func:`perfscope.trace.assemble.build_table`) is the
reference, and the streaming read (:func:`perfscope.trace.load.read_table`) must give the same
table -- or the same exception, type and message -- at every batch size, serial or pooled.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from tracegen import cpu_op, launch, memcpy, runtime, step, trace_bytes

from perfscope.trace.events import Batch
from perfscope.trace.load import read_table
from perfscope.trace.reader import read_trace
from perfscope.trace.assemble import build_table
from perfscope.trace.table import TraceTable

ARRAYS = ("kind", "name_id", "ts_ns", "dur_ns", "thread_id", "device", "stream", "correlation", "copy_bytes", "names")
SCALARS = ("origin_us", "base_time_ns", "rank", "rank_source", "world_size", "device_properties", "distributed_info",
           "host_steps", "path", "worker", "truncated")


def _same_value(x, y) -> bool:
    """Equal, with NaN equal to NaN and a bool never equal to a number."""
    if type(x) is not type(y):
        return False
    if isinstance(x, float):
        return x == y or (math.isnan(x) and math.isnan(y))
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(_same_value(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(_same_value(a, b) for a, b in zip(x, y))
    return x == y


def table_differences(a: TraceTable, b: TraceTable) -> list[str]:
    """What differs between two tables, one line per field (empty when they are the same)."""
    out = []
    for f in ARRAYS:
        x, y = getattr(a, f), getattr(b, f)
        if x.dtype != y.dtype:
            out.append(f"{f}: dtype {x.dtype} != {y.dtype}")
        elif x.shape != y.shape:
            out.append(f"{f}: shape {x.shape} != {y.shape}")
        elif x.dtype == object:
            bad = [i for i, (p, q) in enumerate(zip(x.tolist(), y.tolist())) if not _same_value(p, q)]
            if bad:
                out.append(f"{f}: {len(bad)} values differ, first at {bad[0]}: {x[bad[0]]!r} != {y[bad[0]]!r}")
        elif not np.array_equal(x, y, equal_nan=x.dtype.kind == "f"):
            i = int(np.flatnonzero(x != y)[0])
            out.append(f"{f}: {int((x != y).sum())} values differ, first at {i}: {x[i]!r} != {y[i]!r}")
    try:
        pd.testing.assert_frame_equal(a.threads, b.threads, check_exact=True)
    except AssertionError as e:
        out.append(f"threads: {e}")
    for f in SCALARS:
        x, y = getattr(a, f), getattr(b, f)
        if not _same_value(x, y):
            out.append(f"{f}: {x!r} != {y!r}")
    if a.quality.to_list() != b.quality.to_list():
        out.append(f"quality: {a.quality.to_list()} != {b.quality.to_list()}")
    if a.warnings != b.warnings:
        out.append(f"warnings: {a.warnings} != {b.warnings}")
    return out


def assert_same_table(a: TraceTable, b: TraceTable, what: str = "") -> None:
    """Every field of the two tables is equal: numpy columns in dtype and values, the threads
    frame, the header fields, the data-quality record and the warnings."""
    diff = table_differences(a, b)
    assert not diff, f"{what}: tables differ:\n  " + "\n  ".join(diff)


def old_read(path: Path):
    """The reference: the table of the whole-file read, or ``(exception type, message)``."""
    try:
        return build_table(read_trace(path))
    except Exception as e:  # noqa: BLE001 - the exception is the result to compare
        return type(e), str(e)


def new_read(path: Path, **kw):
    """:func:`read_table` of ``path``: the table, or ``(exception type, message)``."""
    try:
        return read_table(path, **kw)
    except Exception as e:  # noqa: BLE001
        return type(e), str(e)


def describe(result) -> str:
    if isinstance(result, TraceTable):
        return (f"table: {result.n_events} rows, names {list(result.names)[:6]}, quality {result.quality.to_list()}, "
                f"warnings {result.warnings}")
    return f"{result[0].__name__}: {result[1]}"


def assert_same_result(expected, got, what: str) -> None:
    """Both tables and equal, or both the same exception type with the same message."""
    if isinstance(expected, TraceTable) and isinstance(got, TraceTable):
        assert_same_table(expected, got, what)
        return
    assert not isinstance(expected, TraceTable) and not isinstance(got, TraceTable) and expected == got, (
        f"{what}:\n  old: {describe(expected)}\n  new: {describe(got)}")


def assert_streams_same(path: Path, batch_sizes=(None, 1_000, 7_777, 65_536), pool=None, expected=None) -> None:
    """``read_table(path)`` at each batch size (None: the default), serial and (when ``pool`` is
    given) pooled, gives what the whole-file read gives."""
    expected = old_read(path) if expected is None else expected
    for b in batch_sizes:
        kw = {} if b is None else {"batch_bytes": b}
        assert_same_result(expected, new_read(path, **kw), f"{path.name} batch_bytes={b}")
        if pool is not None:
            assert_same_result(expected, new_read(path, pool=pool, **kw), f"{path.name} batch_bytes={b} pooled")


def write(path: Path, data: bytes, gz: bool = False) -> Path:
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


# ---------------------------------------------------------------- batches


def batch_differences(a: Batch, b: Batch) -> list[str]:
    """What differs between two batches of the same events, field by field of :class:`Batch`.
    Text columns are compared as the rows' texts (``uniques[codes]``: the codes themselves may
    differ where a batch lists one text twice, which the reader's interner merges), and every
    text must be a str."""
    out = []
    if a.n != b.n:
        return [f"n: {a.n} != {b.n}"]
    if a.columns.keys() != b.columns.keys():
        return [f"columns: {sorted(a.columns)} != {sorted(b.columns)}"]
    for k in a.columns:
        x, y = a.columns[k], b.columns[k]
        if x.dtype != y.dtype:
            out.append(f"{k}: dtype {x.dtype} != {y.dtype}")
        if k in a.uniques:
            tx, ty = [a.uniques[k][c] for c in x.tolist()], [b.uniques[k][c] for c in y.tolist()]
            if not _same_value(tx, ty):
                out.append(f"{k}: row texts {tx} != {ty}")
            odd = [u for u in list(a.uniques[k]) + list(b.uniques[k]) if type(u) is not str]
            if odd:
                out.append(f"{k}: uniques that are not text: {odd!r}")
        elif not np.array_equal(x, y, equal_nan=x.dtype.kind == "f"):
            out.append(f"{k}: {x.tolist()} != {y.tolist()}")
    if a.uniques.keys() != b.uniques.keys():
        out.append(f"uniques: {sorted(a.uniques)} != {sorted(b.uniques)}")
    for f in dataclasses.fields(Batch):
        if f.name in ("n", "columns", "uniques"):
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            same = isinstance(y, np.ndarray) and x.dtype == y.dtype and np.array_equal(x, y)
        elif isinstance(x, dict):
            same = isinstance(y, dict) and _same_value(list(x.items()), list(y.items()))
        else:
            same = _same_value(x, y)
        if not same:
            out.append(f"{f.name}: {x!r} != {y!r}")
    return out


def assert_same_batch(a: Batch, b: Batch, what: str = "") -> None:
    """Two batches of the same events: equal columns (dtype and values), texts and counts."""
    diff = batch_differences(a, b)
    assert not diff, f"{what}:\n  " + "\n  ".join(diff)


class FallbackSpy:
    """Counts the whole-file reads :func:`read_table` falls back to (it still does them)."""

    def __init__(self) -> None:
        self.calls: list[Path] = []

    def __enter__(self):
        import perfscope.trace.load as load

        self._load, self._real = load, load.read_trace

        def spy(path, *a, **kw):
            self.calls.append(Path(path))
            return self._real(path, *a, **kw)

        load.read_trace = spy
        return self

    def __exit__(self, *exc) -> None:
        self._load.read_trace = self._real


# Texts of traces for the tests

SMALL_BATCHES = (None, 1, 20, 64, 100, 333, 1_000, 7_777)  # None: the default (4 MiB)


def event_x(name="aten::mm", ts=10, dur=5, pid=100, tid=1, cat="cpu_op", **extra) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, **extra}


def dumps(e) -> bytes:
    return json.dumps(e, ensure_ascii=False).encode()


def doc(events: list[bytes], head: bytes = b"", tail: bytes = b"", sep: bytes = b",\n  ") -> bytes:
    """A trace text from event texts, with ``head`` before traceEvents and ``tail`` after it
    (each a run of ``"key": value,`` / ``, "key": value``)."""
    return b"{" + head + b'"traceEvents": [\n  ' + sep.join(events) + b"\n]" + tail + b"}\n"


def gpu_trace(n_steps=4, **meta) -> bytes:
    events = []
    for n in range(n_steps):
        s = 1000 * n
        copy = memcpy("Memcpy HtoD (Pinned -> Device)", s + 5, 20, correlation=100 + n)
        copy["args"]["bytes"] = 4096
        events += [step(n + 1, s, 1000), cpu_op("aten::mm", s + 110, 800),
                   runtime("cudaMemcpyAsync", s + 2, 3, correlation=100 + n), copy,
                   *launch("gemm", s + 120, s + 130, 700, correlation=n + 1)]
    events.append({"ph": "M", "name": "thread_name", "pid": 100, "tid": 1, "args": {"name": "main"}})
    return trace_bytes(events, **meta)


def check(tmp_path, data: bytes, name="t.json", batches=SMALL_BATCHES, pool=None, gz=False, must_stream=False):
    """Write ``data`` and check that streaming it at every batch size gives the whole-file read's
    result; ``must_stream``: and that it was streamed, not read whole."""
    path = write(tmp_path / name, data, gz=gz)
    with FallbackSpy() as spy:
        assert_streams_same(path, batches, pool=pool)
    if must_stream:
        assert spy.calls == [], "a clean text was read whole instead of streamed"
    return path
