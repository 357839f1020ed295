"""One run per output folder: an exclusive lock on ``<out>/.lock``, held for the run's life.

Two tuners writing one folder race on ``best.yaml``, ``tune.json`` and the report (one run's
``{}`` beside another's recommendation was seen); two profiles of one folder analyze each other's
trace under the wrong script's name. The lock is ``fcntl.flock`` on an open file, so
the kernel releases it when the process ends however it ends (a killed tuner leaves no stale
lock); the file holds the PID of its holder, for the message. The file is left in place: removing
it would let a third tuner lock a new file while the second holds the old one.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from perfscope.errors import PerfscopeError

LOCK_NAME = ".lock"
_HELD: set[int] = set()  # descriptors of the locks this process holds


def _close_in_child() -> None:
    # A process forked while a lock is held (a DataLoader worker of a profiled script) shares the
    # lock; closing its copy lets the lock go with this process, not with the last fork.
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


class FolderBusy(PerfscopeError):
    """Another perfscope run holds the output folder."""


class FolderLock:
    """The exclusive lock of one output folder (a context manager).

    Args:
        folder: The output folder (created when missing).
        command: The command taking it, for the message (``"perfscope tune"``).
        pid_file: Lock ``<folder>/.lock`` and write this process's PID in it, for the message of
            the one refused. False locks the folder itself and leaves no file in it (the outputs
            of ``profile`` and ``analyze`` stay exactly their files).
    """

    def __init__(self, folder: Path, command: str = "perfscope tune", *, pid_file: bool = True) -> None:
        self.folder = Path(folder)
        self.command = command
        self.pid_file = pid_file
        self.path = self.folder / LOCK_NAME if pid_file else self.folder
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or fail at once.

        Raises:
            FolderBusy: another process holds it (the message names the folder and its PID).
            OSError: the lock file cannot be created.
        """
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644) if self.pid_file else os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd) if self.pid_file else None
            os.close(fd)
            who = f" (PID {holder})" if holder else ""
            raise FolderBusy(f"output folder {self.folder} is in use by another perfscope run{who}: wait for it to "
                             f"end, or give this {self.command} another --out"
                             + (" (several workers of one study need one --out each)"
                                if self.command == "perfscope tune" else "")) from None
        except BaseException:
            os.close(fd)
            raise
        if self.pid_file:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        _HELD.add(fd)

    def release(self) -> None:
        """Let go of the lock (closing the file releases it)."""
        if self._fd is not None:
            _HELD.discard(self._fd)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _holder(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
