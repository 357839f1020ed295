"""A trace file's text, streamed and cut into batches of whole events, in bounded memory.

The file is read (and gunzipped) a chunk at a time. Its ``traceEvents`` array is cut at event
boundaries -- a ``}`` then a comma before the next ``{``, or the array's closing ``]`` -- about
every :data:`BATCH_BYTES`; the text before and after the array (the header: ``deviceProperties``,
``distributedInfo``, ``baseTimeNanoseconds``...) is kept and parsed on its own. A cut can land
inside an event (inside a string, or between the objects of a nested list): decoding such a batch
says it is incomplete, and the caller joins it with the next ones (:meth:`Cutter.span`), so the cut
rule needs no tokenizer.

Anything unusual -- a damaged or cut gzip stream, bytes after it, a text that does not start as
a trace, an array that never closes, a header that is not strict JSON -- raises
:class:`NotStreamable`, and the file is read whole by the repairing reader
(:mod:`perfscope.trace.reader`), whose rules and warnings then apply unchanged.
"""

from __future__ import annotations

import os
import queue
import re
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import orjson

from perfscope.errors import TraceFormatError

BATCH_BYTES = 4 << 20  # a batch's text: big enough that the per-batch cost is noise, small next to the columns
CHUNK_BYTES = 1 << 20  # read from the file at a time
MAX_HEADER_BYTES = 64 << 20  # header before traceEvents or after it: past this, read whole
_GZIP_MAGIC = b"\x1f\x8b"
# JSON's whitespace is these four (Python's \s would also take \x0b and \x0c, which JSON refuses)
_WS = rb"[ \t\r\n]*"
_EVENTS_KEY = re.compile(rb'"traceEvents"' + _WS + rb":" + _WS + rb"\[")
# An event boundary: a } then a comma and the next event's {, or the array's ] (group "end").
_BOUNDARY = re.compile(rb"\}" + _WS + rb"(?:," + _WS + rb"(?=\{)|(?P<end>\]))")
END = re.compile(rb"\}" + _WS + rb"(?P<end>\])")
_SPACE = b" \t\r\n"
_MARKER = b'"\\u0000perfscope: the events streamed"'
_NOT_SPACE = re.compile(rb"[^ \t\r\n]")


# Text bytes per gzip byte past which a file is refused: the real traces in ../shared/traces
# inflate 9-28x, gzip itself at most about 1032x (a run of one byte); a file is judged only past
# MIN_JUDGED_BYTES of text, so a small file of any ratio is read (a 240 KB gzip of 80 MB of tiny
# nested events took 2.7 GB to read: the bound keeps such a file's text, and memory, small).
MAX_INFLATION = 200
MIN_JUDGED_BYTES = 64 << 20  # a small file's text may take about 30 times its size in memory


# gzip members in one file: a trace writer makes one, appending tools a few. Each member's end
# copies what follows it in the read (zlib's unused_data), so thousands of empty members cost
# quadratic time: past this many the file is refused.
MAX_GZIP_MEMBERS = 1000


class TooManyMembers(TraceFormatError):
    """A gzip file of more than :data:`MAX_GZIP_MEMBERS` members."""

    def __init__(self, path) -> None:
        super().__init__(f"{path}: more than {MAX_GZIP_MEMBERS:,} gzip members, which no trace writer makes; not read")


def inflation_limit(file_bytes: int) -> int:
    """The most text bytes a gzip file of ``file_bytes`` may hold (:data:`MAX_INFLATION`)."""
    return max(MIN_JUDGED_BYTES, MAX_INFLATION * file_bytes)


class TraceTooLarge(TraceFormatError):
    """A gzip file that inflates past :func:`inflation_limit`: no trace compresses that well."""

    def __init__(self, path, file_bytes: int) -> None:
        super().__init__(f"{path}: too large: its {file_bytes:,} bytes of gzip inflate past "
                         f"{inflation_limit(file_bytes) >> 20:,} MiB of text ({MAX_INFLATION}x), which no trace does; "
                         "not read")


class NotStreamable(Exception):
    """The file needs the whole-file read (see the module docstring)."""


def chunks(path: Path, size: int = CHUNK_BYTES, progress=None) -> Iterator[bytes]:
    """The file's text a piece at a time (at most ``PIECE_BYTES`` each), gunzipped when it is
    gzip (several members allowed, zero bytes after the last one ignored, as the whole-file read
    does).

    The file is read and gunzipped ahead (two pieces queued, a third in the making), in a thread of its own: zlib
    works without the interpreter lock, so on a second core it overlaps the decoding of the
    pieces before. ``progress``, when given, is called (in the caller's thread) with the bytes of
    the file read so far.

    Raises:
        NotStreamable: a cut or corrupt gzip stream, or other bytes after it.
    """
    ahead = _Ahead(_pieces(path, size))
    try:
        for piece, at in ahead:
            if progress is not None:
                progress(at)
            if piece:
                yield piece
    finally:
        ahead.stop()


