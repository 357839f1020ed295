"""``timeline.json``: the timeline's drawings, stored beside ``summary.json`` so that a report
renders from the output folder alone, with its traces deleted or moved.

What is stored is what the timeline section draws, not the events: per step shown, each lane's
runs of pixel columns (:func:`perfscope.reports.timeline_data.raster`) with their colour, coverage
level and tooltip, the "counted as" lane, the idle shading and labels, and the GPU utilisation
bars. Positions are pixel columns, 0..:data:`~perfscope.reports.timeline_data.COLUMNS`. A record
belongs to one summary: ``summary_digest`` (:func:`summary_digest`) must match the summary it is
rendered with, else it is ignored.

Errors: :func:`decode` raises :class:`~perfscope.errors.PerfscopeError` on anything that is not
a record of a version this perfscope reads, or whose fields have the wrong type.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec
import orjson

from perfscope.atomic import RecordFileError, read_bounded
from perfscope.errors import PerfscopeError
from perfscope.record.view import Record, record_of

SCHEMA = "perfscope.timeline"
SCHEMA_VERSION = 1
FILE_NAME = "timeline.json"


class Run(msgspec.Struct, array_like=True, frozen=True):
    """Columns ``a``..``b`` (pixels) of one colour; ``level`` the coverage drawn (0.25..1);
    ``title`` the tooltip; ``single`` the name of the one event that fills it, if one does."""

    a: float
    b: float
    colour: str
    level: float = 1.0
    title: str | None = None
    single: str | None = None


class Lane(msgspec.Struct, frozen=True):
    """One lane: its label, whether it is a GPU stream's (the idle shading spans those), its runs."""

    label: str
    gpu: bool
    runs: list[Run]


class Label(msgspec.Struct, array_like=True, frozen=True):
    """A wide stretch of the "counted as" lane named in place: columns ``a``..``b``, its text."""

    a: float
    b: float
    text: str


class Bar(msgspec.Struct, array_like=True, frozen=True):
    """A GPU utilisation sample: columns ``a``..``b``, ``height`` 0..1 of the lane, tooltip."""

    a: float
    b: float
    height: float
    title: str


class StepView(msgspec.Struct, frozen=True):
    """One step as drawn. ``span_ns``: the step window's length (ns); ``verdict``: the step's
    class, else its status; ``telemetry``: None when the trace has no samples (no lane)."""

    rank: int | None
    step: int
    representative: bool
    step_time_us: float | None
    verdict: str | None
    mode: str
    span_ns: int
    lanes: list[Lane]
    shade: list[Run]
    partition: list[Run]
    labels: list[Label]
    telemetry: list[Bar] | None = None


class TimelineRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The timeline of one summary: ``views`` of rank ``rank``'s steps around the representative
    one (``chosen`` indexes the one shown first), of ``total_views`` steps the traces held;
    ``others``: further ranks at their representative steps; the two legends as
    (label, colour) pairs."""

    schema: str = SCHEMA
    schema_version: int = SCHEMA_VERSION
    summary_digest: str
    rank: int | None
    views: list[StepView]
    chosen: int
    total_views: int
    others: list[StepView] = []
    legend: list[tuple[str, str]] = []
    partition_legend: list[tuple[str, str]] = []

    def holds(self, step: int | None) -> bool:
        """Whether the stored views include ``step`` (None: the default view, always held)."""
        return step is None or any(v.step == step for v in self.views)

    def choose(self, step: int | None) -> TimelineRecord:
        """The record with ``step``'s view shown first (unchanged when it holds no such step)."""
        k = next((k for k, v in enumerate(self.views) if v.step == step), None)
        return self if k is None else msgspec.structs.replace(self, chosen=k)


def summary_digest(record: Record) -> str:
    """A digest of what ties a timeline to its summary: when it was written and its steps
    (rank, step, step time). 32 hex digits."""
    steps = [(s.get("rank"), s.get("step"), s.get("step_time_us")) for s in record.steps or []]
    text = orjson.dumps([record.generated_at, steps], option=orjson.OPT_SERIALIZE_NUMPY)
    return hashlib.blake2b(text, digest_size=16).hexdigest()


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(TimelineRecord)


def encode(record: TimelineRecord) -> bytes:
    """The record as JSON bytes."""
    return _ENCODER.encode(record)


def decode(data: bytes, where: str = FILE_NAME) -> TimelineRecord:
    """A record from JSON bytes, validated (types, schema name and version).

    Raises:
        PerfscopeError: not a timeline record this perfscope reads (one line naming ``where``).
    """
    try:
        record = _DECODER.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise PerfscopeError(f"{where}: malformed timeline record: {e}") from None
    if record.schema != SCHEMA or record.schema_version != SCHEMA_VERSION:
        raise PerfscopeError(f"{where}: not a timeline record of version {SCHEMA_VERSION}")
    if not 0 <= record.chosen < max(len(record.views), 1):
        raise PerfscopeError(f"{where}: malformed timeline record: chosen view {record.chosen} does not exist")
    return record


def read_beside(summary_path, summary: dict | Record) -> tuple[TimelineRecord | None, str | None]:
    """The ``timeline.json`` beside a summary file and belonging to it: (record, None); (None,
    why) when there is one that cannot be used; (None, None) when there is none."""
    path = Path(summary_path).parent / FILE_NAME
    try:
        data = read_bounded(path)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"{path}: cannot be read ({e.strerror or e})"
    except RecordFileError as e:
        return None, str(e)
    try:
        record = decode(data, str(path))
    except PerfscopeError as e:
        return None, str(e)
    if record.summary_digest != summary_digest(record_of(summary)):
        return None, f"{path} belongs to another summary"
    return record, None
