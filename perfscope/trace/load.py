"""One trace file -> its :class:`~perfscope.trace.table.TraceTable`, streamed in bounded memory.

The file is cut into batches (:mod:`perfscope.trace.stream`), each decoded into row columns
(:mod:`perfscope.trace.events`), serially or by a pool of processes, and the rows are assembled
into the table (:mod:`perfscope.trace.assemble`). The whole JSON tree never exists: memory grows
with the rows kept. A file the stream cannot take as it is (damage, truncation, a cut gzip
stream...) is read whole by the repairing reader instead, with the same rules and warnings as
ever (:func:`perfscope.trace.reader.read_trace`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path

import numpy as np
import orjson

from perfscope.trace import columns as col
from perfscope.trace.events import LIST_PREFIX, LIST_SUFFIX, ROOT_PREFIX, ROOT_SUFFIX, Incomplete, Undecodable, decode_batch, unwrap
from perfscope.trace.reader import RawTrace, gc_paused, read_trace, worker_name
from perfscope.trace.rows import Rows
from perfscope.trace.stream import BATCH_BYTES, END, Cutter, NotStreamable, chunks
from perfscope.trace.assemble import build_table
from perfscope.trace.table import TraceTable

Progress = Callable[[int], None]  # called with the file's bytes read so far


def read_table(path: Path, *, pool: Executor | None = None, batch_bytes: int = BATCH_BYTES,
               progress: Progress | None = None, decoded: Callable[[], None] | None = None) -> TraceTable:
    """Read one Kineto trace file into its table.

    Args:
        path: A ``.json`` or ``.json.gz`` trace.
        pool: Decode the batches in this pool of processes (a single large file on every core);
            None decodes them here. Both give the same table.
        batch_bytes: Text bytes per batch (tests use small ones to cut often).
        progress: Called now and then with the number of the file's bytes (on disk) read.
        decoded: Called once the pool has decoded its last batch, before the rows are assembled
            (the caller may shut the pool down then: the workers' memory would otherwise add to
            the assembly's and the analysis's, the peak of a large file). Not called where the
            file is not streamed.

    Returns:
        The table, which may hold no events (the caller decides whether that is an error).

    Raises:
        TraceDamagedError, TraceFormatError, FileNotFoundError: as
            :func:`perfscope.trace.reader.read_trace`.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        with gc_paused():
            return _streamed(path, pool, batch_bytes, progress, decoded)
    except NotStreamable:
        pass
    raw = read_trace(path)
    with gc_paused():
        return build_table(raw)


def _streamed(path: Path, pool: Executor | None, batch_bytes: int, progress: Progress | None,
              decoded: Callable[[], None] | None = None) -> TraceTable:
    cutter = Cutter(chunks(path, progress=progress), batch_bytes)
    cutter.start()
    rows, spans = Rows(), []
    decode = _serial if pool is None else _pooled
    for text, start, batch in decode(cutter, pool):
        rows.add(batch)
        spans.append((start, start + len(text)))
    if decoded is not None:
        decoded()
    raw = RawTrace(path=path, data=cutter.header, worker=worker_name(path))
    root_is_list = cutter.root_is_list
    from perfscope.trace.assemble import assemble

    return assemble(rows.finish(), raw, lambda entries: _fingerprints(path, spans, rows.batch_starts, entries, root_is_list))


def _joined(cutter: Cutter, text: bytes, sep: bytes, may_end: bool, offset: int, decoder) -> tuple:
    """Decode a span, joining it with the next spans while it was cut inside an event; each
    retry at least doubles the text, so a pathological file costs a few decodes, not one per
    candidate boundary."""
    while True:
        try:
            batch = decoder(text)
        except Incomplete:
            need = 2 * len(text)
            while True:  # up to twice the text, or to a place where the array may close
                nxt = cutter.span()
                if nxt is None:  # the array closed inside an event: not a trace the stream can read
                    raise NotStreamable("an event does not end")
                text, sep, may_end = text + sep + nxt[0], nxt[1], nxt[2]
                if may_end or len(text) >= need:
                    break
            continue
        except Undecodable:
            return _ended_inside(cutter, text, offset, decoder)
        if may_end:
            cutter.close()
        return text, offset, batch, sep


_RECUTS = 8  # places tried where the array may have closed inside a span that did not decode


