"""Progress of a long command on the terminal: an analysis's files and bytes, a report's stages.

Shown on standard error with tqdm, only when it is a terminal (a log file or a pipe gets no
progress lines), and only once the command has run :data:`QUIET_S` seconds, so a quick command
prints nothing extra. :class:`Progress` counts an analysis's bytes on disk (compressed bytes for
``.json.gz``), so the total is known before any file is opened; :class:`Stages` names the stage a
``report`` or ``diff`` is in (reading a summary, the traces behind a timeline, drawing the page).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

# Below this a command feels immediate and a progress line would only flicker (tqdm's ``delay``).
QUIET_S = 2.0


class Progress:
    """One progress bar over the trace files of an analysis.

    Args:
        files: The files to be analyzed, in order.
        enabled: None: when standard error is a terminal.
    """

    def __init__(self, files: list[Path], enabled: bool | None = None) -> None:
        self._sizes = {str(f): Path(f).stat().st_size for f in files}
        self._n = len(files)
        self._done_files = 0
        self._done_bytes = 0  # bytes of the files finished
        self._in_file = 0  # bytes read of the file being read here
        on = sys.stderr.isatty() if enabled is None else enabled
        self._bar = _Off()
        if on:  # tqdm is imported only when there is a terminal to draw on
            from tqdm import tqdm

            self._bar = tqdm(total=sum(self._sizes.values()), unit="B", unit_scale=True, unit_divisor=1024, delay=QUIET_S,
                             desc=self._desc(), file=sys.stderr, leave=False, dynamic_ncols=True)

    def _desc(self) -> str:
        return f"analyze {self._done_files}/{self._n} files"

    def bytes_in_file(self, n: int) -> None:
        """The file being read here has had ``n`` bytes (on disk) read."""
        self._bar.update(max(n - self._in_file, 0))
        self._in_file = max(n, self._in_file)

    def file_done(self, path: Path) -> None:
        """``path`` is analyzed (read here or by a worker)."""
        size = self._sizes.get(str(path), 0)
        self._done_files += 1
        self._bar.set_description(self._desc(), refresh=False)  # drawn with the bytes just below
        self._bar.update(max(size - self._in_file, 0))
        self._in_file = 0

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Off:
    """The bar when there is no terminal: takes every call, draws nothing."""

    def update(self, n: int) -> None:
        pass

    def set_description(self, desc: str, refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


class Stages:
    """A progress line over a command's named stages.

    Args:
        command: The command's name, the line's prefix (``"report"``).
        total: How many stages the command will go through.
        enabled: None: when standard error is a terminal.

    The line appears :data:`QUIET_S` seconds after the first stage starts (a timer thread draws it,
    since a single stage, such as reading the traces behind a timeline, may last minutes without a
    step to count), names the stage being run and how many are done, and is removed on
    :meth:`close` (or at the end of the ``with`` block).
    """

    def __init__(self, command: str, total: int, enabled: bool | None = None) -> None:
        self.command = command
        self.total = total
        self.done = 0
        self.current = ""
        self._on = sys.stderr.isatty() if enabled is None else enabled
        self._file = sys.stderr
        self._bar = None
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()  # the timer's thread and the command's share the line

    def _desc(self) -> str:
        return f"{self.command}: {self.current}"

    def _show(self) -> None:
        with self._lock:
            if self._timer is None:  # closed meanwhile
                return
            from tqdm import tqdm  # imported only when there is a terminal to draw on

            self._bar = tqdm(total=self.total, initial=self.done, desc=self._desc(), file=self._file, leave=False,
                             dynamic_ncols=True, bar_format="{desc} ({n_fmt}/{total_fmt})")

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Name the stage being run (``"drawing the page"``) for as long as the block runs."""
        with self._lock:
            self.current = name
            if self._on and self._timer is None:
                self._timer = threading.Timer(QUIET_S, self._show)
                self._timer.daemon = True
                self._timer.start()
            if self._bar is not None:
                self._bar.set_description_str(self._desc())
        yield
        with self._lock:
            self.done += 1
            if self._bar is not None:
                self._bar.update(1)

    def print(self, text: str) -> None:
        """Print ``text`` on standard output without breaking the progress line."""
        with self._lock:
            if self._bar is None:
                print(text)
            else:
                self._bar.write(text, file=sys.stdout)

    def close(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    def __enter__(self) -> Stages:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