PIECE_BYTES = 4 << 20  # gunzipped text at most per piece: a highly compressed input never balloons
_AHEAD = 2  # pieces queued for the caller (the producer makes one more meanwhile)


class _Ahead:
    """Items of an iterator produced by a thread, at most :data:`_AHEAD` queued for the consumer;
    the producer's exception is raised in the consumer where its item would have come."""

    _END = object()

    def __init__(self, items: Iterator) -> None:
        self._items = items
        self._queue: queue.Queue = queue.Queue(_AHEAD)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._produce, name="perfscope-read-ahead", daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stopped.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        try:
            for item in self._items:
                if not self._put((item, None)):
                    return
        except BaseException as e:  # raised again in the consumer
            self._put((self._END, e))
            return
        finally:
            self._items.close()
        self._put((self._END, None))

    def __iter__(self) -> Iterator:
        while True:
            item, error = self._queue.get()
            if item is self._END:
                if error is not None:
                    raise error
                return
            yield item

    def stop(self) -> None:
        """Stop the producer (the consumer is done, or gave up part way) and wait for it."""
        self._stopped.set()
        self._thread.join()


def _pieces(path: Path, size: int) -> Iterator[tuple[bytes, int]]:
    """``(text, file bytes read so far)`` pieces of :func:`chunks`, in the calling thread; the last
    item is ``(b"", the file's size)``, so that progress ends at the file's end however much of
    it (padding, an empty member) gave no text."""
    with open(path, "rb") as f:
        data = f.read(size)
        while 0 < len(data) < 2 and (more := f.read(size)):  # the magic needs two bytes
            data += more
        if not data.startswith(_GZIP_MAGIC):
            while data:
                yield data, f.tell()
                data = f.read(size)
            yield b"", f.tell()
            return
        d = zlib.decompressobj(zlib.MAX_WBITS | 16)
        limit, text, members = inflation_limit(os.fstat(f.fileno()).st_size), 0, 1
        while True:
            while data:
                try:
                    out = d.decompress(data, PIECE_BYTES)
                except zlib.error:
                    raise NotStreamable("corrupt gzip data") from None
                text += len(out)
                if text > limit:
                    raise TraceTooLarge(path, os.fstat(f.fileno()).st_size)
                if out:
                    yield out, f.tell()
                if d.eof:  # what follows the member is in unused_data (unconsumed_tail may be stale)
                    break
                data = d.unconsumed_tail
            if d.eof:
                rest = d.unused_data
                while len(rest) < 2 and (more := f.read(size)):
                    rest += more
                if rest.startswith(_GZIP_MAGIC):  # the next member
                    members += 1
                    if members > MAX_GZIP_MEMBERS:
                        raise TooManyMembers(path)
                    d, data = zlib.decompressobj(zlib.MAX_WBITS | 16), rest
                    continue
                while True:
                    if rest.strip(b"\x00"):
                        raise NotStreamable("bytes after the gzip stream")
                    rest = f.read(size)
                    if not rest:
                        yield b"", f.tell()
                        return
            data = f.read(size)
            if not data:
                raise NotStreamable("gzip stream cut short")