def _ended_inside(cutter: Cutter, text: bytes, offset: int, decoder) -> tuple:
    """A span that does not decode may have run past the array's end into the header after it
    (a list of objects there looks like events): the array then closed at one of the span's last
    ``}]``. Those are tried from the end; when none decodes, the file is damaged.

    Raises:
        NotStreamable: no place in the span ends the events.
    """
    for m in list(END.finditer(text))[::-1][:_RECUTS]:
        head = text[: m.start() + 1]
        try:
            batch = decoder(head)
        except (Incomplete, Undecodable):
            continue
        cutter.end_at(offset + m.end())  # the array closed there: the rest is the header
        return head, offset, batch, b""
    raise NotStreamable("a batch the strict decoders refuse")


def _serial(cutter: Cutter, pool=None):
    offset = cutter.offset
    while (got := cutter.span()) is not None:
        text, sep, may_end = got
        text, start, batch, sep = _joined(cutter, text, sep, may_end, offset,
                                          lambda t: decode_batch(t, cutter.root_is_list))
        offset = start + len(text) + len(sep)
        yield text, start, batch


def _decode_remote(text: bytes, root_is_list: bool):
    """Worker side of a pool: a batch, or the exception class that says why not."""
    try:
        return decode_batch(text, root_is_list)
    except (Incomplete, Undecodable) as e:
        return type(e)


def _pooled(cutter: Cutter, pool: Executor):
    """Batches decoded by ``pool``, a few in flight per worker, consumed in file order. A span
    that may end the array, or one that comes back incomplete, is settled here before more
    are cut (both are rare: the first happens once per file)."""
    depth = 2 * max(getattr(pool, "_max_workers", 2), 1)
    flight: deque = deque()
    offset = cutter.offset
    local = lambda t: decode_batch(t, cutter.root_is_list)  # noqa: E731
    done = False
    while flight or not done:
        while not done and len(flight) < depth:
            got = cutter.span()
            if got is None:
                done = True
                break
            text, sep, may_end = got
            if may_end:  # settle everything before it, then it, here
                flight.append((text, sep, True, None))
                done = True
                break
            flight.append((text, sep, False, pool.submit(_decode_remote, text, cutter.root_is_list)))
        if not flight:
            break
        text, sep, may_end, fut = flight.popleft()
        result = fut.result() if fut is not None else None
        if fut is None or result is Incomplete or result is Undecodable:
            # settle it here: what is in flight after it started inside its event, so it is joined
            for t2, s2, e2, f2 in flight:
                if f2 is not None:
                    f2.cancel()
                text, sep, may_end = text + sep + t2, s2, e2
            flight.clear()
            done = False
            text, start, batch, sep = _joined(cutter, text, sep, may_end, offset, local)
            if cutter.ended:
                done = True
        else:
            start, batch = offset, result
        offset = start + len(text) + len(sep)
        yield text, start, batch


def _fingerprints(path: Path, spans: list[tuple[int, int]], batch_starts: list[int], entries: np.ndarray,
                  root_is_list: bool) -> list[str]:
    """Fingerprints of the events at ``entries`` (ascending), read again from the file: only the
    batches holding them are decoded (rows that look like exact copies are rare)."""
    prefix, suffix = (LIST_PREFIX, LIST_SUFFIX) if root_is_list else (ROOT_PREFIX, ROOT_SUFFIX)
    which = np.searchsorted(np.asarray(batch_starts), entries, side="right") - 1
    wanted = {int(b) for b in np.unique(which)}
    events: dict[int, list] = {}
    text_at, pending = 0, bytearray()
    k = 0
    for piece in chunks(path):
        pending += piece
        while k < len(spans) and spans[k][1] <= text_at + len(pending):
            a, b = spans[k]
            if k in wanted:
                try:
                    events[k] = unwrap(orjson.loads(prefix + bytes(pending[a - text_at : b - text_at]) + suffix),
                                       root_is_list)
                except orjson.JSONDecodeError:  # a value msgspec skipped that the repairing read counts
                    raise NotStreamable("a number past a float's range beside a copied event") from None
            k += 1
        if k >= len(spans) or len(events) == len(wanted):
            break
        cut = spans[k][0] - text_at
        if cut > 0:
            del pending[:cut]
            text_at += cut
    return [col.fingerprint(events[int(b)][int(e) - batch_starts[int(b)]]) for b, e in zip(which, entries)]
