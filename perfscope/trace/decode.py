"""JSON text of a trace -> Python objects, telling truncation from damage inside the text.

The strict parse (orjson) is tried first. When it fails:

1. The known damages of real writers are repaired (:mod:`perfscope.trace.repair`) and the
   parse tried again; a warning names each kind of repair and how many strings or values it took.
2. Values nested deeper than the parser allows (valid JSON, but past orjson's 1024 levels) are
   replaced by ``null``: the event holding one is dropped and counted, a header field holding one
   is dropped and named.
3. A text that still ends early -- the parser ran out of input -- was truncated: its complete
   events are recovered and a warning says how many bytes were lost after them.
4. Anything else is damage that cannot be repaired: :class:`TraceDamagedError` names the file,
   the line and the column of the original text.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import orjson

from perfscope.errors import TraceFormatError
from perfscope.trace.quality import DROPPED, NOT_READ, REPAIRED, TRUNCATED, DataQuality, QualityEntry
from perfscope.trace.repair import WORDING, repair_json

# orjson refuses deeper input (its documented recursion limit); a value reaching this depth
# is cut out before that happens.
MAX_DEPTH = 1000
_END_OF_DATA = "unexpected end of data"
_DEPTH = "depth limit"
# Structure tokens for the nesting scan: strings (skipped whole) and brackets.
_STRUCT = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)
_COLON = re.compile(rb"\s*:")


class TraceDamagedError(TraceFormatError):
    """A file that is a trace holds damage that cannot be repaired (its data would be lost)."""


@dataclass
class Decoded:
    """What :func:`decode_json` read.

    Attributes:
        data: The parsed top-level value.
        quality: Entries for every repair kind, nesting cut and truncation
            (:class:`~perfscope.trace.quality.DataQuality`).
        deep_events: Events replaced by ``null`` because a value in them nested too deep (they
            are counted in ``quality`` already).
        truncated: True when the text ended early and only its complete events were kept.
    """

    data: object
    quality: DataQuality = field(default_factory=DataQuality)
    deep_events: int = 0
    truncated: bool = False


def _line_col(text: bytes, pos: int) -> tuple[int, int]:
    pos = max(0, min(pos, len(text)))
    line = text.count(b"\n", 0, pos) + 1
    return line, pos - (text.rfind(b"\n", 0, pos) + 1) + 1


def _first_bad_utf8(text: bytes) -> int | None:
    try:
        text.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start
    return None


def byte_pos(err: orjson.JSONDecodeError) -> int:
    """orjson reports positions in characters of the decoded text; the file has bytes."""
    doc = err.doc if isinstance(err.doc, str) else ""
    return len(doc[: err.pos].encode("utf-8", "surrogatepass")) if doc else err.pos


def _is_truncation(err: orjson.JSONDecodeError, text: bytes) -> bool:
    """The parser ran out of input: the text ends inside a value (of a text that starts as JSON)."""
    if text.lstrip()[:1] not in (b"{", b"["):
        return False
    if err.msg.startswith(_END_OF_DATA):
        return True
    # A cut inside a literal (``tr`` of ``true``) fails on its first character near the end.
    tail = text.rstrip()
    return byte_pos(err) >= len(tail) - 8 and not tail.endswith((b"}", b"]"))


class _DeepScan:
    """The state of :func:`_cut_deep`'s one pass over the text's strings and brackets: the depth,
    where the events array is, and the unit (an event, or a header value) being read."""

    def __init__(self, text: bytes) -> None:
        self.text = text
        self.depth = 0
        self.root_is_list: bool | None = None
        self.events_depth: int | None = None  # depth inside the traceEvents array, while in it
        self.key: bytes | None = None  # the current top-level key
        self.unit_start, self.unit_deep, self.unit_is_event = -1, False, False
        self.cuts: list[tuple[int, int, bool, bytes | None]] = []

    def string(self, m) -> None:
        """A string: at depth 1 of an object it may be a key."""
        if self.depth == 1 and not self.root_is_list and _COLON.match(self.text, m.end()):
            self.key = m.group(0)

    def _start_unit(self, at: int, is_event: bool) -> None:
        self.unit_start, self.unit_deep, self.unit_is_event = at, False, is_event

    def open(self, m, bracket: int) -> None:
        """``[`` or ``{``: one level deeper; a unit starts at the events' elements and the header's values."""
        self.depth += 1
        if self.depth == 1:
            self.root_is_list = bracket == 0x5B
            if self.root_is_list:
                self.events_depth = 1
            return
        if self.depth == 2 and not self.root_is_list:
            if self._opens_events(bracket):
                self.events_depth = 2
                return
            self._start_unit(m.start(), False)
        elif self.events_depth is not None and self.depth == self.events_depth + 1:
            self._start_unit(m.start(), True)
        self.unit_deep = self.unit_deep or self.depth > MAX_DEPTH

    def _opens_events(self, bracket: int) -> bool:
        """The ``[`` of the top-level ``traceEvents`` array (the first one only)."""
        return self.key == b'"traceEvents"' and bracket == 0x5B and self.events_depth is None

    def close(self, m) -> None:
        """``]`` or ``}``: a unit that went too deep ends here and is cut."""
        if self.unit_start >= 0 and self.depth == (self.events_depth + 1 if self.unit_is_event else 2):
            if self.unit_deep:
                self.cuts.append((self.unit_start, m.end(), self.unit_is_event, None if self.unit_is_event else self.key))
            self.unit_start = -1
        elif self.events_depth is not None and self.depth == self.events_depth:
            self.events_depth = -10  # the array closed; no later array is the events
        self.depth -= 1


def _cut_deep(text: bytes) -> tuple[bytes, int, list[str], list[tuple[int, int]]]:
    """Replace every event (or header value) nesting deeper than :data:`MAX_DEPTH` with ``null``.

    Returns the new text, the number of events cut, the names of header fields cut, and the cut
    spans of the input (start, end).
    """
    scan = _DeepScan(text)
    for m in _STRUCT.finditer(text):
        c = text[m.start()]
        if c == 0x22:
            scan.string(m)
        elif c in (0x5B, 0x7B):  # [ {
            scan.open(m, c)
        else:
            scan.close(m)
    cuts = scan.cuts
    n_events = sum(1 for c in cuts if c[2])
    header = [c[3].decode("utf-8", "replace").strip('"') for c in cuts if not c[2] and c[3]]
    spans = [(a, b) for a, b, _, _ in cuts]
    return _nulled(text, spans), n_events, header, spans


def _nulled(text: bytes, spans: list[tuple[int, int]]) -> bytes:
    """``text`` with each of the sorted, disjoint ``spans`` replaced by ``null``."""
    pieces, last = [], 0
    for a, b in spans:
        pieces += [text[last:a], b"null"]
        last = b
    pieces.append(text[last:])
    return b"".join(pieces)


def _map_back(pos: int, cuts: list[tuple[int, int]]) -> int:
    """Position before :func:`_cut_deep` of ``pos`` after it (each cut became 4 bytes)."""
    shift = 0  # bytes removed by the cuts before the one looked at
    for a, b in cuts:
        if pos + shift <= a:
            break
        if pos + shift < a + 4:
            return a
        shift += (b - a) - 4
    return pos + shift


def _last_element_end(text: bytes, body_start: int) -> int:
    """End offset of the last complete element of the array whose body starts at ``body_start``
    (-1 when none is complete): a scan of strings and brackets, for cuts the quick tries miss."""
    depth, last = 0, -1
    for m in _STRUCT.finditer(text, body_start):
        c = text[m.start()]
        if c == 0x22:
            continue
        if c in (0x5B, 0x7B):
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                last = m.end()
            elif depth < 0:  # the array itself closed
                break
    return last


def _recover_truncated(name: str, text: bytes) -> tuple[dict, int, int]:
    """Parse the complete events of a JSON trace that ends early: (header and events, events
    kept, bytes lost after them).

    Raises:
        TraceDamagedError: a trace with no complete event to recover.
        TraceFormatError: no traceEvents in the text (not a trace).
    """
    start = text.find(b'"traceEvents"')
    if start < 0:
        raise TraceFormatError(f"{name}: truncated JSON with no traceEvents: not a trace, or cut before its events")
    head = text[:start]
    bracket = text.find(b"[", start)
    if bracket < 0:
        raise TraceDamagedError(f"{name}: truncated before its first event")
    body_start = bracket + 1
    events, cut = None, -1
    # Quick tries: cut after the last few object ends (Kineto writes one event per line) ...
    end = len(text)
    for _ in range(64):
        cut = text.rfind(b"}", body_start, end)
        if cut < 0:
            break
        try:
            events = orjson.loads(b"[" + text[body_start : cut + 1] + b"]")
            break
        except orjson.JSONDecodeError:
            end = cut
    if events is None:
        # ... else a scan for where the last complete event ends (one cut inside a long event).
        cut = _last_element_end(text, body_start) - 1
        if cut >= body_start:
            try:
                events = orjson.loads(b"[" + text[body_start : cut + 1] + b"]")
            except orjson.JSONDecodeError:
                events = None
    if events is None:
        raise TraceDamagedError(f"{name}: truncated, and no complete event before the cut could be recovered")
    try:
        # The header before traceEvents ends with a comma; close it as an object.
        meta = orjson.loads(head.rstrip().rstrip(b",") + b"}")
    except orjson.JSONDecodeError:
        meta = {}
    if not isinstance(meta, dict):
        meta = {}
    meta["traceEvents"] = events
    return meta, len(events), len(text) - (cut + 1)


def _damage(path_text: str, original: bytes, pos: int, msg: str) -> TraceFormatError:
    line, col = _line_col(original, pos)
    if b'"traceEvents"' not in original:
        return TraceFormatError(f"{path_text}:{line}:{col}: not a JSON trace ({msg})")
    return TraceDamagedError(f"{path_text}:{line}:{col}: invalid JSON that cannot be repaired ({msg})")


def decode_json(path_text: str, name: str, text: bytes) -> Decoded:
    """Parse a trace's JSON text, repairing what can be repaired (see the module docstring).

    Args:
        path_text: The file as the user named it (for the error line).
        name: The file name (for warnings).
        text: The decompressed text.

    Returns:
        The :class:`Decoded` value with its warnings.

    Raises:
        TraceDamagedError: damage inside the text that no rule repairs (file, line and column).
        TraceFormatError: truncated with nothing recoverable.
    """
    try:
        return Decoded(orjson.loads(text))
    except orjson.JSONDecodeError:
        pass
    stripped = text.rstrip(b"\x00")
    out = Decoded(None)
    q = out.quality
    # A writer that died after the file was extended leaves zero bytes at its end.
    q.add(NOT_READ, "zero bytes at the end of the file (the writer stopped)", len(text) - len(stripped), unit="byte")
    repaired = repair_json(stripped)
    for kind, n in repaired.counts.items():
        reason, unit = WORDING[kind]
        q.add(REPAIRED, reason, n, Counter(repaired.examples.get(kind, [])) or None, unit=unit)
    work = repaired.text
    cuts: list[tuple[int, int]] = []
    for attempt in range(2):
        try:
            out.data = orjson.loads(work)
            return out
        except orjson.JSONDecodeError as e:
            err = e
        if attempt == 0 and err.msg.startswith(_DEPTH):
            work, out.deep_events, header, cuts = _cut_deep(work)
            deeper = f"a value nested deeper than {MAX_DEPTH} levels (more than the JSON decoder reads)"
            q.add(DROPPED, deeper, out.deep_events)
            q.add(DROPPED, deeper, len(header), header, unit="header field")
            if cuts:
                continue
        break
    if _is_truncation(err, work):
        out.data, kept, lost = _recover_truncated(name, work)
        q.entries.append(QualityEntry(TRUNCATED, f"it ends early; read its {kept:,} complete events, "
                                      f"lost the {lost:,} bytes after them and whatever followed", 1, "file"))
        out.truncated = True
        return out
    bad = _first_bad_utf8(work)
    pos = bad if bad is not None and "UTF-8" in err.msg else byte_pos(err)
    original_pos = repaired.original_pos(_map_back(pos, cuts)) if (repaired.any or cuts) else pos
    raise _damage(path_text, text, original_pos, err.msg)
