"""The compact columnar trace table: one numpy column per field, strings interned.

Times are integer **nanoseconds** relative to the trace's first duration event (``origin_us``),
so sub-microsecond events keep their length and no duration turns negative through rounding. Only
the duration events (``ph == "X"``) that analysis needs become rows; flows, instants and counters
are left out, metadata events fill the thread-name table. Events that cannot be used as written
are repaired in the order :mod:`perfscope.trace.quality` documents, each counted in the table's
data-quality record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from perfscope.record.host_steps import HostStep
from perfscope.record.job_facts import DdpRecord, LoaderRecord, NodeRecord
from perfscope.record.schema import DistributedInfo, MemoryCapacity
from perfscope.record.telemetry_format import TelemetryRecord
from perfscope.trace.header import Device, ProcessGroupConfig
from perfscope.trace.kinds import EventKind
from perfscope.trace.quality import DataQuality


@dataclass
class TraceTable:
    """One rank's trace as columns.

    Row ``i`` is one duration event. Columns (all 1-D, length ``n_events``):

    - ``kind`` (int8): :class:`~perfscope.trace.kinds.EventKind`.
    - ``name_id`` (identifier): index into ``names``.
    - ``ts_ns`` (int64), ``dur_ns`` (int32 or int64): start and duration in nanoseconds; start
      is relative to ``origin_us``; durations are never negative (negative ones are dropped).
    - ``thread_id`` (identifier): index into ``threads`` (a ``pid``/``tid`` pair).
    - ``device`` (identifier): GPU index for GPU events, -1 elsewhere.
    - ``stream`` (identifier): GPU stream id, -1 elsewhere. Streams are unique only with
      ``device``.
    - ``correlation`` (int32 or int64): links a runtime call to the GPU event it launched; -1 if
      absent (and for rows that are neither).
    - ``copy_bytes`` (int32 or int64): bytes moved by a memcpy (``args.bytes``); -1 elsewhere or
      unknown.

    Identifier columns are compared, counted and used as indices, never computed with, so each is
    kept in the narrowest signed integer type that holds every value of the file
    (:func:`perfscope.trace.values.smallest_int`: a device index takes one byte, the codes of a
    few thousand names two). ``dur_ns``, ``correlation`` and ``copy_bytes`` are int32 when every
    value fits (every event shorter than 2.1 s), int64 otherwise (:func:`perfscope.trace.values.narrow`). The real A100 rank the tests read takes
    26 bytes a row, where int64 columns would take 65. Arithmetic that could leave a
    column's type (sums of bytes or durations, keys built from two identifiers) widens first.

    Attributes:
        names: Unique event names (object array of str).
        threads: One row per (pid, tid) with columns ``pid``, ``tid``, ``thread_name``.
        origin_us: Trace timestamp (microseconds, as written in the file) that ``ts_ns == 0`` is.
        base_time_ns: ``baseTimeNanoseconds`` of the file (0 when absent). The absolute time of an
            event is ``base_time_ns + (origin_us * 1000 + ts_ns)``, which aligns ranks.
        rank: Rank from ``distributedInfo`` or the file name; None when unknown.
        rank_source: ``"distributedInfo"``, ``"file name"`` or None.
        world_size: From ``distributedInfo``; None when unknown.
        device_properties: ``deviceProperties`` of the file (:class:`perfscope.trace.header.Device`), possibly empty.
        distributed_info: What the record keeps of the file's ``distributedInfo``, possibly empty.
        process_groups: Its ``pg_config`` (:class:`perfscope.trace.header.ProcessGroupConfig`), possibly empty.
        host_steps: What ``perfscope profile`` measured of the host per step (CPU time, run-queue
            wait), by step number; empty for traces recorded otherwise.
        node, host, ddp, loader: The rank's node, host name, DDP buckets and first DataLoader
            (:class:`perfscope.trace.header.Header`); None when not recorded.
        memory_capacity: Host and device memory, bytes (:class:`perfscope.trace.header.Header`).
        energy: The host record's energy counter (:class:`perfscope.trace.header.Header`).
        telemetry: The GPU telemetry record (:class:`perfscope.trace.header.Header`).
        flops: One step's FLOPs as ``perfscope profile`` counted them
            (:class:`perfscope.record.step_flops.StepFlops`), or None.
        dropped_correlations: The correlation ids (sorted, unique) of the events the reader
            dropped as corrupt (out-of-range times, negative or day-long durations).
        shape_id, shapes: Per row the index into ``shapes`` (unique texts) of an operator's
            ``Input Dims`` as compact JSON (``record_shapes=True``); ``""`` for other rows.
        sm_fill, occupancy: Per row (uint8), a kernel's ``blocks per SM`` capped at 1 in 250ths and
            its ``est. achieved occupancy %`` (0-100), as Kineto estimates them at launch; 255 where
            the row is no kernel or the trace does not say (None: a table built without them).
        memory: The allocator's ``[memory]`` instants (Kineto writes them with
            ``profile_memory=True``), one row each in time order, or None when the file has none:
            ``ts_ns`` (int64, on this table's clock), ``bytes`` (float64: allocated when positive,
            freed when negative), ``allocated``/``reserved`` (float64 bytes after the event, from
            ``Total Allocated``/``Total Reserved``; NaN where the file does not say, as 2021
            traces), ``device`` (str: ``cpu``, ``cuda:0``, or ``type T:N``), ``thread_id`` (int32
            into ``threads``; -1 for a thread with no duration event).
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
    device_properties: list[Device] = field(default_factory=list)
    distributed_info: DistributedInfo = field(default_factory=DistributedInfo)
    process_groups: list[ProcessGroupConfig] = field(default_factory=list)
    host_steps: dict[int, HostStep] = field(default_factory=dict)
    node: NodeRecord | None = None
    host: str | None = None
    ddp: DdpRecord | None = None
    loader: LoaderRecord | None = None
    memory_capacity: MemoryCapacity = field(default_factory=MemoryCapacity)
    energy: dict = field(default_factory=dict)
    telemetry: TelemetryRecord | None = None
    flops: object = None
    dropped_correlations: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    memory: pd.DataFrame | None = field(default=None, repr=False)
    shape_id: np.ndarray | None = field(default=None, repr=False)
    shapes: np.ndarray | None = field(default=None, repr=False)
    sm_fill: np.ndarray | None = field(default=None, repr=False)
    occupancy: np.ndarray | None = field(default=None, repr=False)
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
        """End of every event (ns, relative to the origin): a new int64 array of every row; for
        some rows, :meth:`end_of` costs only those."""
        return self.ts_ns + self.dur_ns

    def end_of(self, rows: np.ndarray) -> np.ndarray:
        """End (ns, relative to the origin) of the given rows (indices or a boolean mask)."""
        return self.ts_ns[rows] + self.dur_ns[rows]

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
