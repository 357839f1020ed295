"""Row selections of a large trace computed a chunk of rows at a time.

A 10 GB trace holds some 20 million events. A per-row temporary of 8 bytes (``np.flatnonzero`` of
a mask, the times of those rows, the step each falls in) costs 160 MiB each, and a rule that
chains three of them sets the peak memory of the whole analysis. Taking the rows a chunk at a
time gives the same result, with temporaries that no longer grow with the trace: only the
masks (1 byte a row) and what is selected (usually few rows) do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

CHUNK_ROWS = 1 << 20  # rows per chunk: 8 MiB per int64 temporary, far above numpy's per-call cost


def row_chunks(mask: np.ndarray, chunk_rows: int | None = None) -> Iterator[np.ndarray]:
    """The rows where ``mask`` (bool, shape ``(n_rows,)``) is True, as int64 arrays of ascending
    row indices, one per chunk of ``chunk_rows`` rows (default :data:`CHUNK_ROWS`); chunks without such
    rows are skipped."""
    step = chunk_rows or CHUNK_ROWS  # read here, so that tests can make chunks small
    for i in range(0, mask.size, step):
        rows = np.flatnonzero(mask[i : i + step])
        if rows.size:
            rows += i
            yield rows


def select_rows(mask: np.ndarray, keep: Callable[[np.ndarray], np.ndarray], chunk_rows: int | None = None) -> np.ndarray:
    """The rows where ``mask`` is True and ``keep`` holds: what
    ``rows[keep(rows)]`` gives for ``rows = np.flatnonzero(mask)``, in the same order.

    Args:
        mask: Bool, shape ``(n_rows,)``.
        keep: Given int64 row indices (ascending), a bool array of their shape; called once per
            chunk, so it must depend on each row alone.
        chunk_rows: Rows per chunk (default :data:`CHUNK_ROWS`).

    Returns:
        int64 row indices, ascending.
    """
    picked = [rows[keep(rows)] for rows in row_chunks(mask, chunk_rows)]
    return np.concatenate(picked) if picked else np.zeros(0, np.int64)


def max_of(mask: np.ndarray, values: Callable[[np.ndarray], np.ndarray], chunk_rows: int | None = None):
    """The largest of ``values(rows)`` over the rows where ``mask`` is True, or None when there
    are none (``values`` as ``keep`` of :func:`select_rows`, returning numbers)."""
    best = None
    for rows in row_chunks(mask, chunk_rows):
        m = values(rows).max()
        best = m if best is None or m > best else best
    return best
