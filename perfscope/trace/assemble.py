"""Row columns of a trace file -> its :class:`~perfscope.trace.table.TraceTable`.

The repairs of :mod:`perfscope.trace.quality` are applied here, in its documented order, each
counted in the table's data-quality record. Every rule works on whole columns; event objects are
never needed again, except the few rows that look like exact copies, whose full events are asked
for (``fingerprints``) to tell a copy from two events that only share their columns.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pandas as pd

from perfscope.trace import columns as col
from perfscope.trace.header import read_header
from perfscope.trace.kinds import GPU_KINDS, EventKind, is_known_category, kinds_of_categories, refine_device_kinds
from perfscope.trace.quality import (
    ABSURD_DUR_US, CLIPPED, DROPPED, NOT_READ, REPAIRED, SET_ASIDE, DataQuality, duplicate_rows, stream_overruns,
)
from perfscope.trace.reader import RawTrace
from perfscope.trace.rows import Rows
from perfscope.trace.table import TraceTable
from perfscope.trace.values import narrow, smallest_int

# Plausible magnitudes (microseconds): epoch timestamps are ~1.7e15 today; beyond this bound the
# nanosecond columns could overflow int64, and no real trace comes near it.
MAX_ABS_TS_US = 4e15


def _refactorize(codes: np.ndarray, texts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes and uniques in order of first appearance among the rows given (what factorizing
    the rows' texts gives)."""
    if not len(codes):
        return np.zeros(0, np.int8), np.zeros(0, dtype=object)
    # the few distinct codes by hashing, then one lookup per row into the narrowest type that
    # holds them (factorizing the rows themselves makes an int64 per row; a few hundred names
    # take two bytes)
    uniq = pd.unique(codes)
    lookup = np.full(len(texts), -1, smallest_int(np.array([-1, len(uniq)])).dtype)
    lookup[uniq] = np.arange(len(uniq))
    return lookup[codes], texts[uniq]


_NS_CHUNK = 1 << 20  # rows at a time of the per-row temporaries (_ns_in_place, the astray test, _threads)


def _ns_in_place(us: np.ndarray, origin: float) -> np.ndarray:
    """``rint((us - origin) * 1000)`` as int64 nanoseconds, written over the float64 microseconds'
    own memory a chunk at a time: a large trace's two time columns are its largest, and a second
    copy of them would set its peak. ``us`` is consumed (its memory is the result's)."""
    if not (us.flags.c_contiguous and us.flags.writeable and us.flags.owndata):
        us = us.copy()
    out = us.view(np.int64)
    for i in range(0, us.size, _NS_CHUNK):
        # the chunk is read whole into a temporary before it is written over
        out[i : i + _NS_CHUNK] = np.rint((us[i : i + _NS_CHUNK] - origin) * 1000.0)
    return out


