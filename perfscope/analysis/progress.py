"""Progress of a long analysis on the terminal: files and bytes done, rate, time left.

Shown on standard error with tqdm, and only when it is a terminal (a log file or a pipe gets no
progress lines). Bytes are bytes on disk (compressed bytes for ``.json.gz``), so the total is
known before any file is opened.
"""

from __future__ import annotations

import sys
from pathlib import Path


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

            self._bar = tqdm(total=sum(self._sizes.values()), unit="B", unit_scale=True, unit_divisor=1024,
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
