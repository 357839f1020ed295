"""Helper of the scale benchmarks: synthetic traces built from a real one (peak memory of a
command: ``peakmem.py``).

Synthetic traces (:class:`Template`): the real trace's events are taken as text, exactly as the
file has them, and split into the events that repeat (every event of the steps) and those written
once (process and thread names, the profiler's span, global instant events). A copy ``k`` of the
repeating events is the same text with numbers changed:

* ``ts`` + ``k`` x the span of the events (first start to last end, rounded up, plus 1 us), so that
  copies follow each other without overlapping and every step keeps its length;
* ``ProfilerStep#N`` -> ``N + k`` x the number of steps of the trace;
* ``External id``, ``correlation``, flow ``id``, ``Sequence number``, ``Profiler Event Index``,
  ``Python id``, ``Python parent id`` + ``k`` x the range of those values, so they stay unique.

Files are written a copy at a time (about one copy of the trace in memory), as plain JSON or gzip.
"""

from __future__ import annotations

import gzip
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

MiB = 1 << 20
GiB = 1 << 30

_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BOUNDARY = re.compile(rb"\}\s*(?:,\s*(?=\{)|(?P<end>\]))")
_TS, _STEP, _ID = 0, 1, 2
_ID_KEYS = (b"id", b"External id", b"correlation", b"Sequence number", b"Profiler Event Index", b"Python id",
            b"Python parent id")
_NUMBERS = re.compile(rb'"(ts|' + b"|".join(re.escape(k) for k in _ID_KEYS) + rb')"\s*:\s*(\d+)|"ProfilerStep#(\d+)"')
_STEP_NAME = re.compile(r"ProfilerStep#(\d+)$")


def _once(e: dict) -> bool:
    """Events written once, not per copy: metadata, the profiler's own span, global instants."""
    return e.get("ph") == "M" or e.get("cat") == "Trace" or (e.get("ph") == "i" and e.get("s") == "g")


