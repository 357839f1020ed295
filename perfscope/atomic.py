"""Files perfscope writes and reads back: written atomically (a reader never sees half a file, and
a failed write never destroys the previous good one: write to a temporary file in the same
directory, fsync, rename), and read back with a bound (:func:`read_bounded`)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from perfscope.errors import PerfscopeError

MAX_RECORD_BYTES = 256 * 2**20
"""The most a record perfscope reads back may hold (``summary.json``, ``timeline.json``, a
``run.jsonl``, a trial's records): 256 MiB, a hundred times the largest seen (a 100,000-step
``run.jsonl`` is about 20 MiB); past it the file is not one of perfscope's."""


class RecordFileError(PerfscopeError):
    """A file read back that is larger than its bound (:data:`MAX_RECORD_BYTES`) or not a regular file."""


def read_bounded(path: str | os.PathLike, limit: int | None = None) -> bytes:
    """The bytes of a record file, at most ``limit`` of them.

    Args:
        path: The file.
        limit: The most it may hold, in bytes (:data:`MAX_RECORD_BYTES` when None).

    Returns:
        Its whole content.

    Raises:
        OSError: as :func:`open` (missing, unreadable).
        RecordFileError: larger than ``limit``, or not a regular file (a FIFO, a device: what
            could be read from it has no bound); one line naming the file.
    """
    limit = MAX_RECORD_BYTES if limit is None else limit
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO with no writer: refused, not waited on
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise RecordFileError(f"{path}: not a regular file; not read")
        data = f.read(limit + 1) if info.st_size <= limit else b""
        if info.st_size > limit or len(data) > limit:
            size = max(info.st_size, len(data))
            raise RecordFileError(f"{path}: {size:,} bytes, more than the {limit:,} a record of perfscope's "
                                 "holds; not read")
    return data


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; create parent directories.

    Raises:
        OSError: the directory cannot be created or written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; outputs are shared like any file
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_files_atomic(files: dict[Path, bytes]) -> list[Path]:
    """Write several files as one unit: every file is written and synced to a temporary name
    first, and only once all of them are complete are they renamed into place.

    A failure while writing (a full disk, a quota, an interrupt) leaves every earlier file as it
    was: a summary is never left beside the report of another run. Only the renames, one system
    call each, are not one step; they run after everything else has succeeded.

    Raises:
        OSError: a file cannot be written (no file was replaced).
    """
    staged: list[tuple[str, Path]] = []
    try:
        for path, data in files.items():
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            staged.append((tmp, path))
            os.fchmod(fd, 0o666 & ~_umask())
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        for tmp, path in staged:
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        raise
    return [path for _, path in staged]


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """UTF-8 text version of :func:`write_bytes_atomic`."""
    return write_bytes_atomic(path, text.encode("utf-8"))
