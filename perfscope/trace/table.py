"""The compact columnar trace table: one numpy column per field, strings interned.

Times are integer **nanoseconds** relative to the trace's first duration event (``origin_us``),
so sub-microsecond events keep their length and no duration turns negative through rounding. Only
the duration events (``ph == "X"``) that analysis needs become rows; flows, instants and counters
are dropped, metadata events fill the thread-name table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from perfscope.trace.kinds import EventKind, kinds_of_categories
from perfscope.trace.reader import RawTrace

_NO_ID = -1


@dataclass
class TraceTable:
    """One rank's trace as columns.

    Row ``i`` is one duration event. Columns (all 1-D, length ``n_events``):

    - ``kind`` (int8): :class:`~perfscope.trace.kinds.EventKind`.
    - ``name_id`` (int32): index into ``names``.
    - ``ts_ns``, ``dur_ns`` (int64): start and duration in nanoseconds; start is relative to
      ``origin_us``; durations are clamped at 0.
    - ``thread_id`` (int32): index into ``threads`` (a ``pid``/``tid`` pair).
    - ``device`` (int32): GPU index for GPU events, -1 elsewhere.
    - ``stream`` (int64): GPU stream id, -1 elsewhere. Streams are unique only with ``device``.
    - ``correlation`` (int64): links a runtime call to the GPU event it launched; -1 if absent.
    - ``external_id`` (int64): links GPU events and runtime calls to the CPU operator; -1 if absent.

    Attributes:
        names: Unique event names (object array of str).
        threads: One row per (pid, tid) with columns ``pid``, ``tid``, ``thread_name``.
        origin_us: Trace timestamp (microseconds, as written in the file) that ``ts_ns == 0`` is.
        base_time_ns: ``baseTimeNanoseconds`` of the file (0 when absent). The absolute time of an
            event is ``base_time_ns + (origin_us * 1000 + ts_ns)``, which aligns ranks.
        rank: Rank from ``distributedInfo`` or the file name; None when unknown.
        world_size: From ``distributedInfo``; None when unknown.
        device_properties: ``deviceProperties`` of the file (list of dicts), possibly empty.
        distributed_info: ``distributedInfo`` of the file, possibly empty.
        path, worker: Source file and worker name.
        warnings: Non-fatal problems found while reading.
    """

    kind: np.ndarray
    name_id: np.ndarray
    ts_ns: np.ndarray
    dur_ns: np.ndarray
    thread_id: np.ndarray
    device: np.ndarray
    stream: np.ndarray
    correlation: np.ndarray
    external_id: np.ndarray
    names: np.ndarray
    threads: pd.DataFrame
    origin_us: float = 0.0
    base_time_ns: int = 0
    rank: int | None = None
    world_size: int | None = None
    device_properties: list = field(default_factory=list)
    distributed_info: dict = field(default_factory=dict)
    path: Path | None = None
    worker: str = ""
    warnings: list[str] = field(default_factory=list)

    @property
    def n_events(self) -> int:
        return int(self.kind.shape[0])

    @property
    def end_ns(self) -> np.ndarray:
        """End of every event (ns, relative to the origin)."""
        return self.ts_ns + self.dur_ns

    def name_of(self, rows: np.ndarray) -> np.ndarray:
        """Names of the given rows (object array)."""
        return self.names[self.name_id[rows]]

    def mask(self, *kinds: EventKind) -> np.ndarray:
        """Boolean row mask of events of any of ``kinds``."""
        return np.isin(self.kind, np.array(kinds, dtype=np.int8))

    def name_flag(self, predicate) -> np.ndarray:
        """Per-row boolean from a vectorised predicate over the unique names.

        ``predicate`` maps an object array of names to a boolean array; it runs once per distinct
        name, not per event.
        """
        return np.asarray(predicate(self.names), dtype=bool)[self.name_id]

    def absolute_ns(self, ts_ns: np.ndarray | int) -> np.ndarray | int:
        """Absolute time (ns since the epoch where the trace records one) of relative times."""
        return self.base_time_ns + int(round(self.origin_us * 1000)) + ts_ns


def _ints(values: list, default: int = _NO_ID) -> np.ndarray:
    return np.array([v if isinstance(v, int) else default for v in values], dtype=np.int64)


def _stream_of(tid) -> int:
    """Stream id from a GPU thread id: ``7`` or ``"stream 7"`` (2021 traces)."""
    if isinstance(tid, int):
        return tid
    digits = "".join(ch for ch in str(tid) if ch.isdigit())
    return int(digits) if digits else _NO_ID


def _rank_from(raw: RawTrace, distributed: dict) -> int | None:
    rank = distributed.get("rank")
    if isinstance(rank, int):
        return rank
    digits = "".join(ch for ch in raw.worker.rsplit("rank", 1)[-1] if ch.isdigit()) if "rank" in raw.worker else ""
    return int(digits) if digits else None


def build_table(raw: RawTrace) -> TraceTable:
    """Turn a parsed trace into a :class:`TraceTable`.

    Args:
        raw: The parsed file from :func:`perfscope.trace.reader.read_trace`.

    Returns:
        The table; zero rows when the trace holds no duration events (the analysis says so).
    """
    data = raw.data
    events = data["traceEvents"]
    thread_names = {}
    xs = []
    for e in events:
        ph = e.get("ph") if isinstance(e, dict) else None
        if ph == "X":
            xs.append(e)
        elif ph == "M" and e.get("name") == "thread_name":
            thread_names[(str(e.get("pid")), str(e.get("tid")))] = str((e.get("args") or {}).get("name", ""))

    # Columns by list comprehension: one pass per field, no per-event objects kept.
    ts = np.array([e.get("ts", 0) for e in xs], dtype=np.float64)
    dur = np.array([e.get("dur", 0) or 0 for e in xs], dtype=np.float64)
    origin = float(ts.min()) if len(ts) else 0.0
    ts_ns = np.rint((ts - origin) * 1000.0).astype(np.int64)
    dur_ns = np.maximum(np.rint(dur * 1000.0), 0).astype(np.int64)

    kind = kinds_of_categories(np.array([e.get("cat") for e in xs], dtype=object))
    name_id, names = pd.factorize(pd.Series([str(e.get("name", "")) for e in xs], dtype=object))
    pids = [e.get("pid") for e in xs]
    tids = [e.get("tid") for e in xs]
    thread_keys = [f"{p}\x00{t}" for p, t in zip(pids, tids)]
    thread_id, thread_uniques = pd.factorize(pd.Series(thread_keys, dtype=object))
    split = [k.split("\x00", 1) for k in thread_uniques]
    threads = pd.DataFrame(
        {
            "pid": [s[0] for s in split],
            "tid": [s[1] for s in split],
            "thread_name": [thread_names.get((s[0], s[1]), "") for s in split],
        }
    )

    args = [e.get("args") or {} for e in xs]
    gpu = np.isin(kind, np.array([EventKind.KERNEL, EventKind.MEMCPY, EventKind.MEMSET, EventKind.GPU_ANNOTATION], dtype=np.int8))
    device = _ints([a.get("device") for a in args])
    device = np.where(gpu & (device < 0), _ints(pids), device)
    device = np.where(gpu, device, _NO_ID).astype(np.int32)
    stream = _ints([a.get("stream") for a in args])
    gpu_rows = np.flatnonzero(gpu & (stream < 0))
    for i in gpu_rows:
        stream[i] = _stream_of(tids[i])
    stream = np.where(gpu, stream, _NO_ID)
    correlation = _ints([a.get("correlation") for a in args])
    external_id = _ints([a.get("External id", a.get("external id")) for a in args])

    distributed = data.get("distributedInfo") or {}
    if not isinstance(distributed, dict):
        distributed = {}
    world = distributed.get("world_size")
    device_properties = data.get("deviceProperties") or data.get("computeProperties") or []
    base = data.get("baseTimeNanoseconds")
    return TraceTable(
        kind=kind,
        name_id=name_id.astype(np.int32),
        ts_ns=ts_ns,
        dur_ns=dur_ns,
        thread_id=thread_id.astype(np.int32),
        device=device,
        stream=stream,
        correlation=correlation,
        external_id=external_id,
        names=np.asarray(names, dtype=object),
        threads=threads,
        origin_us=origin,
        base_time_ns=int(base) if isinstance(base, (int, float)) else 0,
        rank=_rank_from(raw, distributed),
        world_size=int(world) if isinstance(world, int) else None,
        device_properties=device_properties if isinstance(device_properties, list) else [],
        distributed_info=distributed,
        path=raw.path,
        worker=raw.worker,
        warnings=list(raw.warnings),
    )
