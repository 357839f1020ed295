"""Hostile inputs to the trace reader: a long run of whitespace is read in linear time and flat
memory, and a gzip file that inflates far past what any trace does is refused as too large, by
the streamed read and by the whole-file read alike."""

from __future__ import annotations

import gzip
import zlib

import pytest

from perfscope.errors import TraceFormatError
from perfscope.trace import stream
from perfscope.trace.reader import read_trace
from perfscope.trace.stream import Cutter, TraceTooLarge, chunks


def _gzip_of_spaces(path, mib: int, tail: bytes = b"") -> None:
    d = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    block = b" " * (1 << 20)
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(d.compress(block))
        f.write(d.compress(tail) + d.flush())


def _read(path, streamed: bool) -> None:
    """Read ``path`` as the streamed read does, or as the whole-file read does."""
    if streamed:
        for _ in chunks(path):
            pass
    else:
        read_trace(path)


def test_a_run_of_whitespace_is_searched_once(tmp_path):
    # 48 MiB of spaces before the object, in 1 MiB pieces: each search starts where the last ended
    # (quadratic before: every piece re-searched the whole run), and the run is dropped as read.
    path = tmp_path / "spaces.json.gz"
    _gzip_of_spaces(path, 48, b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}]}')
    cutter = Cutter(chunks(path))
    calls = []
    search = stream._NOT_SPACE.search
    class Counting:
        def search(self, buf, pos=0):
            calls.append(len(buf) - pos)
            return search(buf, pos)
    stream_pattern, stream._NOT_SPACE = stream._NOT_SPACE, Counting()
    try:
        cutter.start()
    finally:
        stream._NOT_SPACE = stream_pattern
    assert sum(calls) <= 2 * (48 << 20), sum(calls)  # each byte searched about once
    assert max(calls) <= 8 << 20  # never more than a piece or two held
    text, _, may_end = cutter.span()
    assert text.startswith(b'{"ph"') and may_end


def test_whitespace_only_ends_as_not_a_trace(tmp_path):
    path = tmp_path / "blank.json"
    path.write_bytes(b" " * (8 << 20))
    with pytest.raises(TraceFormatError):
        read_trace(path)


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole-file"])
def test_a_gzip_bomb_is_refused_as_too_large(tmp_path, monkeypatch, streamed):
    monkeypatch.setattr(stream, "MIN_JUDGED_BYTES", 8 << 20)  # judged early: the test stays small
    path = tmp_path / "bomb.json.gz"
    _gzip_of_spaces(path, 64)  # 64 MiB of text from about 64 KiB: 1000x
    assert path.stat().st_size < 200 << 10
    with pytest.raises(TraceTooLarge, match=r"too large: its [\d,]+ bytes of gzip inflate past [\d,]+ MiB of text \(200x\)"):
        _read(path, streamed)
    assert isinstance(TraceTooLarge(path, 1), TraceFormatError)  # one line from the CLI, as any bad trace


def test_a_well_compressed_but_real_sized_file_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(stream, "MIN_JUDGED_BYTES", 1 << 20)
    events = ",".join('{"ph": "X", "name": "op", "ts": %d, "dur": 1}' % i for i in range(20000))
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(f'{{"traceEvents": [{events}]}}'.encode()))
    assert len(read_trace(path).data["traceEvents"]) == 20000
    assert sum(len(p) for p in chunks(path)) == len(gzip.decompress(path.read_bytes()))


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole-file"])
def test_thousands_of_empty_gzip_members_are_refused_at_once(tmp_path, streamed):
    # Each member's end copied the rest of the read: 200,000 empty members (4 MB) ran for minutes.
    from perfscope.trace.stream import MAX_GZIP_MEMBERS, TooManyMembers

    path = tmp_path / "members.json.gz"
    trace = gzip.compress(b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}]}')
    path.write_bytes(trace + gzip.compress(b"") * 200_000 + b"X")
    with pytest.raises(TooManyMembers, match=f"more than {MAX_GZIP_MEMBERS:,} gzip members"):
        _read(path, streamed)


def test_a_few_gzip_members_still_read_as_one_text(tmp_path):
    path = tmp_path / "three.json.gz"
    parts = [b'{"traceEvents": [', b'{"ph": "X", "name": "a", "ts": 1, "dur": 2}', b"]}"]
    path.write_bytes(b"".join(gzip.compress(p) for p in parts))
    assert len(read_trace(path).data["traceEvents"]) == 1
    assert b"".join(chunks(path)) == b"".join(parts)