class Cutter:
    """Cuts the ``traceEvents`` array of a text stream into spans of whole events.

    Use: :meth:`start`, then :meth:`span` until it returns None, :meth:`close` when a span that
    may end the array decoded whole; :attr:`header` is then the file's top-level object without
    its events. Offsets are bytes of the (gunzipped) text.

    Attributes:
        root_is_list: The file is a bare array of events (the Chrome trace array form).
        bytes_read: Text bytes read so far (for progress).
    """

    def __init__(self, pieces: Iterator[bytes], batch_bytes: int = BATCH_BYTES) -> None:
        self._pieces = pieces
        self._batch = batch_bytes
        self._buf = bytearray()
        self._base = 0  # text offset of _buf[0]
        self._pos = 0  # start of the next span in _buf
        self._ended = False
        self._head = b""
        self._tail = b""
        self.root_is_list = False
        self.bytes_read = 0

    def _fill(self) -> bool:
        piece = next(self._pieces, None)
        if piece is None:
            return False
        self._buf += piece
        self.bytes_read += len(piece)
        return True

    def _after_space(self) -> int:
        """Offset in the buffer of the first non-space byte at or after the span start. A run of
        whitespace is searched once and dropped as it is read (what lies before the span start
        was handed out or copied): linear time and flat memory in the run's length."""
        while (m := _NOT_SPACE.search(self._buf, self._pos)) is None:
            self._base += len(self._buf)
            self._buf.clear()
            self._pos = 0
            if not self._fill():
                return len(self._buf)
        return m.start()

    def start(self) -> None:
        """Find the start of the events array.

        Raises:
            NotStreamable: the text does not start as a JSON object or array, or its
                ``traceEvents`` key is not within the first :data:`MAX_HEADER_BYTES`.
        """
        at = self._after_space()
        first = self._buf[at : at + 1]
        if first == b"[":
            self.root_is_list = True
            self._pos = at + 1
        elif first == b"{":
            while (m := _EVENTS_KEY.search(self._buf)) is None:
                if len(self._buf) > MAX_HEADER_BYTES or not self._fill():
                    raise NotStreamable("no traceEvents array near the start")
            self._head = bytes(self._buf[: m.start()])
            self._pos = m.end()
        else:
            raise NotStreamable("not a JSON object or array")
        at = self._after_space()
        if self._buf[at : at + 1] == b"]":  # no events
            self._pos = at + 1
            self.close()

    def span(self) -> tuple[bytes, bytes, bool] | None:
        """The next span of events, None after the array closed.

        Returns:
            ``(text, separator, may_end)``: ``text`` holds events and the commas between them
            and ends with a ``}``; ``separator`` is the text up to the next span (a comma, or the
            ``]`` when ``may_end``), so that a span that was cut inside an event joins the next
            one exactly as the file had them: ``text + separator + next_text``.

        Raises:
            NotStreamable: the text ends before the array closes (truncated or damaged).
        """
        if self._ended:
            return None
        if self._pos > (1 << 22):  # drop what was handed out: the buffer stays about a batch
            del self._buf[: self._pos]
            self._base += self._pos
            self._pos = 0
        target = self._pos + self._batch
        while len(self._buf) < target and self._fill():
            pass
        m = None
        if target <= len(self._buf):
            frm = target
            while (m := _BOUNDARY.search(self._buf, frm)) is None:
                seen = len(self._buf)
                if not self._fill():
                    break
                frm = max(frm, seen - 64)
        if m is None:  # the rest of the text is in the buffer: the array must close in it
            m = END.search(self._buf, self._pos)
            if m is None:
                raise NotStreamable("the events array does not close")
        start, end = self._pos, m.start() + 1
        self._pos = m.end()
        return bytes(self._buf[start:end]), bytes(self._buf[end : m.end()]), m["end"] is not None

    @property
    def offset(self) -> int:
        """Text offset where the next span starts."""
        return self._base + self._pos

    @property
    def ended(self) -> bool:
        """The events array closed."""
        return self._ended

    def end_at(self, offset: int) -> None:
        """The array closed just before text offset ``offset`` (inside the last span handed out):
        read the header's tail from there.

        Raises:
            NotStreamable: that text is no longer in the buffer (a span joined from several).
        """
        if offset < self._base:
            raise NotStreamable("the events ended inside a joined span")
        self._pos = offset - self._base
        self.close()

    def close(self) -> None:
        """The array closed: read the rest of the file as the header's tail."""
        self._ended = True
        tail = bytearray(self._buf[self._pos:])
        self._buf = bytearray()
        for piece in self._pieces:
            self.bytes_read += len(piece)
            tail += piece
            if len(tail) > MAX_HEADER_BYTES:
                raise NotStreamable("a long text after the events")
        self._tail = bytes(tail)

    @property
    def header(self) -> dict:
        """The top-level object without its events (``traceEvents: []``).

        Raises:
            NotStreamable: the header text is not strict JSON, or holds events of its own.
        """
        if self.root_is_list:
            if self._tail.strip(_SPACE):
                raise NotStreamable("text after the events array")
            return {"traceEvents": []}
        try:
            # a marker in the events' place: only if it is what the top-level key holds were the
            # streamed events the file's (not a nested array, not one a later duplicate key replaces)
            data = orjson.loads(self._head + b'"traceEvents":' + _MARKER + self._tail)
        except orjson.JSONDecodeError:
            raise NotStreamable("the header is not strict JSON") from None
        if not isinstance(data, dict) or data.get("traceEvents") != orjson.loads(_MARKER):
            raise NotStreamable("the events read are not the top-level traceEvents")
        data["traceEvents"] = []
        return data
