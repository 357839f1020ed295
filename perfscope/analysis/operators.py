"""The operators of a trace's step windows."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from perfscope.analysis.intervals import locate, outermost
from perfscope.trace.kinds import EventKind

if TYPE_CHECKING:
    from perfscope.analysis.rank_trace import RankTrace


def top_level_ops(rt: RankTrace, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Rows of operators on the main thread not nested in another one, inside the windows."""
    t = rt.table
    rows = np.flatnonzero((t.kind == EventKind.CPU_OP) & (t.thread_id == rt.windows.main_thread))
    rows = rows[np.argsort(t.ts_ns[rows], kind="stable")]
    rows = rows[outermost(t.ts_ns[rows], t.end_of(rows))]
    order = np.argsort(lo, kind="stable")
    return rows[locate(t.ts_ns[rows], lo[order], hi[order]) >= 0]
