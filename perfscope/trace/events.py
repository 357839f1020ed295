"""A batch of ``traceEvents`` entries -> the columns the trace table is built from.

The reader decodes a trace in batches (:mod:`perfscope.trace.stream`) and never holds the whole
JSON tree. A batch is decoded with msgspec into typed structs that keep only the fields the
analysis reads (a third of orjson's time on Kineto traces, since the other fields are skipped,
not built); a batch whose values do not fit those types (a name that is a list, a string where a
number belongs) is decoded with orjson into dicts instead. Both give the same :class:`Batch`
through one set of rules, the rules the table applied to whole files before (the data-quality
counts of :mod:`perfscope.trace.table` depend on them).

Only per-row values survive a batch: numbers as numpy columns and texts as codes into a
:class:`Interner`, so memory grows with the rows kept (tens of bytes each), not with the text.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import msgspec
import numpy as np
import orjson

from perfscope.trace import columns as col
from perfscope.trace.values import (  # noqa: F401 (Incomplete, Undecodable, Interner, as_orjson: this module's API)
    Incomplete, Interner, Undecodable, discriminator, ids, ints, narrow, numbers, text_codes, typed_ints,
    as_orjson,
)
from perfscope.trace.kinds import GPU_KINDS, EventKind, kinds_of_categories, refine_device_kinds

_NAN = float("nan")
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_U64_MAX = 2**64 - 1
_DEVICE_MAX = 2**31 - 1


class _Args(msgspec.Struct, gc=False):
    # -1 (absent) as the columns have it; a null here is left to the dict path
    device: int = -1
    stream: int = -1
    correlation: int | None = None  # absent and -1 differ when identifiers are re-coded
    bytes: int = -1
    name: str = ""
    external_id: int | None = msgspec.field(default=None, name="External id")
    # operators' input shapes (record_shapes=True), kept as the file's text: decoded only if shown
    # (a Raw in a union decodes nothing: msgspec takes it alone, empty when absent)
    input_dims: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw, name="Input Dims")
    # kernels' launch figures (Kineto computes them from the launch's grid and the device)
    blocks_per_sm: float | None = msgspec.field(default=None, name="blocks per SM")
    occupancy: float | None = msgspec.field(default=None, name="est. achieved occupancy %")
    # the allocator's instants ([memory]): a float type so that any number passes the typed path
    mem_bytes: float | None = msgspec.field(default=None, name="Bytes")
    total_allocated: float | None = msgspec.field(default=None, name="Total Allocated")
    total_reserved: float | None = msgspec.field(default=None, name="Total Reserved")
    device_type: int | None = msgspec.field(default=None, name="Device Type")
    device_id: int | None = msgspec.field(default=None, name="Device Id")


_NO_ARGS = _Args()


class _Event(msgspec.Struct, gc=False):
    ph: str | None = None
    name: str = ""
    cat: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float = _NAN  # NaN: absent (a JSON text cannot hold NaN)
    dur: float = _NAN
    args: _Args | None = None


_TYPED_ROOT = msgspec.json.Decoder(list[list[_Event]])
_TYPED_LIST = msgspec.json.Decoder(list[_Event])
# A batch is decoded inside brackets that put its events as deep as the file had them (orjson
# refuses values past 1024 levels, and must refuse the same ones): ``[[...]]`` for the events of
# a top-level object, ``[...]`` for a bare array. Arrays, not an object, so that a span reaching
# past the events array (into the header after it) can never decode.
ROOT_PREFIX, ROOT_SUFFIX = b"[[", b"]]"
LIST_PREFIX, LIST_SUFFIX = b"[", b"]"


def unwrap(decoded: list, root_is_list: bool) -> list:
    """The events of a decoded batch.

    Raises:
        Undecodable: the text closed the events array and opened another one.
    """
    if root_is_list:
        return decoded
    if len(decoded) != 1:
        raise Undecodable("a batch past the end of traceEvents")
    return decoded[0]


@dataclass
class Batch:
    """The columns of one batch's duration (``ph == "X"``) events, and what else it held.

    Per-row columns (length ``n``): ``ts``, ``dur`` (float64 µs as written, NaN where not a
    number); ``name``, ``cat``, ``pid``, ``tid`` (int32 codes into ``uniques[...]``); ``device``,
    ``stream``, ``correlation``, ``bytes``: the table's columns of the same names (from ``args``,
    -1 where absent, unusable or not kept for that kind of event; a 2021 trace's GPU index and
    stream from ``pid``/``tid``), int32 or int64; ``external_id`` (``args["External id"]``, to tell
    near-copies apart); ``entry`` (int64: the event's index among the batch's entries);
    ``shape`` (int32 codes into ``uniques["shape"]``): an operator's ``Input Dims`` as compact
    JSON text (no spaces), ``""`` for other rows and operators recorded without shapes;
    ``sm_fill``, ``occupancy`` (uint8, kernels only, :data:`NO_FIGURE` elsewhere): the kernel's
    ``blocks per SM`` capped at 1 in 250ths, and its ``est. achieved occupancy %`` (0-100).
    Rare facts are kept sparse: ``odd_names``/``odd_cats`` (rows whose value was not text),
    ``correlation_minus_one`` (rows whose correlation was written as -1), ``bad_values``.

    Attributes:
        entries: How many ``traceEvents`` entries the batch held.
        not_objects, begin_end: Entries that are not objects; B/E events.
        unknown_phases: ``ph`` text -> count, for phases the format does not define.
        thread_names: ``(pid, tid)`` texts -> thread name, from ``thread_name`` metadata events.
        bad_values: ``(field, row) -> value`` of the unusable ``args`` values the table would keep
            (rare): counted as dropped, and an identifier column is re-coded as a whole when one
            does not fit 64 bits.
        memory: The allocator's ``[memory]`` instants, one tuple each: ``(ts µs, Bytes, Total
            Allocated, Total Reserved, Device Type, Device Id, pid text, tid text)``, a value None
            where absent or not a number (:func:`keep_memory_instant`).
    """

    n: int
    columns: dict[str, np.ndarray]
    uniques: dict[str, list[str]]
    entries: int = 0
    not_objects: int = 0
    begin_end: int = 0
    unknown_phases: dict[str, int] = field(default_factory=dict)
    thread_names: dict = field(default_factory=dict)
    bad_values: dict = field(default_factory=dict)
    odd_names: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    odd_cats: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    correlation_minus_one: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    memory: list = field(default_factory=list)


NO_FIGURE = 255  # sm_fill / occupancy of a row that has none
SM_FILL_SCALE = 250  # sm_fill 250 is a kernel with at least one block per SM


@functools.lru_cache(maxsize=4096)
def _raw_dims(raw: bytes) -> str:
    try:  # through orjson, as the plain path writes it: the same text for the same value
        return _dims_text(orjson.loads(raw)) if raw[:1] == b"[" else ""
    except orjson.JSONDecodeError:
        return ""


def _dims_text(dims) -> str:
    """An operator's ``Input Dims`` as compact JSON text ("" when absent or not a list)."""
    if isinstance(dims, msgspec.Raw):
        return _raw_dims(bytes(dims)) if len(dims) else ""
    try:
        return orjson.dumps(dims).decode() if isinstance(dims, list) else ""
    except TypeError:  # an integer past 64 bits
        return ""


