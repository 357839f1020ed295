"""One trace file -> its :class:`RankTrace`: read, find the steps, measure them, judge the evidence.

This is the per-file work of an analysis, what an executor runs on a worker
(:mod:`perfscope.analysis.executors`); :func:`perfscope.analysis.run.combine` reduces the
results of all files into the run's analysis.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from perfscope.analysis import evidence as ev
from perfscope.analysis.cpu_metrics import cpu_step_metrics
from perfscope.analysis.gpu_metrics import gpu_step_metrics
from perfscope.analysis.module_view import module_steps
from perfscope.analysis.operator_view import operator_steps
from perfscope.analysis.partition import gpu_sets
from perfscope.analysis.rank_trace import RankTrace
from perfscope.analysis.steps import find_steps, launch_times
from perfscope.errors import TraceFormatError
from perfscope.heap import release_free_memory
from perfscope.trace import TraceTable
from perfscope.trace.kinds import GPU_KINDS
from perfscope.trace.load import read_table
from perfscope.trace.quality import DataQuality


def analyze_table(table: TraceTable) -> RankTrace:
    """Find the steps of one trace, measure them and judge their evidence.

    Raises:
        TraceFormatError: the trace holds no duration events (empty or metadata-only).
    """
    where = table.path.name if table.path else table.worker
    if table.n_events == 0:
        raise TraceFormatError(f"{table.path or table.worker}: trace holds no events to analyze (empty or metadata only)")
    launch = launch_times(table)
    windows = find_steps(table, launch)
    if len(windows) == 0:
        raise TraceFormatError(f"{table.path or table.worker}: trace holds no events to analyze (empty or metadata only)")
    mode = "gpu" if table.mask(*GPU_KINDS).any() else "cpu"
    sets = gpu_sets(table, launch, windows.main_thread) if mode == "gpu" else None
    metrics = gpu_step_metrics(table, windows, launch, sets) if mode == "gpu" else cpu_step_metrics(table, windows)
    judged = ev.judge(table, windows, launch, metrics, mode)
    quality = DataQuality(table.quality.entries + judged.quality.entries)
    return RankTrace(table, mode, metrics, windows, launch, judged, quality, [f"{where}: {w}" for w in windows.warnings],
                     sets, operator_steps(table, windows, launch), module_steps(table, windows, launch))


def load_table(path: Path, *, pool=None, progress=None, decoded=None) -> TraceTable:
    """Read one trace file into its table (:func:`perfscope.trace.load.read_table`: streamed in
    bounded memory, its batches decoded by ``pool`` when one is given, ``decoded()`` called
    after the last of them).

    Raises:
        TraceFormatError: unreadable, or no events.
    """
    table = read_table(path, pool=pool, progress=progress, decoded=decoded)
    if table.n_events == 0:
        raise TraceFormatError(f"{path}: trace holds no events to analyze (empty or metadata only)")
    return table


_INTERNAL = (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, RecursionError)


def analyze_file(path: Path, pool=None, progress=None, decoded=None) -> tuple[str, object]:
    """The per-file work of an analysis (what an executor runs): ``("ok", RankTrace)``, or
    ``("unreadable", error)`` for a file that cannot be read (the caller skips or raises it).
    ``pool`` and ``decoded`` as :func:`load_table`.

    Raises:
        TraceFormatError, AnalysisError: a readable trace that cannot be analyzed.
    """
    try:
        table = load_table(path, pool=pool, progress=progress, decoded=decoded)
    except TraceFormatError as e:
        return "unreadable", e
    except FileNotFoundError as e:  # gone since the files were listed
        return "unreadable", TraceFormatError(str(e) if str(path) in str(e) else f"{path}: no such file")
    except OSError as e:  # a file that cannot be read (permissions, an I/O error): named
        return "unreadable", TraceFormatError(f"{path}: cannot be read ({e.strerror or type(e).__name__})")
    except _INTERNAL as e:
        return "unreadable", e
    rank = analyze_table(table)
    release_free_memory()  # the decoded events are garbage now: their pages go back to the system
    return "ok", rank




class FileItem(NamedTuple):
    """A file sent to a worker: read at ``path`` (absolute), named ``shown`` (as the caller named it,
    also in the executor's messages)."""

    path: str
    shown: str

    def __str__(self) -> str:
        return self.shown


def analyze_as(item: FileItem) -> tuple[str, object]:
    """:func:`analyze_file` of ``item = (path, shown)``, on a worker: the file is read at ``path``
    (absolute, as the worker sees it) and named ``shown`` (as the caller named it) in the table
    and in error messages.
    """
    path, shown = item
    try:
        status, value = analyze_file(Path(path))
    except TraceFormatError as e:
        raise type(e)(str(e).replace(path, shown)) from None
    if status == "ok":
        value.table.path = Path(shown)
        value.warnings = [w.replace(path, shown) for w in value.warnings]
    elif isinstance(value, TraceFormatError):
        value = type(value)(str(value).replace(path, shown))
    return status, value
