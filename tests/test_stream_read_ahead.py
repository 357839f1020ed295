"""The file is read and gunzipped ahead of the decoding, in a thread of its own
(perfscope.trace.stream.chunks): the same text as a plain read, pieces of bounded size however
well the text compresses, errors where the plain read has them, and no thread left behind."""

from __future__ import annotations

import gzip
import os
import threading
from pathlib import Path

import pytest

from perfscope.trace import stream
from perfscope.trace.stream import PIECE_BYTES, NotStreamable, chunks


def _readers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "perfscope-read-ahead"]


def _open_files() -> set[str]:
    fds = Path("/proc/self/fd")
    return {os.readlink(fds / fd) for fd in os.listdir(fds) if (fds / fd).is_symlink()} if fds.is_dir() else set()


@pytest.mark.parametrize("gz", [False, True])
def test_the_pieces_join_into_the_file_text_and_progress_reaches_its_size(tmp_path, gz):
    text = b"".join(b'{"ph": "X", "name": "k%d"},' % i for i in range(200_000))
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(text, 1) if gz else text)
    seen, where = [], []
    for piece in chunks(path, size=1 << 16, progress=seen.append):
        where.append(threading.current_thread() is threading.main_thread())
        assert len(piece) <= PIECE_BYTES
    assert b"".join(chunks(path, size=1 << 16)) == text
    assert seen == sorted(seen) and seen[-1] == path.stat().st_size
    assert all(where) and not _readers()


def test_a_text_that_compresses_a_thousandfold_comes_in_bounded_pieces(tmp_path):
    text = b" " * (64 << 20)  # 64 MiB of spaces: a gzip of about 64 KiB, read in one call
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(text, 9))
    sizes = [len(p) for p in chunks(path)]
    assert sum(sizes) == len(text) and max(sizes) <= PIECE_BYTES and len(sizes) >= 16


def test_a_cut_gzip_raises_where_the_text_ends(tmp_path):
    text = b"x" * (3 * PIECE_BYTES)
    blob = gzip.compress(text, 1)
    path = tmp_path / "t.json.gz"
    path.write_bytes(blob[: len(blob) - 20])
    got = bytearray()
    with pytest.raises(NotStreamable, match="cut short"):
        for piece in chunks(path, size=1 << 12):
            got += piece
    assert text.startswith(bytes(got)) and len(got) > PIECE_BYTES
    assert not _readers()


def test_a_reader_given_up_part_way_stops_its_thread_and_closes_the_file(tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    path.write_bytes(b"y" * (40 << 20))
    monkeypatch.setattr(stream, "_AHEAD", 1)
    it = chunks(path, size=1 << 20)
    assert len(next(it)) == 1 << 20
    assert len(_readers()) == 1
    assert str(path) in _open_files()
    it.close()  # the caller stops early (an error in a batch, a file that needs the whole read)
    assert not _readers() and str(path) not in _open_files()


def _joined_within(path, seconds=60.0, **kwargs) -> bytes:
    """The text of chunks(path), failing the test instead of hanging it."""
    got: list = []
    t = threading.Thread(target=lambda: got.append(b"".join(chunks(path, **kwargs))), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "chunks() did not finish"
    return got[0]


@pytest.mark.parametrize("after", ["zeros", "member"])
def test_a_member_that_ends_inside_a_read_after_a_full_piece_is_followed(tmp_path, after):
    # the read that reaches the member's end was fed the rest of a call cut at PIECE_BYTES of text:
    # what follows the member (padding, the next member) must be read, not the stale unconsumed input
    text = b"".join(b'{"ph":"X","name":"k","ts":%d,"dur":1},' % (i % 1000) for i in range(150_000))
    assert len(text) > PIECE_BYTES
    path = tmp_path / "t.json.gz"
    blob = gzip.compress(text, 6) + b"\0" * 512 if after == "zeros" else \
        gzip.compress(text[: len(text) * 9 // 10], 6) + gzip.compress(text[len(text) * 9 // 10 :], 6)
    path.write_bytes(blob)
    assert _joined_within(path) == text


def test_progress_reaches_the_end_of_text_that_padding_follows(tmp_path):
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(b"x" * 100_000) + b"\0" * (3 << 20))
    seen: list = []
    assert _joined_within(path, progress=seen.append) == b"x" * 100_000
    assert seen[-1] == path.stat().st_size
    empty = tmp_path / "e.json"
    empty.write_bytes(b"")
    seen.clear()
    assert _joined_within(empty, progress=seen.append) == b"" and seen == [0]


def test_a_gzip_file_read_a_byte_at_a_time_is_still_gunzipped(tmp_path):
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": []}'))
    assert _joined_within(path, size=1) == b'{"traceEvents": []}'