def _kernel_figures(blocks: list, occupancy: list, kernel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ``sm_fill`` and ``occupancy`` columns (uint8) from the per-row values (numbers or
    anything else, as the file had them) and the kernel rows."""
    rows = np.flatnonzero(kernel)

    def column(values, scale, cap):
        out = np.full(len(values), NO_FIGURE, np.uint8)
        if rows.size:  # a kernel's only: most rows are host events
            v = np.array([values[i] if type(values[i]) in (int, float) else np.nan for i in rows.tolist()],
                         dtype=np.float64)
            ok = np.isfinite(v) & (v >= 0)
            out[rows[ok]] = np.rint(np.minimum(v[ok] * scale, cap)).astype(np.uint8)
        return out
    return column(blocks, SM_FILL_SCALE, SM_FILL_SCALE), column(occupancy, 1.0, 100)


MEMORY_EVENT = "[memory]"  # the name Kineto gives the allocator's instants (profile_memory=True)


def _number(v) -> float | None:
    return float(v) if type(v) in (int, float) and v == v and abs(v) < 2**63 else None


def keep_memory_instant(batch: Batch, ts, pid, tid, size, allocated, reserved, kind, index) -> None:
    """Add one ``[memory]`` instant to ``batch.memory`` (its ``ts``, ``Bytes``, ``Total
    Allocated``, ``Total Reserved``, ``Device Type``, ``Device Id`` as the file has them); one
    without a usable time or ``Bytes`` is left out."""
    ts, size = _number(ts), _number(size)
    if ts is not None and size is not None:
        batch.memory.append((ts, size, _number(allocated), _number(reserved), kind if type(kind) is int else None,
                             index if type(index) is int else None, str(as_orjson(pid)), str(as_orjson(tid))))


# ph values that are not duration events and that the analysis knowingly leaves out: metadata,
# instants, flows, counters, async and object events of the Chrome trace format.
OTHER_PHASES = frozenset({"M", "i", "I", "s", "t", "f", "C", "b", "e", "n", "O", "N", "D", "P", "R", "c", "(", ")"})
_SKIPPED_PHASES = OTHER_PHASES - {"M"}
INT_FIELDS = {"device": _DEVICE_MAX, "stream": _I64_MAX, "correlation": _I64_MAX, "bytes": _I64_MAX}


def _columns(ts, dur, names, cats, pids, tids, args: dict[str, list], entry: list, batch: Batch,
             typed: bool) -> Batch:
    batch.n = len(ts)
    c = batch.columns
    c["ts"], c["dur"] = numbers(ts, typed), numbers(dur, typed)
    c["name"], batch.uniques["name"], name_odd = text_codes(names, True, typed)
    c["cat"], batch.uniques["cat"], cat_odd = text_codes(cats, False, typed)
    batch.odd_names, batch.odd_cats = np.flatnonzero(name_odd), np.flatnonzero(cat_odd)
    c["pid"], batch.uniques["pid"], pid_device, _ = ids(pids, typed)
    c["tid"], batch.uniques["tid"], _, tid_stream = ids(tids, typed)
    # What each row is decides which args the table keeps (the rule of the table's columns):
    # device and stream of GPU events, correlation of those and runtime calls, bytes of copies.
    cat_uniques = np.asarray(batch.uniques["cat"], dtype=object)
    kind = kinds_of_categories(cat_uniques)[c["cat"]] if batch.n else np.zeros(0, np.int8)
    refine_device_kinds(kind, cat_uniques, c["cat"], np.asarray(batch.uniques["name"], dtype=object), c["name"])
    gpu = np.isin(kind, np.array([*GPU_KINDS, EventKind.GPU_ANNOTATION], dtype=np.int8))
    # a device wait (cuda_sync, MTIA's event_wait) keeps the correlation of the call that queued it
    rows_of = {"device": gpu, "stream": gpu, "correlation": gpu | (kind == EventKind.RUNTIME) | (kind == EventKind.SYNC),
               "bytes": kind == EventKind.MEMCPY}
    to_ints = typed_ints if typed else ints
    bad_values: dict = {}
    for f, upper in INT_FIELDS.items():
        values, _ = to_ints(args[f], upper, f, bad_values)
        c[f] = np.where(rows_of[f], values, col.NO_ID)
    batch.bad_values = {key: v for key, v in bad_values.items() if rows_of[key[0]][key[1]]}
    # 2021 traces (and events with args: null): the GPU index is the pid, the stream the tid.
    for f, fallback in (("device", pid_device), ("stream", tid_stream)):
        fix = gpu & (c[f] < 0)
        c[f][fix] = fallback[fix]
    corr = args["correlation"]
    batch.correlation_minus_one = np.array(
        [i for i in np.flatnonzero(rows_of["correlation"] & (c["correlation"] == col.NO_ID)) if corr[i] is not None],
        dtype=np.int64)
    for f in ("device", "stream", "correlation", "bytes"):
        c[f] = narrow(c[f])
    c["external_id"] = narrow(discriminator(args["external_id"]))
    dims = [""] * batch.n
    given = args["input_dims"]
    for i in np.flatnonzero(kind == EventKind.CPU_OP).tolist():  # operators' only
        dims[i] = _dims_text(given[i])
    c["shape"], batch.uniques["shape"], _ = text_codes(dims, False, True)
    c["sm_fill"], c["occupancy"] = _kernel_figures(args["blocks_per_sm"], args["occupancy"], kind == EventKind.KERNEL)
    c["entry"] = np.array(entry, dtype=np.int64)
    return batch


def _not_durations(events: list[_Event], batch: Batch) -> None:
    """Keep what ``batch`` keeps of typed events that are not duration events."""
    skip = _SKIPPED_PHASES
    for e in events:
        ph = e.ph
        if ph == "i" and e.name == MEMORY_EVENT:
            a = e.args or _NO_ARGS
            keep_memory_instant(batch, e.ts, e.pid, e.tid, a.mem_bytes, a.total_allocated, a.total_reserved,
                                a.device_type, a.device_id)
        elif ph not in skip:  # flows, other instants, counters: nothing to keep
            _other(ph, e.name, e.pid, e.tid, e.args.name if e.args is not None else "", batch)


def from_structs(events: list[_Event]) -> Batch:
    """The :class:`Batch` of typed events (see the module docstring)."""
    batch = Batch(0, {}, {}, entries=len(events))
    phs = [e.ph for e in events]
    is_x = np.array(phs, dtype=object) == "X" if events else np.zeros(0, bool)
    entry = np.flatnonzero(is_x)
    xs = events
    if len(entry) < len(events):
        xs = [events[i] for i in entry.tolist()]
        _not_durations([events[i] for i in np.flatnonzero(~is_x).tolist()], batch)
    return _columns(*_struct_columns(xs), _struct_fields([e.args or _NO_ARGS for e in xs]), entry, batch, True)


# One comprehension per field in these two: attribute access in a comprehension is a third faster
# than attrgetter over 100k rows, and they run for every batch of every trace.
def _struct_columns(xs: list[_Event]) -> tuple[list, ...]:
    """ts, dur, name, cat, pid and tid of typed duration events, one list each."""
    return ([e.ts for e in xs], [e.dur for e in xs], [e.name for e in xs], [e.cat for e in xs],
            [e.pid for e in xs], [e.tid for e in xs])


def _struct_fields(a: list) -> dict[str, list]:
    """The kept argument fields of typed duration events (their ``args``), one list each."""
    return {"device": [x.device for x in a], "stream": [x.stream for x in a],
            "correlation": [x.correlation for x in a], "bytes": [x.bytes for x in a],
            "external_id": [x.external_id for x in a], "input_dims": [x.input_dims for x in a],
            "blocks_per_sm": [x.blocks_per_sm for x in a], "occupancy": [x.occupancy for x in a]}


def from_dicts(events: list) -> Batch:
    """The :class:`Batch` of events as plain JSON values (dicts, or anything a file holds)."""
    batch = Batch(0, {}, {}, entries=len(events))
    xs, entry = [], []
    for i, e in enumerate(events):
        if type(e) is not dict:
            batch.not_objects += 1
        elif e.get("ph") == "X":
            xs.append(e)
            entry.append(i)
        elif e.get("ph") == "i" and e.get("name") == MEMORY_EVENT:
            a = col.args_of(e)
            keep_memory_instant(batch, e.get("ts"), e.get("pid"), e.get("tid"), a.get("Bytes"), a.get("Total Allocated"),
                                a.get("Total Reserved"), a.get("Device Type"), a.get("Device Id"))
        else:
            _other(e.get("ph"), e.get("name"), e.get("pid"), e.get("tid"), col.args_of(e).get("name", ""), batch)
    arg = [col.args_of(e) for e in xs]
    fields = {f: [a.get(f) for a in arg] for f in INT_FIELDS}
    fields["external_id"] = [a.get("External id") for a in arg]
    fields["input_dims"] = [a.get("Input Dims") for a in arg]
    fields["blocks_per_sm"] = [a.get("blocks per SM") for a in arg]
    fields["occupancy"] = [a.get("est. achieved occupancy %") for a in arg]
    return _columns([e.get("ts") for e in xs], [e.get("dur") for e in xs], [e.get("name", "") for e in xs],
                    [e.get("cat") for e in xs], [e.get("pid") for e in xs], [e.get("tid") for e in xs], fields,
                    entry, batch, False)


def _other(ph, name, pid, tid, thread_name, batch: Batch) -> None:
    """An entry that is not a duration event: thread names are kept, the rest counted."""
    if ph == "M":
        if name == "thread_name":
            batch.thread_names[(str(as_orjson(pid)), str(as_orjson(tid)))] = col.text(thread_name)
    elif ph in ("B", "E"):
        batch.begin_end += 1
    elif type(ph) is not str or ph not in OTHER_PHASES:  # a list as ph must not end the read
        key = col.text(ph)[:40]
        batch.unknown_phases[key] = batch.unknown_phases.get(key, 0) + 1


def decode_batch(text: bytes, root_is_list: bool) -> Batch:
    """Decode one batch: the bytes between two event boundaries of ``traceEvents`` (events and the
    commas between them, no brackets).

    Raises:
        Incomplete: the text does not end at an event boundary.
        Undecodable: text the strict decoders refuse (damage, non-UTF-8 bytes, nesting too deep).
    """
    prefix, suffix = (LIST_PREFIX, LIST_SUFFIX) if root_is_list else (ROOT_PREFIX, ROOT_SUFFIX)
    wrapped = prefix + text + suffix
    if not text.isascii():  # msgspec does not check the strings it skips; orjson does
        try:
            text.decode("utf-8")
        except UnicodeDecodeError:
            raise Undecodable("not UTF-8") from None
    try:
        events = unwrap((_TYPED_LIST if root_is_list else _TYPED_ROOT).decode(wrapped), root_is_list)
        return from_structs(events)
    except msgspec.ValidationError:
        pass  # values of other types: read them as plain JSON
    except msgspec.DecodeError as e:
        if _ends_early(str(e), len(wrapped) - len(suffix)):
            raise Incomplete() from None
        raise Undecodable(str(e)) from None
    except RecursionError:
        raise Undecodable("nested too deep") from None
    try:
        data = orjson.loads(wrapped)
    except orjson.JSONDecodeError as e:
        from perfscope.trace.decode import byte_pos

        if e.msg.startswith("unexpected end of data") or byte_pos(e) >= len(wrapped) - len(suffix):
            raise Incomplete() from None
        raise Undecodable(str(e)) from None
    return from_dicts(unwrap(data, root_is_list))


def _ends_early(message: str, suffix_at: int) -> bool:
    """A decode error at (or past) the end of the batch's own text: it was cut inside an event."""
    if "truncated" in message:
        return True
    at = message.rfind("(byte ")
    return at >= 0 and int(message[at + 6 : message.index(")", at)]) >= suffix_at
