"""Reading Kineto trace files (``.json`` / ``.json.gz``) into plain JSON, and finding them on disk.

A trace whose writer died mid-file is common on clusters (a killed rank, a full disk); some
profiler versions write text that is not strict JSON. :mod:`perfscope.trace.decode` tells the two
apart, repairs what it knows and recovers the complete events of a truncated file, with a warning
for each; anything else is a clear error naming the line and column.
"""

from __future__ import annotations

import gc
import re
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from perfscope.errors import TraceFormatError
from perfscope.trace.decode import decode_json
from perfscope.trace.quality import NOT_READ, TRUNCATED, DataQuality, QualityEntry
from perfscope.trace.stream import MAX_GZIP_MEMBERS, TooManyMembers, TraceTooLarge, inflation_limit

TRACE_SUFFIXES = (".json", ".json.gz")
# perfscope's own outputs, found when a whole output directory is analyzed again.
NOT_TRACES = frozenset({"summary.json", "merged.perfscope-view.json.gz"})  # the second: perfscope merge's view

# TensorBoard's profiler plugin names files <worker>[.<span>].pt.trace.json[.gz].
_WORKER_RE = re.compile(r"^(?P<worker>.+?)(?:\.(?P<span>\d+))?\.pt\.trace\.json(?:\.gz)?$")


@dataclass
class RawTrace:
    """One trace file as parsed JSON.

    Attributes:
        path: Where it was read from.
        data: The top-level JSON object (``traceEvents`` plus metadata such as
            ``deviceProperties``, ``distributedInfo``, ``baseTimeNanoseconds``).
        worker: Worker name from the file name (TensorBoard layout) or the file stem.
        quality: What the read repaired, cut or lost (JSON repairs, truncation), carried on
            into the table's data-quality record.
        deep_events: ``traceEvents`` entries replaced by ``null`` because a value in them nested
            past the decoder's depth (already in ``quality``).
        truncated: The file ended early; its last step is therefore incomplete.
    """

    path: Path
    data: dict
    worker: str
    quality: DataQuality = field(default_factory=DataQuality)
    deep_events: int = 0
    truncated: bool = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector.

    Parsing a trace allocates ~10^5 dicts that are all alive until the table is built; the
    collector would scan them again and again for nothing (about 40% of the parse time on the
    35 MB A100 trace). Nothing created here forms reference cycles.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def worker_name(path: Path) -> str:
    """Worker name of a trace file: ``rank0`` for ``rank0.pt.trace.json.gz``.

    Files of the TensorBoard layout ``<worker>.<span>.pt.trace.json`` keep only ``<worker>``, so
    two profiling windows of one process share a name.
    """
    m = _WORKER_RE.match(path.name)
    if m:
        return m.group("worker")
    name = path.name
    for suffix in (".json.gz", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def find_trace_files(path: Path) -> list[Path]:
    """The trace files at ``path``: the file itself, or every ``*.json[.gz]`` below a directory.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        TraceFormatError: a directory holds no trace files, or a file has another suffix.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    if path.is_file():
        if not path.name.endswith(TRACE_SUFFIXES):
            raise TraceFormatError(f"{path}: not a trace file (expected .json or .json.gz)")
        return [path]
    files = sorted(
        p
        for p in path.rglob("*")
        if p.is_file()
        and p.name.endswith(TRACE_SUFFIXES)
        and not p.name.startswith(".")
        and p.name not in NOT_TRACES
    )
    if not files:
        raise TraceFormatError(f"{path}: directory holds no trace files (*.json, *.json.gz)")
    return files


_GZIP_CHUNK = 1 << 14  # what a corrupt chunk loses


def _read_bytes(path: Path) -> tuple[bytes, QualityEntry | None]:
    """The file's text (gunzipped when compressed), and what was wrong with a damaged gzip
    stream (None when it was whole)."""
    raw = path.read_bytes()
    if not raw.startswith(b"\x1f\x8b"):
        return raw, None
    limit = inflation_limit(len(raw))
    d = zlib.decompressobj(zlib.MAX_WBITS | 16)
    try:  # one whole member, nothing after it: the common case, in one call
        text = d.decompress(raw, limit + 1)
        if len(text) > limit:
            raise TraceTooLarge(path, len(raw))
        if d.eof and not d.unused_data:
            return text, None
    except zlib.error:
        pass
    del d
    # Several members, a cut or corrupt stream, or bytes after it: keep what decompresses, say
    # what did not.
    out: list[bytes] = []
    view, pos, total, members = memoryview(raw), 0, 0, 0
    while raw.startswith(b"\x1f\x8b", pos):  # one gzip member after the other, read in place
        members += 1
        if members > MAX_GZIP_MEMBERS:
            raise TooManyMembers(path)
        d = zlib.decompressobj(zlib.MAX_WBITS | 16)
        at = pos
        while at < len(raw):
            chunk = view[at : at + _GZIP_CHUNK]
            try:
                out.append(d.decompress(chunk, limit + 1 - total))
            except zlib.error as e:
                if not any(out):
                    raise TraceFormatError(f"{path}: corrupt gzip data ({e})") from None
                return b"".join(out), QualityEntry(
                    TRUNCATED, f"its gzip data is corrupt near compressed byte {at:,}; read what decompresses before it",
                    1, "file")
            total += len(out[-1])
            if total > limit:
                raise TraceTooLarge(path, len(raw))
            at += len(chunk)
            if d.eof:
                break
        if not d.eof:
            return b"".join(out), QualityEntry(TRUNCATED, "its gzip stream is cut short; read what decompresses", 1, "file")
        pos = at - len(d.unused_data)  # the next member starts where this one's data ended
    rest = raw[pos:]
    if rest.strip(b"\x00"):
        return b"".join(out), QualityEntry(NOT_READ, "after the gzip stream, not gzip data", len(rest), "byte")
    return b"".join(out), None


def read_trace(path: Path) -> RawTrace:
    """Read one Kineto trace file.

    Args:
        path: A ``.json`` or ``.json.gz`` file written by the PyTorch profiler (any version since
            2021) or by Kineto directly.

    Returns:
        The parsed trace with any warnings (repairs, truncation).

    Raises:
        TraceDamagedError: a trace whose text holds damage no rule repairs (file:line:column).
        TraceFormatError: not JSON / gzip, not a trace object, truncated beyond recovery.
        FileNotFoundError: ``path`` does not exist.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    text, gzip_damage = _read_bytes(path)
    if not text.strip(b" \t\r\n\x00"):
        raise TraceFormatError(f"{path}: file is empty")
    with gc_paused():
        decoded = decode_json(str(path), path.name, text)
    del text
    data = decoded.data
    if isinstance(data, list):  # bare Chrome-trace array form
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents", []), list):
        raise TraceFormatError(f"{path}: not a Kineto trace (no traceEvents list)")
    data.setdefault("traceEvents", [])
    if gzip_damage is not None:
        cut = [e for e in decoded.quality.entries if e.action == TRUNCATED]
        if cut and gzip_damage.action == TRUNCATED:  # one cut, seen twice: say it once, with both causes
            cut[0].reason = cut[0].reason.replace("it ends early", gzip_damage.reason.split(";")[0], 1)
        else:
            decoded.quality.entries.insert(0, gzip_damage)
    return RawTrace(path=path, data=data, worker=worker_name(path), quality=decoded.quality,
                    deep_events=decoded.deep_events, truncated=decoded.truncated)