@dataclass
class Template:
    """A real trace's text, ready to be written as N copies of its steps (module docstring).

    Attributes:
        prefix: Text before the first event (the header and ``"traceEvents": [``).
        suffix: Text after the last event (the array's ``]``, any keys after it, the ``}``).
        sep: The text between two events.
        body_parts: The repeating events' text, cut around the numbers that change.
        body_values: Those numbers in copy 0.
        body_units: What each number gains per copy.
        once: The events written once, after the copies (their text).
        once_events: Those events, parsed (to adjust the profiler's span to all copies).
        steps: Steps per copy; step_span_us: the shift of ``ts`` per copy.
        events_per_copy: Repeating events; x_per_copy / x_once: complete ("X") events.
    """

    prefix: bytes
    suffix: bytes
    sep: bytes
    body_parts: list[bytes]
    body_values: np.ndarray
    body_units: np.ndarray
    once: list[bytes]
    once_events: list[dict]
    steps: int
    step_span_us: int
    events_per_copy: int
    x_per_copy: int
    x_once: int
    body_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.body_bytes = len(self.body(0))

    @classmethod
    def from_file(cls, path: Path) -> Template:
        data = Path(path).read_bytes()
        text = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
        doc = orjson.loads(text)
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        prefix, pieces, suffix, sep = _event_texts(text, doc, events)
        keep = [i for i, e in enumerate(events) if not _once(e)]
        once = [i for i, e in enumerate(events) if _once(e)]
        body = sep.join(pieces[i] for i in keep)
        parts, values, kinds, last = [], [], [], 0
        for m in _NUMBERS.finditer(body):
            g = 3 if m.group(3) is not None else 2
            parts.append(body[last:m.start(g)])
            values.append(int(m.group(g)))
            kinds.append(_STEP if g == 3 else (_TS if m.group(1) == b"ts" else _ID))
            last = m.end(g)
        parts.append(body[last:])
        values_a, kinds_a = np.array(values, dtype=np.int64), np.array(kinds, dtype=np.int8)
        rep = [events[i] for i in keep]
        starts = [e["ts"] for e in rep if isinstance(e.get("ts"), (int, float))]
        ends = [e["ts"] + (e.get("dur") if isinstance(e.get("dur"), (int, float)) else 0) for e in rep
                if isinstance(e.get("ts"), (int, float))]
        span = int(np.ceil(max(ends) - min(starts))) + 1
        step_numbers = {int(m.group(1)) for e in rep if isinstance(e.get("name"), str)
                        and (m := _STEP_NAME.match(e["name"]))}
        nsteps = max(step_numbers) - min(step_numbers) + 1 if step_numbers else 0
        ids = values_a[kinds_a == _ID]
        id_span = int(ids.max() - ids.min() + 1) if ids.size else 0
        units = np.select([kinds_a == _TS, kinds_a == _STEP], [span, nsteps], id_span).astype(np.int64)
        return cls(prefix, suffix, sep, parts, values_a, units, [pieces[i] for i in once], [events[i] for i in once],
                   nsteps, span, len(keep), sum(e.get("ph") == "X" for e in rep),
                   sum(events[i].get("ph") == "X" for i in once))

    def body(self, k: int) -> bytes:
        """The text of copy ``k`` of the repeating events (numbers unpadded)."""
        nums = (self.body_values + k * self.body_units).astype("S20").tolist()
        out = [b""] * (2 * len(nums) + 1)
        out[0::2] = self.body_parts
        out[1::2] = nums
        return b"".join(out)

    def layout(self, copies: int) -> _Layout:
        """A fast writer of the copies ``0 .. copies-1`` (see :class:`_Layout`)."""
        return _Layout(self, copies)

    def once_text(self, copies: int) -> bytes:
        """The events written once, the profiler's span and the window's end moved to cover all copies."""
        extra = (copies - 1) * self.step_span_us
        out = []
        for text, e in zip(self.once, self.once_events):
            if e.get("cat") == "Trace" and extra:
                text = re.sub(rb'("dur"\s*:\s*)(\d+)', lambda m: m.group(1) + str(int(m.group(2)) + extra).encode(), text,
                              count=1)
            elif e.get("name") == "Record Window End" and extra:
                text = re.sub(rb'("ts"\s*:\s*)(\d+)', lambda m: m.group(1) + str(int(m.group(2)) + extra).encode(), text,
                              count=1)
            out.append(text)
        return self.sep.join(out)

    def copies_for(self, size_bytes: int) -> int:
        """Copies of the steps whose text is about ``size_bytes`` in all (at least one)."""
        fixed = len(self.prefix) + len(self.suffix) + len(self.once_text(1)) + len(self.sep)
        return max(1, int(np.ceil((size_bytes - fixed) / (self.body_bytes + len(self.sep)))))

    def write(self, path: Path, copies: int, *, rank: int | None = None, world_size: int | None = None,
              compresslevel: int = 6) -> int:
        """Write ``copies`` copies of the steps to ``path`` (gzip when it ends with ``.gz``), with
        ``distributedInfo`` rank / world_size set when given. Returns the bytes of text written."""
        prefix, suffix = self.prefix, self.suffix
        if rank is not None or world_size is not None:
            prefix, suffix = _with_rank(prefix, suffix, rank, world_size)
        path = Path(path)
        f = gzip.open(path, "wb", compresslevel=compresslevel) if path.name.endswith(".gz") else open(path, "wb")
        n = 0
        with f:
            for chunk in _chunks(prefix, self, copies, suffix):
                f.write(chunk)
                n += len(chunk)
        return n


def _chunks(prefix: bytes, t: Template, copies: int, suffix: bytes):
    yield prefix
    lay = t.layout(copies)
    for k in range(copies):
        if k:
            yield t.sep
        yield from lay.pieces(k)
    if t.once:
        yield t.sep
        yield t.once_text(copies)
    yield suffix


_POW10 = 10 ** np.arange(19, dtype=np.int64)
_LUT4 = np.array([b"%04d" % i for i in range(10000)], dtype="S4").view(np.uint32)  # 4 ASCII digits each


def _digits20(v: np.ndarray) -> np.ndarray:
    """Non-negative int64 values as 20 ASCII digits each, zero-padded: (n, 20) uint8."""
    chunks = np.empty((len(v), 5), dtype=np.int64)
    x = v
    for j in range(4, -1, -1):
        x, chunks[:, j] = np.divmod(x, 10000)
    return _LUT4[chunks].view(np.uint8).reshape(len(v), 20)


