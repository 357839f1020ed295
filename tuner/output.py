"""A trial's output (stdout and stderr), kept bounded: the last part in ``output.log``.

A script that floods its output would otherwise fill the disk (62 GB in two trials of 25 s were
seen). The trial's output goes into a pipe that a thread reads; the thread writes it to
``output.log`` in two halves -- when the current half is full it becomes ``output.log.1`` and a new
half starts -- so the last :data:`KEEP_BYTES` survive whatever the total. It counts the bytes: past
:data:`LIMIT_BYTES` it stops reading and reports it (the trial is then stopped and failed), and a
write error (a full disk) is reported the same way instead of being raised in a thread. At the end
the halves are joined into one ``output.log`` that starts with a line saying what was dropped.
"""

from __future__ import annotations

import os
import select
import shutil
import threading
import time
from pathlib import Path

KEEP_BYTES = 16 * 1024 * 1024
"""Bytes of a trial's output kept in its log (the last ones)."""
LIMIT_BYTES = 256 * 1024 * 1024
"""Bytes of output after which a trial is stopped and failed."""
_CHUNK = 64 * 1024
_POLL_S = 0.1


def megabytes(n: int) -> str:
    """``n`` bytes as ``12 MB`` (MiB; at least 1 decimal below 10 MB)."""
    mb = n / (1024 * 1024)
    return f"{mb:.0f} MB" if mb >= 10 else f"{mb:.2g} MB"


class OutputLog:
    """Reads a trial's output pipe in a thread and keeps its last ``keep_bytes`` in ``path``.

    Args:
        path: The log file (``output.log``); ``<path>.1`` holds the older half while running.
        keep_bytes: Bytes kept (the last ones; two halves of half that each).
        limit_bytes: Bytes after which :attr:`problem` is set and reading stops.
    """

    def __init__(self, path: Path, keep_bytes: int = KEEP_BYTES, limit_bytes: int = LIMIT_BYTES) -> None:
        self.path = Path(path)
        self.older = self.path.with_name(self.path.name + ".1")
        self.half = max(1, keep_bytes // 2)
        self.limit = limit_bytes
        self.total = 0
        self.problem: str | None = None
        """Why the output is no longer kept: too much of it, or the log cannot be written (one line)."""
        self._file = None
        self._in_half = 0
        self._stop = threading.Event()
        self._deadline = float("inf")  # monotonic time after which a stopped reader gives up
        self._thread: threading.Thread | None = None
        self._fd: int | None = None

    def start(self, fd: int) -> None:
        """Start reading the pipe's read end ``fd`` (closed by :meth:`close`).

        Raises:
            OSError: the log file cannot be created.
        """
        self._fd = fd
        self._file = open(self.path, "wb")
        self._thread = threading.Thread(target=self._read, name="trial-output", daemon=True)
        self._thread.start()

    def _chunk(self) -> bytes | None:
        """The next bytes of the pipe (``b""``: none ready yet), or None once reading ends."""
        if self._stop.is_set() and time.monotonic() > self._deadline:
            return None  # a stray process keeps writing after the trial ended: give up on it
        try:
            ready, _, _ = select.select([self._fd], [], [], _POLL_S)
        except (OSError, ValueError):
            return None
        if not ready:
            # stopped, and nothing more to read now (a stray writer may hold the pipe)
            return None if self._stop.is_set() else b""
        try:
            data = os.read(self._fd, _CHUNK)
        except OSError:
            return None
        return data or None  # b"": every writer closed it

    def _read(self) -> None:
        while self.problem is None:
            data = self._chunk()
            if data is None:
                return
            if not data:
                continue
            self.total += len(data)
            try:
                self._write(data)
            except OSError as e:
                self.problem = f"the trial's output could not be written to {self.path}: {e.strerror or e}"
                return
            if self.total > self.limit:
                self.problem = (f"the script wrote more than {megabytes(self.limit)} of output (stdout and stderr) "
                                f"and was stopped; the end of it is kept in {self.path.name}")

    def _write(self, data: bytes) -> None:
        while data:
            room = self.half - self._in_half
            if room <= 0:
                self._rotate()
                continue
            self._file.write(data[:room])
            self._in_half += min(room, len(data))
            data = data[room:]

    def _rotate(self) -> None:
        self._file.close()
        os.replace(self.path, self.older)
        self._file = open(self.path, "wb")
        self._in_half = 0

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop reading (after what is left in the pipe, up to ``timeout_s``), close the pipe and
        join the halves into ``path``. A write error sets :attr:`problem`; nothing is raised."""
        self._deadline = time.monotonic() + timeout_s
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s + 1.0)
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None
        try:
            if self._file is not None:
                self._file.close()
            if self.older.exists():
                self._join_halves()
        except OSError as e:
            self.problem = self.problem or f"the trial's output could not be written to {self.path}: {e.strerror or e}"

    def _join_halves(self) -> None:
        joined = self.path.with_name(self.path.name + ".tmp")
        dropped = self.total - self.older.stat().st_size - self.path.stat().st_size
        with open(joined, "wb") as out:
            out.write(f"[perfscope: the script wrote {self.total} bytes; the first {dropped} are dropped, "
                      f"at most the last {megabytes(2 * self.half)} kept]\n".encode())
            for part in (self.older, self.path):
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out)
        os.replace(joined, self.path)
        self.older.unlink()
