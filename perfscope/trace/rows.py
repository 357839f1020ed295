"""Batches of one trace file -> one set of row columns, in file order.

:class:`Rows` is where a read's state lives: the column pieces of every batch, the text
interners that give each name one code across batches, and the counts of entries that are no
duration events. It holds numbers only (tens of bytes per duration event), never event objects.
"""

from __future__ import annotations

import numpy as np

from perfscope.heap import release_free_memory
from perfscope.trace.events import Batch, Interner, from_structs

TEXT_COLUMNS = ("name", "cat", "pid", "tid")


class Rows:
    """Accumulates :class:`~perfscope.trace.events.Batch` values in file order.

    After :meth:`finish`, ``columns`` maps each column name of ``Batch`` to one array over all
    rows (text columns as global codes into ``texts[name]``; ``entry`` is each row's index in the
    file's ``traceEvents``), and ``sparse`` the rare rows of ``Batch`` (``odd_names``...).
    """

    def __init__(self) -> None:
        self.interners = {k: Interner() for k in TEXT_COLUMNS}
        self._pieces: dict[str, list[np.ndarray]] = {}
        self.entries = 0  # traceEvents entries seen
        self.batch_starts: list[int] = []  # entry index of each batch's first entry
        self.not_objects = 0
        self.begin_end = 0
        self.unknown_phases: dict[str, int] = {}
        self.thread_names: dict = {}
        self.bad_values: dict = {}  # (field, row) -> value
        self._sparse: dict[str, list[np.ndarray]] = {"odd_names": [], "odd_cats": [], "correlation_minus_one": []}
        self.sparse: dict[str, np.ndarray] = {}  # those rows, over all batches (sorted)
        self.n = 0
        self.columns: dict[str, np.ndarray] = {}
        self.texts: dict[str, np.ndarray] = {}

    def add(self, b: Batch) -> None:
        """Append one batch (the next in the file)."""
        self.batch_starts.append(self.entries)
        for k, v in b.columns.items():
            if k in self.interners:
                v = self.interners[k].merge(v, b.uniques[k])
            elif k == "entry":  # int32 while the file has fewer than 2**31 entries (600 GB of text)
                v = v + self.entries
                if self.entries + b.entries < 2**31:
                    v = v.astype(np.int32)
            self._pieces.setdefault(k, []).append(v)
        for (f, i), v in b.bad_values.items():
            self.bad_values[(f, self.n + i)] = v
        for k in self._sparse:
            if len(getattr(b, k)):
                self._sparse[k].append(getattr(b, k) + self.n)
        self.n += b.n
        self.entries += b.entries
        self.not_objects += b.not_objects
        self.begin_end += b.begin_end
        for k, v in b.unknown_phases.items():
            self.unknown_phases[k] = self.unknown_phases.get(k, 0) + v
        self.thread_names.update(b.thread_names)  # a later name of a thread wins, as in one dict

    def finish(self) -> Rows:
        """Join the pieces (call once, after the last batch)."""
        if not self._pieces:  # no events: empty columns of the right types
            self.add(from_structs([]))
        self.columns = {}
        for k in list(self._pieces):  # one column at a time: its pieces are freed before the next is joined
            pieces = self._pieces.pop(k)
            self.columns[k] = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
            del pieces
            # the pieces' pages go back to the system now, or every column would be held twice
            release_free_memory()
        self.sparse = {k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in self._sparse.items()}
        self.texts = {k: i.array() for k, i in self.interners.items()}
        return self