class _Layout:
    """The repeating events as one byte buffer in which every JSON number has a fixed slot, as wide
    as its value in the last copy; a copy overwrites the slots (vectorised) and pads a shorter
    number with spaces before it (JSON allows them). ``ProfilerStep#N`` sits inside a string,
    where no padding is allowed: those few numbers are written between slices of the buffer.
    The buffer is reused: a copy's pieces must be written before the next copy is asked for."""

    def __init__(self, t: Template, copies: int) -> None:
        is_step = np.array([part.endswith(b"ProfilerStep#") for part in t.body_parts[:-1]], dtype=bool)
        last = t.body_values + (copies - 1) * t.body_units
        width = np.maximum(1, np.searchsorted(_POW10, last, side="right"))
        width[is_step] = 0
        pieces, pos, at = [], np.zeros(len(width), dtype=np.int64), 0
        for i, part in enumerate(t.body_parts[:-1]):
            pieces.append(part)
            at += len(part)
            pos[i] = at
            pieces.append(b" " * int(width[i]))
            at += int(width[i])
        pieces.append(t.body_parts[-1])
        self.buf = np.frombuffer(bytearray(b"".join(pieces)), dtype=np.uint8)
        self.values, self.units = t.body_values, t.body_units
        self.step_at = np.flatnonzero(is_step)
        self.step_pos = pos[self.step_at]
        self.groups = []
        for w in np.unique(width[~is_step]):
            idx = np.flatnonzero((width == w) & ~is_step)
            self.groups.append((int(w), idx, (pos[idx][:, None] + np.arange(w)).ravel()))

    def pieces(self, k: int):
        buf = self.buf
        for w, idx, slots in self.groups:
            v = self.values[idx] + k * self.units[idx]
            d = np.ascontiguousarray(_digits20(v)[:, 20 - w :])
            ndig = np.maximum(1, np.searchsorted(_POW10, v, side="right"))
            d[np.arange(w) < (w - ndig)[:, None]] = 32  # leading zeros -> spaces
            buf[slots] = d.ravel()
        mv, start = memoryview(buf), 0
        for i, at in zip(self.step_at, self.step_pos):
            yield mv[start:at]
            yield str(int(self.values[i] + k * self.units[i])).encode()
            start = at
        yield mv[start:]


def _event_texts(text: bytes, doc, events: list) -> tuple[bytes, list[bytes], bytes, bytes]:
    """The text before the events, each event's text, the text after them and the separator.
    The file's own text when its events can be cut at ``}`` ``,`` ``{`` boundaries (checked
    against the parsed events), else each event as compact JSON."""
    m = _EVENTS_KEY.search(text) if isinstance(doc, dict) else re.compile(rb"\s*\[").match(text)
    if m is not None and events:
        pos = m.end()
        first = text.index(b"{", pos)
        pieces, start, seps = [], first, []
        for b in _BOUNDARY.finditer(text, first):
            pieces.append(text[start : b.start() + 1])
            if b["end"] is not None:
                if len(pieces) == len(events):
                    break
                pieces = None
                break
            seps.append(text[b.start() + 1 : b.end()])
            start = b.end()
        if pieces and len(pieces) == len(events) and orjson.loads(b"[" + b",".join(pieces) + b"]") == events:
            return text[:first], pieces, text[b.start() + 1 :], seps[0] if seps else b","
    # fallback: compact JSON, the header keys first
    head = {k: v for k, v in doc.items() if k != "traceEvents"} if isinstance(doc, dict) else None
    if head is None:
        return b"[", [orjson.dumps(e) for e in events], b"]", b","
    h = orjson.dumps(head)
    prefix = (h[:-1] + b',"traceEvents":[') if head else b'{"traceEvents":['
    return prefix, [orjson.dumps(e) for e in events], b"]}", b","


def _with_rank(prefix: bytes, suffix: bytes, rank: int | None, world_size: int | None) -> tuple[bytes, bytes]:
    """The header texts with ``distributedInfo``'s rank and world_size set (added when absent)."""
    info = re.compile(rb'"distributedInfo"\s*:\s*\{\s*')
    if not info.search(prefix) and not info.search(suffix):
        prefix = re.sub(rb"^\s*\{", lambda m: m.group(0) + b'"distributedInfo": {}, ', prefix, count=1)
    texts = [prefix, suffix]
    for key, value in (("rank", rank), ("world_size", world_size)):
        if value is None:
            continue
        pat = re.compile(rb'("distributedInfo"\s*:\s*\{[^{}]*?"' + key.encode() + rb'"\s*:\s*)(-?\d+)')
        for i, text in enumerate(texts):
            if pat.search(text):
                texts[i] = pat.sub(lambda m: m.group(1) + str(value).encode(), text, count=1)
                break
        else:
            i = 0 if info.search(texts[0]) else 1
            m = info.search(texts[i])
            empty = texts[i][m.end() : m.end() + 1] == b"}"
            texts[i] = texts[i][: m.end()] + f'"{key}": {value}'.encode() + (b"" if empty else b", ") + texts[i][m.end():]
    return texts[0], texts[1]


# ---- peak memory of a command -------------------------------------------------------------------
