"""Batches of one trace file -> one set of row columns, in file order.

:class:`Rows` is where a read's state lives: a growing buffer per column, the text interners
that give each name one code across batches, and the counts of entries that are no duration
events. It holds numbers only (tens of bytes per duration event), never event objects.

Each column is kept in the narrowest signed integer type its values so far need (codes of a few
hundred names take two bytes, a device index one), widened when a batch needs more, and grown
by doubling its capacity: the capacity past the rows written is never touched, so it costs no
memory, and no column is ever held twice (pieces joined at the end would be).
"""

from __future__ import annotations

import numpy as np

from perfscope.heap import release_free_memory
from perfscope.trace.events import Batch, Interner, from_structs
from perfscope.trace.values import smallest_int

TEXT_COLUMNS = ("name", "cat", "pid", "tid", "shape")


class Column:
    """One column's values, appended a batch at a time (see the module docstring).

    Attributes:
        n: Values appended so far.
    """

    _FIRST = 1 << 14  # first capacity (values)

    def __init__(self) -> None:
        self._data: np.ndarray | None = None
        self.n = 0

    def append(self, values: np.ndarray) -> None:
        """Append ``values`` (1-d; integers are stored in the narrowest type that holds every
        value appended so far)."""
        values = smallest_int(values)
        end = self.n + len(values)
        if self._data is None:
            self._data = np.empty(max(self._FIRST, end), dtype=values.dtype)
        wide = np.promote_types(self._data.dtype, values.dtype)
        if end > self._data.size or wide != self._data.dtype:
            # a new buffer of which only the rows written are ever touched; the old one is freed
            grown = np.empty(max(end, 2 * self._data.size if end > self._data.size else self._data.size), dtype=wide)
            grown[: self.n] = self._data[: self.n]
            self._data = grown
        self._data[self.n : end] = values
        self.n = end

    def array(self) -> np.ndarray:
        """The values, as an array of their own (the buffer, cut to length: called once)."""
        if self._data is None:
            return np.zeros(0, np.float64)
        data, self._data = self._data, None
        # shrinking gives the untouched tail back without a copy (glibc's realloc, mremap)
        data.resize(self.n, refcheck=False)
        return data


class Rows:
    """Accumulates :class:`~perfscope.trace.events.Batch` values in file order.

    After :meth:`finish`, ``columns`` maps each column name of ``Batch`` to one array over all
    rows (text columns as global codes into ``texts[name]``; ``entry`` is each row's index in the
    file's ``traceEvents``), and ``sparse`` the rare rows of ``Batch`` (``odd_names``...).
    """

    def __init__(self) -> None:
        self.interners = {k: Interner() for k in TEXT_COLUMNS}
        self._columns: dict[str, Column] = {}
        self.entries = 0  # traceEvents entries seen
        self.batch_starts: list[int] = []  # entry index of each batch's first entry
        self.not_objects = 0
        self.begin_end = 0
        self.unknown_phases: dict[str, int] = {}
        self.thread_names: dict = {}
        self.memory: list = []  # the batches' [memory] instants, in file order
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
            self._columns.setdefault(k, Column()).append(v)
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
        self.memory.extend(b.memory)

    def finish(self) -> Rows:
        """The columns as arrays (call once, after the last batch)."""
        if not self._columns:  # no events: empty columns of the right types
            self.add(from_structs([]))
        self.columns = {k: c.array() for k, c in self._columns.items()}
        self._columns = {}
        release_free_memory()  # the batches' small arrays were freed on the way
        self.sparse = {k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in self._sparse.items()}
        self.texts = {k: i.array() for k, i in self.interners.items()}
        return self
