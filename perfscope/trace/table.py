"""The compact columnar trace table: one numpy column per field, strings interned.

Times are integer **nanoseconds** relative to the trace's first duration event (``origin_us``),
so sub-microsecond events keep their length and no duration turns negative through rounding. Only
the duration events (``ph == "X"``) that analysis needs become rows; flows, instants and counters
are left out, metadata events fill the thread-name table. Events that cannot be used as written
are repaired in the order :mod:`perfscope.trace.quality` documents, each counted in the table's
data-quality record.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from perfscope.trace import columns as col
from perfscope.trace.header import Header, read_header
from perfscope.trace.kinds import GPU_KINDS, EventKind, is_dma_category, is_dma_name, is_known_category, kinds_of_categories
from perfscope.trace.quality import (
    ABSURD_DUR_US, CLIPPED, DROPPED, NOT_READ, REPAIRED, SET_ASIDE, DataQuality, duplicate_rows, stream_overruns,
)
from perfscope.trace.reader import RawTrace

_NO_ID = col.NO_ID


@dataclass
class TraceTable:
    """One rank's trace as columns.

    Row ``i`` is one duration event. Columns (all 1-D, length ``n_events``):

    - ``kind`` (int8): :class:`~perfscope.trace.kinds.EventKind`.
    - ``name_id`` (int32): index into ``names``.
    - ``ts_ns``, ``dur_ns`` (int64): start and duration in nanoseconds; start is relative to
      ``origin_us``; durations are never negative (negative ones are dropped).
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
        rank_source: ``"distributedInfo"``, ``"file name"`` or None.
        world_size: From ``distributedInfo``; None when unknown.
        device_properties: ``deviceProperties`` of the file (list of dicts), possibly empty.
        distributed_info: ``distributedInfo`` of the file, possibly empty.
        host_steps: What ``perfscope profile`` measured of the host per step (CPU time, run-queue
            wait), by step number; empty for traces recorded otherwise.
        path, worker: Source file and worker name.
        truncated: The file ended early (its last step is incomplete).
        quality: The data-quality record: what was repaired, dropped, clipped or set aside.
        warnings: Non-fatal problems found while reading (the quality record's among them).
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
    rank_source: str | None = None
    world_size: int | None = None
    device_properties: list = field(default_factory=list)
    distributed_info: dict = field(default_factory=dict)
    host_steps: dict = field(default_factory=dict)
    path: Path | None = None
    worker: str = ""
    truncated: bool = False
    quality: DataQuality = field(default_factory=DataQuality)
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



# Plausible magnitudes (microseconds): epoch timestamps are ~1.7e15 today; beyond this bound the
# nanosecond columns could overflow int64, and no real trace comes near it.
MAX_ABS_TS_US = 4e15
# ph values that are not duration events and that the analysis knowingly leaves out: metadata,
# instants, flows, counters, async and object events of the Chrome trace format.
_OTHER_PHASES = frozenset({"M", "i", "I", "s", "t", "f", "C", "b", "e", "n", "O", "N", "D", "P", "R", "c", "(", ")"})


def _split_events(events: list, quality: DataQuality, deep_events: int) -> tuple[list[dict], dict]:
    """The duration events and the thread names; everything unusable counted in ``quality``."""
    thread_names: dict = {}
    xs: list[dict] = []
    not_objects = begin_end = 0
    unknown_ph: dict[str, int] = {}
    for e in events:
        if type(e) is not dict:
            not_objects += 1
            continue
        ph = e.get("ph")
        if ph == "X":
            xs.append(e)
        elif ph == "M":
            if e.get("name") == "thread_name":
                thread_names[(str(e.get("pid")), str(e.get("tid")))] = col.text(col.args_of(e).get("name", ""))
        elif ph in ("B", "E"):
            begin_end += 1
        elif type(ph) is not str or ph not in _OTHER_PHASES:  # a list as ph must not end the read
            unknown_ph[col.text(ph)[:40]] = unknown_ph.get(col.text(ph)[:40], 0) + 1
    quality.add(DROPPED, "entries of traceEvents that are not event objects", not_objects - deep_events)
    quality.add(NOT_READ, "begin/end (B/E) duration events: perfscope reads complete (X) events, as Kineto writes",
                begin_end)
    quality.add(NOT_READ, "events of a phase (ph) the trace format does not define", sum(unknown_ph.values()), unknown_ph)
    return xs, thread_names


def _usable(xs: list[dict], quality: DataQuality) -> list[dict]:
    """Events with a numeric ``ts`` in range and a numeric ``dur`` (a complete event without one
    has no length to measure)."""
    number = col.is_number  # a local: this runs once per event
    good = [
        e for e in xs
        if number(ts := e.get("ts")) and -MAX_ABS_TS_US <= ts <= MAX_ABS_TS_US and number(e.get("dur"))
    ]  # fmt: skip
    if len(good) < len(xs):
        kept = {id(e) for e in good}
        bad = [col.text(e.get("name")) for e in xs if id(e) not in kept]
        quality.add(DROPPED, "missing, non-numeric or out-of-range ts or dur", len(bad), bad)
    return good


def build_table(raw: RawTrace) -> TraceTable:
    """Turn a parsed trace into a :class:`TraceTable`, repairing events in the documented order.

    Args:
        raw: The parsed file from :func:`perfscope.trace.reader.read_trace`.

    Returns:
        The table; zero rows when the trace holds no duration events (the analysis says so).
        Its ``quality`` record and ``warnings`` say what was repaired, dropped, clipped or set
        aside (:mod:`perfscope.trace.quality`).
    """
    quality = DataQuality(list(raw.quality.entries))
    xs, thread_names = _split_events(raw.data["traceEvents"], quality, raw.deep_events)
    xs = _usable(xs, quality)

    ts = np.array([e["ts"] for e in xs], dtype=np.float64)
    dur = np.array([e["dur"] for e in xs], dtype=np.float64)
    zeroed = (ts == 0) & (dur == 0)
    negative = dur < 0
    absurd = dur > ABSURD_DUR_US
    # An event a day away from the bulk of the trace is a corrupt timestamp, not work (and would
    # move the origin so far that float rounding blurs every other time).
    bulk = np.median(ts[~zeroed]) if (~zeroed).any() else 0.0
    astray = ~zeroed & (np.abs(ts - bulk) > ABSURD_DUR_US)
    names_of = lambda mask: [col.text(xs[i].get("name")) for i in np.flatnonzero(mask)]  # noqa: E731
    quality.add(SET_ASIDE, "ts and dur both 0, which Kineto writes for an event it lost", int(zeroed.sum()), names_of(zeroed))
    quality.add(DROPPED, "negative duration", int(negative.sum()), names_of(negative))
    quality.add(DROPPED, "duration longer than a day", int(absurd.sum()), names_of(absurd))
    quality.add(DROPPED, "ts more than a day from the rest of the trace", int(astray.sum()), names_of(astray))
    keep = ~(zeroed | negative | absurd | astray)
    if not keep.all():
        xs = [xs[i] for i in np.flatnonzero(keep)]
        ts, dur = ts[keep], dur[keep]

    origin = float(ts.min()) if len(ts) else 0.0
    ts_ns = np.rint((ts - origin) * 1000.0).astype(np.int64)
    dur_ns = np.rint(dur * 1000.0).astype(np.int64)
    text = col.text
    raw_cats, raw_names = [e.get("cat") for e in xs], [e.get("name", "") for e in xs]
    odd = sum(1 for v in raw_cats if v is not None and type(v) is not str) + sum(1 for v in raw_names if type(v) is not str)
    quality.add(REPAIRED, "name or category that is not text (a list, an object), read as its text form", odd,
                [text(v)[:60] for v in raw_names + raw_cats if v is not None and type(v) is not str], unit="value")
    cat_codes, cat_uniques = col.factorize_text([text(v) for v in raw_cats])
    kind = kinds_of_categories(cat_uniques)[cat_codes] if len(xs) else np.zeros(0, np.int8)
    name_id, names = col.factorize_text([text(v) for v in raw_names])
    names = _windows_paths(names, quality)
    # MTIA's device events: a dma* transfer is a copy, the rest are kernels.
    dma = is_dma_category(cat_uniques)[cat_codes] & is_dma_name(names)[name_id] if len(xs) else np.zeros(0, bool)
    kind[dma & (kind == EventKind.KERNEL)] = EventKind.MEMCPY
    unknown = ~is_known_category(cat_uniques)
    if unknown.any():
        per_cat = np.bincount(cat_codes, minlength=cat_uniques.size)
        counts = {str(c) or "(none)": int(per_cat[k]) for k, c in enumerate(cat_uniques) if unknown[k] and per_cat[k]}
        quality.add(NOT_READ, "category perfscope does not know", sum(counts.values()), counts)
    thread_id, threads = _threads(xs, thread_names)

    device, stream, correlation, copy_bytes = _gpu_columns(xs, kind, quality)

    # 5. exact copies of an earlier event
    dup = duplicate_rows([kind.astype(np.int64), name_id, thread_id.astype(np.int64), ts_ns, dur_ns],
                         lambda i: col.fingerprint(xs[i]))
    if dup.size:
        quality.add(DROPPED, "exact copy of an earlier event", int(dup.size), names[name_id[dup]])
        keep = np.ones(len(xs), dtype=bool)
        keep[dup] = False
        kind, name_id, ts_ns, dur_ns, thread_id = kind[keep], name_id[keep], ts_ns[keep], dur_ns[keep], thread_id[keep]
        device, stream, correlation, copy_bytes = device[keep], stream[keep], correlation[keep], copy_bytes[keep]

    # 6. a GPU event cannot outlast the start of the next one on its stream
    gpu_rows = np.flatnonzero(np.isin(kind, np.array(GPU_KINDS, dtype=np.int8)))
    over, clip_to = stream_overruns(ts_ns, ts_ns + dur_ns, device, stream, gpu_rows)
    if over.size:
        quality.add(CLIPPED, "runs past the start of the next event on its stream; clipped there",
                    int(over.size), names[name_id[over]])
        dur_ns[over] = clip_to - ts_ns[over]

    header: Header = read_header(raw)
    return TraceTable(
        kind=kind, name_id=name_id.astype(np.int32), ts_ns=ts_ns, dur_ns=dur_ns, thread_id=thread_id.astype(np.int32),
        device=device.astype(np.int32), stream=stream, correlation=correlation, copy_bytes=copy_bytes,
        names=names, threads=threads, origin_us=origin, base_time_ns=header.base_time_ns, rank=header.rank,
        rank_source=header.rank_source, world_size=header.world_size, device_properties=header.device_properties,
        distributed_info=header.distributed_info, host_steps=header.host_steps, path=raw.path, worker=raw.worker,
        truncated=raw.truncated, quality=quality, warnings=quality.warnings(raw.path.name) + header.warnings,
    )


# A drive letter and a control character that an escape made of a backslash: "C:\new" parsed as
# "C:" + newline + "ew". Only such names are touched.
_WINDOWS_PATH = re.compile(r"(?<![A-Za-z])[A-Za-z]:[\x08\x09\x0a\x0c\x0d\\]")
_UNESCAPE = {"\x08": "\\b", "\x09": "\\t", "\x0a": "\\n", "\x0c": "\\f", "\x0d": "\\r"}


def _windows_paths(names: np.ndarray, quality: DataQuality) -> np.ndarray:
    """Names holding a Windows path whose backslashes a valid JSON escape turned into control
    characters (``\\t``, ``\\n`` written unescaped) get them back; counted as repaired."""
    fixed = 0
    out = names.copy()
    for k, n in enumerate(names):
        if any(c in n for c in _UNESCAPE) and _WINDOWS_PATH.search(n):
            out[k] = "".join(_UNESCAPE.get(c, c) for c in n)
            fixed += 1
    quality.add(REPAIRED, "Windows path whose backslashes were read as escapes (\\t, \\n), taken literally", fixed,
                out[[k for k in range(len(names)) if out[k] != names[k]]], unit="name")
    return out


def _threads(xs: list[dict], thread_names: dict) -> tuple[np.ndarray, pd.DataFrame]:
    """Per row the index of its (pid, tid) pair, and the pairs with their thread names."""
    pid_codes, pid_uniques = col.factorize_text([str(e.get("pid")) for e in xs])
    tid_codes, tid_uniques = col.factorize_text([str(e.get("tid")) for e in xs])
    n_tid = max(len(tid_uniques), 1)
    pairs, thread_id = np.unique(pid_codes * n_tid + tid_codes, return_inverse=True)
    pid_of = [str(pid_uniques[k // n_tid]) for k in pairs]
    tid_of = [str(tid_uniques[k % n_tid]) for k in pairs]
    threads = pd.DataFrame({"pid": pid_of, "tid": tid_of,
                            "thread_name": [thread_names.get(k, "") for k in zip(pid_of, tid_of)]})
    return thread_id.reshape(-1), threads


def _gpu_columns(xs: list[dict], kind: np.ndarray, quality: DataQuality):
    """device, stream, correlation and copy_bytes columns; ``args`` is read only where analysis
    needs it (GPU events and runtime calls)."""
    n = len(xs)
    gpu = np.isin(kind, np.array([*GPU_KINDS, EventKind.GPU_ANNOTATION], dtype=np.int8))
    gpu_rows = np.flatnonzero(gpu)
    linked_rows = np.flatnonzero(gpu | (kind == EventKind.RUNTIME))
    copy_rows = np.flatnonzero(kind == EventKind.MEMCPY)
    device = np.full(n, _NO_ID, dtype=np.int64)
    stream = np.full(n, _NO_ID, dtype=np.int64)
    correlation = np.full(n, _NO_ID, dtype=np.int64)
    copy_bytes = np.full(n, _NO_ID, dtype=np.int64)
    gpu_args = [col.args_of(xs[i]) for i in gpu_rows]
    unusable: dict[str, int] = {}
    device[gpu_rows], unusable["device"] = col.int_column([a.get("device") for a in gpu_args], upper=2**31 - 1)
    stream[gpu_rows], unusable["stream"] = col.int_column([a.get("stream") for a in gpu_args])
    correlation[linked_rows], unusable["correlation"] = col.id_column([col.args_of(xs[i]).get("correlation") for i in linked_rows])
    copy_bytes[copy_rows], unusable["bytes"] = col.int_column([col.args_of(xs[i]).get("bytes") for i in copy_rows])
    unusable = {k: v for k, v in unusable.items() if v}
    quality.add(DROPPED, "values of args that are not integers in range (treated as unknown)",
                sum(unusable.values()), unusable, unit="value")
    for i in gpu_rows[(device[gpu_rows] < 0) | (stream[gpu_rows] < 0)]:
        # 2021 traces (and events with args: null): the GPU index is the pid, the stream the tid.
        if device[i] < 0:
            device[i] = col.device_of_pid(xs[i].get("pid"))
        if stream[i] < 0:
            stream[i] = col.stream_of_tid(xs[i].get("tid"))
    return device, stream, correlation, copy_bytes