def assemble(rows: Rows, raw: RawTrace, fingerprints: Callable[[np.ndarray], list]):
    """Build the table of one file from its rows.

    Args:
        rows: The file's duration events as columns (:class:`~perfscope.trace.rows.Rows`,
            finished).
        raw: The file's header fields (``raw.data`` without events is enough), path, worker and
            what its decoding repaired or cut (``raw.quality``).
        fingerprints: Given entry indices into ``traceEvents`` (int64 array, ascending), one
            hashable per entry, equal for two entries exactly when every field is equal.

    Returns:
        The :class:`~perfscope.trace.table.TraceTable`.
    """
    c, texts = rows.columns, rows.texts
    quality = DataQuality(list(raw.quality.entries))
    quality.add(DROPPED, "entries of traceEvents that are not event objects", rows.not_objects - raw.deep_events)
    quality.add(NOT_READ, "begin/end (B/E) duration events: perfscope reads complete (X) events, as Kineto writes",
                rows.begin_end)
    quality.add(NOT_READ, "events of a phase (ph) the trace format does not define", sum(rows.unknown_phases.values()),
                rows.unknown_phases)
    all_names = texts["name"]
    ts, dur = c["ts"], c["dur"]
    # comparisons with NaN are false: NaN and infinite ts fail the range test
    usable = (ts >= -MAX_ABS_TS_US) & (ts <= MAX_ABS_TS_US) & ~np.isnan(dur)
    if not usable.all():
        quality.add(DROPPED, "missing, non-numeric or out-of-range ts or dur", int((~usable).sum()),
                    all_names[c["name"][~usable]])
    # row positions as int32 (a 2**31-row trace is 60 GB of text); no copy of the times when all are usable
    index = np.int32 if rows.n < 2**31 else np.int64
    if usable.all():
        kept = np.arange(rows.n, dtype=index)
        unusable = np.zeros(0, np.int64)
    else:
        kept = np.flatnonzero(usable).astype(index)
        unusable = np.flatnonzero(~usable)
        ts, dur = ts[kept], dur[kept]
    del usable
    zeroed = (ts == 0) & (dur == 0)
    negative = dur < 0
    absurd = dur > ABSURD_DUR_US
    # An event a day away from the bulk of the trace is a corrupt timestamp, not work (and would
    # move the origin so far that float rounding blurs every other time).
    bulk = np.median(ts[~zeroed], overwrite_input=True) if (~zeroed).any() else 0.0  # of a copy: in place
    astray = np.empty(len(ts), dtype=bool)
    for i in range(0, len(ts), _NS_CHUNK):  # a chunk at a time: no float copy of every ts
        astray[i : i + _NS_CHUNK] = np.abs(ts[i : i + _NS_CHUNK] - bulk) > ABSURD_DUR_US
    astray &= ~zeroed
    names_of = lambda mask: all_names[c["name"][kept[mask]]]  # noqa: E731
    quality.add(SET_ASIDE, "ts and dur both 0, which Kineto writes for an event it lost", int(zeroed.sum()), names_of(zeroed))
    quality.add(DROPPED, "negative duration", int(negative.sum()), names_of(negative))
    quality.add(DROPPED, "duration longer than a day", int(absurd.sum()), names_of(absurd))
    quality.add(DROPPED, "ts more than a day from the rest of the trace", int(astray.sum()), names_of(astray))
    keep = ~(zeroed | negative | absurd | astray)
    # What the events perfscope dropped as corrupt were launched by: their launch calls must not
    # read as kernels the profiler lost (analysis/evidence.py).
    corrupt = c["correlation"][np.concatenate([unusable, kept[negative | absurd | astray]])]
    dropped_correlations = np.unique(corrupt[corrupt >= 0])
    del corrupt, unusable
    if not keep.all():
        kept, ts, dur = kept[keep], ts[keep], dur[keep]
    del keep, zeroed, negative, absurd, astray
    # the columns of the kept rows; in place (a column at a time), so no second copy of them all
    k = c
    if len(kept) < rows.n:
        for name in [n for n in c if n not in ("ts", "dur")]:
            c[name] = c[name][kept]
    del c["ts"], c["dur"]

    origin = float(ts.min()) if len(ts) else 0.0
    ts_ns, dur_ns = _ns_in_place(ts, origin), _ns_in_place(dur, 0.0)
    del ts, dur
    dur_ns = narrow(dur_ns)  # int32 when every event is under 2.1 s: before the steps below peak
    odd_n, odd_c = _kept_rows(rows.sparse["odd_names"], kept), _kept_rows(rows.sparse["odd_cats"], kept)
    odd_examples = [t[:60] for t in all_names[k["name"][odd_n]]] + [t[:60] for t in texts["cat"][k["cat"][odd_c]]]
    quality.add(REPAIRED, "name or category that is not text (a list, an object), read as its text form",
                len(odd_n) + len(odd_c), odd_examples, unit="value")
    cat_codes, cat_uniques = _refactorize(k.pop("cat"), texts["cat"])
    kind = kinds_of_categories(cat_uniques)[cat_codes] if len(kept) else np.zeros(0, np.int8)
    name_id, names = _refactorize(k.pop("name"), all_names)
    names = _windows_paths(names, quality)
    refine_device_kinds(kind, cat_uniques, cat_codes, names, name_id)  # MTIA's copies and waits
    unknown = ~is_known_category(cat_uniques)
    if unknown.any():
        per_cat = np.bincount(cat_codes, minlength=cat_uniques.size)
        counts = {str(cat) or "(none)": int(per_cat[j]) for j, cat in enumerate(cat_uniques) if unknown[j] and per_cat[j]}
        quality.add(NOT_READ, "category perfscope does not know", sum(counts.values()), counts)
    thread_id, threads = _threads(k, texts, rows.thread_names)
    del k["pid"], k["tid"]
    device, stream, correlation, copy_bytes = _gpu_columns(k, kind, kept, rows, quality)
    external_id, entry = k.pop("external_id"), k.pop("entry")
    sm_fill, occupancy = k.pop("sm_fill"), k.pop("occupancy")
    shape_id, shapes = _refactorize(k.pop("shape"), texts["shape"])

    # 5. exact copies of an earlier event
    # (copies share every column: the more columns compared, the fewer full events read again)
    dup = duplicate_rows([kind, name_id, thread_id, ts_ns, dur_ns, correlation, device, stream, copy_bytes, cat_codes,
                          external_id], lambda r: fingerprints(entry[r]))
    del external_id, cat_codes
    if dup.size:
        quality.add(DROPPED, "exact copy of an earlier event", int(dup.size), names[name_id[dup]])
        keep = np.ones(len(kept), dtype=bool)
        keep[dup] = False
        kind, name_id, ts_ns, dur_ns, thread_id = kind[keep], name_id[keep], ts_ns[keep], dur_ns[keep], thread_id[keep]
        device, stream, correlation, copy_bytes = device[keep], stream[keep], correlation[keep], copy_bytes[keep]
        sm_fill, occupancy, shape_id = sm_fill[keep], occupancy[keep], shape_id[keep]

    # 6. a GPU event cannot outlast the start of the next one on its stream
    gpu_rows = np.flatnonzero(np.isin(kind, np.array(GPU_KINDS, dtype=np.int8)))
    over, clip_to = stream_overruns(ts_ns, dur_ns, device, stream, gpu_rows)
    if over.size:
        quality.add(CLIPPED, "runs past the start of the next event on its stream; clipped there",
                    int(over.size), names[name_id[over]])
        dur_ns[over] = clip_to - ts_ns[over]

    header = read_header(raw)
    return TraceTable(
        kind=kind, name_id=smallest_int(name_id), ts_ns=ts_ns, dur_ns=dur_ns, thread_id=smallest_int(thread_id),
        device=smallest_int(device), stream=smallest_int(stream), correlation=narrow(correlation),
        copy_bytes=narrow(copy_bytes), sm_fill=sm_fill, occupancy=occupancy,
        shape_id=smallest_int(shape_id), shapes=shapes,
        names=names, threads=threads, origin_us=origin, base_time_ns=header.base_time_ns, rank=header.rank,
        rank_source=header.rank_source, world_size=header.world_size, device_properties=header.device_properties,
        distributed_info=header.distributed_info, process_groups=header.process_groups, host_steps=header.host_steps,
        node=header.node, host=header.host, ddp=header.ddp, loader=header.loader, memory_capacity=header.memory_capacity, energy=header.energy,
        telemetry=header.telemetry, flops=header.flops, dropped_correlations=dropped_correlations, memory=memory_frame(rows.memory, origin, threads), path=raw.path, worker=raw.worker,
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
    for j, n in enumerate(names):
        if any(ch in n for ch in _UNESCAPE) and _WINDOWS_PATH.search(n):
            out[j] = "".join(_UNESCAPE.get(ch, ch) for ch in n)
            fixed += 1
    quality.add(REPAIRED, "Windows path whose backslashes were read as escapes (\\t, \\n), taken literally", fixed,
                out[[j for j in range(len(names)) if out[j] != names[j]]], unit="name")
    return out


def _threads(k: dict, texts: dict, thread_names: dict) -> tuple[np.ndarray, pd.DataFrame]:
    """Per row the index of its (pid, tid) pair, and the pairs with their thread names."""
    pid_codes, pid_uniques = _refactorize(k["pid"], texts["pid"])
    tid_codes, tid_uniques = _refactorize(k["tid"], texts["tid"])
    n_tid = max(len(tid_uniques), 1)
    wide = np.int32 if max(len(pid_uniques), 1) * n_tid < 2**31 else np.int64
    pair = pid_codes.astype(wide, copy=False)  # in the codes' own memory where they are wide enough
    pair *= wide(n_tid)
    pair += tid_codes
    del pid_codes, tid_codes
    # the few distinct pairs by hashing, sorted, then each row's place among them written into
    # int32 a chunk at a time: np.unique, or one searchsorted of every row, would make int64
    # copies of them (the largest allocations of a large read)
    pairs = np.sort(pd.unique(pair))
    thread_id = np.empty(pair.size, np.int32)
    for i in range(0, pair.size, _NS_CHUNK):
        thread_id[i : i + _NS_CHUNK] = np.searchsorted(pairs, pair[i : i + _NS_CHUNK])
    del pair
    pid_of = [str(pid_uniques[j // n_tid]) for j in pairs]
    tid_of = [str(tid_uniques[j % n_tid]) for j in pairs]
    threads = pd.DataFrame({"pid": pid_of, "tid": tid_of,
                            "thread_name": [thread_names.get(p, "") for p in zip(pid_of, tid_of)]})
    return thread_id.reshape(-1), threads


# c10::DeviceType values (c10/core/DeviceType.h) that Kineto writes as "Device Type"
_DEVICE_TYPES = {0: "cpu", 1: "cuda", 13: "xpu", 17: "hpu", 23: "mtia", 24: "privateuseone"}


def device_name(kind: int | None, index: int | None) -> str:
    """``cpu``, ``cuda:0``... for a ``[memory]`` instant's Device Type and Device Id."""
    name = _DEVICE_TYPES.get(kind, f"type {kind}") if kind is not None else "unknown"
    return name if name == "cpu" or index is None or index < 0 else f"{name}:{index}"


def memory_frame(instants: list, origin_us: float, threads: pd.DataFrame) -> pd.DataFrame | None:
    """The table's ``memory`` frame (see :class:`~perfscope.trace.table.TraceTable`) from the
    rows' ``[memory]`` tuples, times put on the table's clock (``origin_us``); None without any."""
    if not instants:
        return None
    ts, size, allocated, reserved, kind, index, pid, tid = zip(*instants)
    where = {(p, t): i for i, (p, t) in enumerate(zip(threads["pid"], threads["tid"]))}
    frame = pd.DataFrame({
        "ts_ns": np.rint((np.asarray(ts, np.float64) - origin_us) * 1000.0).astype(np.int64),
        "bytes": np.asarray(size, np.float64),
        "allocated": np.array(allocated, dtype=np.float64),  # None -> NaN
        "reserved": np.array(reserved, dtype=np.float64),
        "device": [device_name(k, i) for k, i in zip(kind, index)],
        "thread_id": np.array([where.get(pair, -1) for pair in zip(pid, tid)], np.int32),
    })
    return frame.sort_values("ts_ns", kind="stable", ignore_index=True)


def _kept_rows(rows: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """Positions among the kept rows of the given (sorted) rows that were kept."""
    at = np.searchsorted(kept, rows)
    ok = at < len(kept)
    ok[ok] = kept[at[ok]] == rows[ok]
    return at[ok]


def _gpu_columns(k: dict, kind: np.ndarray, kept: np.ndarray, rows: Rows, quality: DataQuality):
    """device, stream, correlation and copy_bytes columns (kept per kind of event by the batches,
    :mod:`perfscope.trace.events`), with the count of unusable ``args`` values of kept rows."""
    unusable: dict[str, int] = {}
    bad_rows: dict[str, list[int]] = {}
    for (f, r) in rows.bad_values:
        bad_rows.setdefault(f, []).append(r)
    for f in ("device", "stream", "correlation", "bytes"):
        unusable[f] = len(_kept_rows(np.array(sorted(bad_rows.get(f, [])), dtype=np.int64), kept))
    correlation = k.pop("correlation")
    if unusable["correlation"]:
        correlation = correlation.astype(np.int64)
        # identifiers past 64 bits (or not integers): re-coded as a whole, as id_column does
        linked_rows = np.flatnonzero(np.isin(kind, np.array([*GPU_KINDS, EventKind.GPU_ANNOTATION, EventKind.RUNTIME],
                                                             dtype=np.int8)))
        minus_one = set(_kept_rows(rows.sparse["correlation_minus_one"], kept).tolist())
        values = []
        for r in linked_rows.tolist():
            raw = rows.bad_values.get(("correlation", int(kept[r])), _ABSENT)
            if raw is not _ABSENT:
                values.append(raw)
            elif correlation[r] != col.NO_ID or r in minus_one:
                values.append(int(correlation[r]))
            else:
                values.append(None)
        correlation[linked_rows], unusable["correlation"] = col.id_column(values)
    unusable = {f: v for f, v in unusable.items() if v}
    quality.add(DROPPED, "values of args that are not integers in range (treated as unknown)",
                sum(unusable.values()), unusable, unit="value")
    # the table keeps them int32 where every value fits (perfscope.trace.values.narrow)
    return k.pop("device"), k.pop("stream"), correlation, k.pop("bytes")


_ABSENT = object()


def build_table(raw: RawTrace) -> TraceTable:
    """Turn a parsed trace into a :class:`TraceTable`, repairing events in the documented order.

    The streaming reader (:func:`perfscope.trace.load.read_table`) builds the same table without
    the parsed tree; this is the path of a file read whole (one that needed repairs).

    Args:
        raw: The parsed file from :func:`perfscope.trace.reader.read_trace`.

    Returns:
        The table; zero rows when the trace holds no duration events (the analysis says so).
        Its ``quality`` record and ``warnings`` say what was repaired, dropped, clipped or set
        aside (:mod:`perfscope.trace.quality`).
    """
    from perfscope.trace.events import from_dicts
    from perfscope.trace.rows import Rows

    events = raw.data["traceEvents"]
    rows = Rows()
    rows.add(from_dicts(events))
    return assemble(rows.finish(), raw, lambda entries: [col.fingerprint(events[i]) for i in entries.tolist()])
