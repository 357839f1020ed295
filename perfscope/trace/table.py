"""The compact columnar trace table: one numpy column per field, strings interned.

Times are integer **nanoseconds** relative to the trace's first duration event (``origin_us``),
so sub-microsecond events keep their length and no duration turns negative through rounding. Only
the duration events (``ph == "X"``) that analysis needs become rows; flows, instants and counters
are dropped, metadata events fill the thread-name table.
"""

from __future__ import annotations

import re
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
    - ``correlation`` (int64): links a runtime call to the GPU event it launched; -1 if absent
      (and for rows that are neither).
    - ``copy_bytes`` (int64): bytes moved by a memcpy (``args.bytes``); -1 elsewhere or unknown.

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
    copy_bytes: np.ndarray
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


def _int_column(dicts: list[dict], key: str, default: int = _NO_ID) -> np.ndarray:
    """``d[key]`` of every dict as int64; absent or non-integer values become ``default``."""
    values = [d.get(key, default) for d in dicts]
    try:  # fast path: every value is an int
        return np.fromiter(values, dtype=np.int64, count=len(values))
    except (TypeError, ValueError, OverflowError):
        return np.array([v if type(v) is int else default for v in values], dtype=np.int64)


# Plausible magnitudes (microseconds): epoch timestamps are ~1.7e15 today; beyond these bounds the
# nanosecond columns could overflow int64, and no real trace comes near them.
MAX_ABS_TS_US = 4e15
MAX_DUR_US = 1e15


def _is_number(v) -> bool:
    return type(v) in (int, float) and v == v  # excludes bool, None, strings and NaN


def _well_formed(xs: list[dict]) -> tuple[list[dict], int]:
    """Keep events with a numeric ``ts`` and ``dur`` in plausible ranges; return them and how many
    were dropped."""
    good = [
        e for e in xs
        if _is_number(ts := e.get("ts")) and -MAX_ABS_TS_US <= ts <= MAX_ABS_TS_US
        and _is_number(dur := e.get("dur", 0)) and dur <= MAX_DUR_US
    ]  # fmt: skip
    return good, len(xs) - len(good)


def _text(value) -> str:
    """A category or name as text; anything that is not a string (a list...) becomes its JSON-ish repr."""
    return value if isinstance(value, str) else ("" if value is None else str(value))


def _args(event: dict) -> dict:
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def _stream_of(tid) -> int:
    """Stream id from a GPU thread id: ``7`` or ``"stream 7"`` (2021 traces)."""
    if isinstance(tid, int):
        return tid
    digits = "".join(ch for ch in str(tid) if ch.isdigit())
    return int(digits) if digits else _NO_ID


_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)(?:\D|$)", re.IGNORECASE)


def _rank_from(raw: RawTrace, distributed: dict) -> int | None:
    """Rank from ``distributedInfo``, else from a ``rank<N>`` / ``rank-N`` / ``rank_N`` file name."""
    rank = distributed.get("rank")
    if isinstance(rank, int):
        return rank
    m = _RANK_IN_NAME.search(raw.worker)
    return int(m.group(1)) if m else None


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

    warnings = list(raw.warnings)
    xs, dropped = _well_formed(xs)
    if dropped:
        warnings.append(f"{raw.path.name}: skipped {dropped} events with a missing, non-numeric or out-of-range ts/dur")

    # Columns by list comprehension: one pass per field, no per-event objects kept.
    ts = np.array([e["ts"] for e in xs], dtype=np.float64)
    dur = np.array([e.get("dur", 0) for e in xs], dtype=np.float64)
    origin = float(ts.min()) if len(ts) else 0.0
    ts_ns = np.rint((ts - origin) * 1000.0).astype(np.int64)
    dur_ns = np.maximum(np.rint(dur * 1000.0), 0).astype(np.int64)

    cat_codes, cat_uniques = pd.factorize(pd.Series([_text(e.get("cat")) for e in xs], dtype=object), use_na_sentinel=False)
    kind = kinds_of_categories(np.asarray(cat_uniques, dtype=object))[cat_codes] if len(xs) else np.zeros(0, np.int8)
    name_id, names = pd.factorize(pd.Series([_text(e.get("name", "")) for e in xs], dtype=object))
    # pid and tid may be ints or strings ("stream 7"); intern each, then the pairs.
    pid_codes, pid_uniques = pd.factorize(pd.Series([str(e.get("pid")) for e in xs], dtype=object))
    tid_codes, tid_uniques = pd.factorize(pd.Series([str(e.get("tid")) for e in xs], dtype=object))
    pair = pid_codes.astype(np.int64) * max(len(tid_uniques), 1) + tid_codes
    pairs, thread_id = np.unique(pair, return_inverse=True)
    n_tid = max(len(tid_uniques), 1)
    pid_of = [str(pid_uniques[k // n_tid]) for k in pairs]
    tid_of = [str(tid_uniques[k % n_tid]) for k in pairs]
    threads = pd.DataFrame(
        {"pid": pid_of, "tid": tid_of, "thread_name": [thread_names.get(k, "") for k in zip(pid_of, tid_of)]}
    )

    # args are read only where analysis needs them: GPU events and runtime calls.
    gpu = np.isin(kind, np.array([EventKind.KERNEL, EventKind.MEMCPY, EventKind.MEMSET, EventKind.GPU_ANNOTATION], dtype=np.int8))
    gpu_rows = np.flatnonzero(gpu)
    linked_rows = np.flatnonzero(gpu | (kind == EventKind.RUNTIME))
    gpu_args = [_args(xs[i]) for i in gpu_rows]
    device = np.full(len(xs), _NO_ID, dtype=np.int32)
    stream = np.full(len(xs), _NO_ID, dtype=np.int64)
    correlation = np.full(len(xs), _NO_ID, dtype=np.int64)
    device[gpu_rows] = _int_column(gpu_args, "device")
    stream[gpu_rows] = _int_column(gpu_args, "stream")
    correlation[linked_rows] = _int_column([_args(xs[i]) for i in linked_rows], "correlation")
    copy_bytes = np.full(len(xs), _NO_ID, dtype=np.int64)
    copy_rows = np.flatnonzero(kind == EventKind.MEMCPY)
    copy_bytes[copy_rows] = _int_column([_args(xs[i]) for i in copy_rows], "bytes")
    for i in gpu_rows[(device[gpu_rows] < 0) | (stream[gpu_rows] < 0)]:
        # 2021 traces: the GPU index is the pid, the stream is in tid "stream 7".
        if device[i] < 0 and type(xs[i].get("pid")) is int:
            device[i] = xs[i]["pid"]
        if stream[i] < 0:
            stream[i] = _stream_of(xs[i].get("tid"))

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
        copy_bytes=copy_bytes,
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
        warnings=warnings,
    )
