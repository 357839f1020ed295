"""Analysis of a whole run: every rank's traces -> one per-step frame, verdicts, and the summary.

This is the public entry point behind ``perfscope analyze`` and ``perfscope.analyze()``. It never
imports torch, so traces from a cluster can be analyzed on any machine.
"""

from __future__ import annotations

from pathlib import Path

from perfscope.analysis.combine import combine
from perfscope.analysis.summary import Analysis
from perfscope.analysis.rank import FileItem, RankTrace, analyze_as, analyze_file, analyze_table, load_table  # noqa: F401 (API)
from perfscope.errors import TraceFormatError
from perfscope.record.schema import Skipped
from perfscope.trace import TraceTable, find_trace_files
from perfscope.trace.decode import TraceDamagedError


def analyze_tables(
    tables: list[TraceTable], run_info: dict | None = None, *, common_steps_only: bool = False
) -> Analysis:
    """Analyze already-loaded traces of one run (one or more ranks, one or more windows each).

    Args:
        tables: One table per trace file.
        run_info: Run metadata for the summary.
        common_steps_only: When ranks hold different steps (a run that failed on one rank),
            analyze the steps all ranks hold instead of raising.

    Raises:
        TraceFormatError: a trace holds no events.
        AnalysisError: traces of different jobs (world sizes), ranks disagree on step numbers,
            one step of a rank in two traces (both named), markers on some ranks only.
    """
    return combine([analyze_table(t) for t in tables], run_info, common_steps_only=common_steps_only)


def analyze(path: str | Path, run_info: dict | None = None) -> Analysis:
    """Analyze a trace file, or a directory of per-rank traces.

    Args:
        path: A ``.json`` / ``.json.gz`` Kineto trace, or a directory searched recursively for
            them (one file per rank, TensorBoard layout ``<worker>[.<span>].pt.trace.json.gz``).
            In a directory, files that cannot be read are skipped with a warning (and listed in
            ``Analysis.skipped``).
        run_info: Metadata of the run when perfscope profiled it (stored in the summary).

    Returns:
        The :class:`Analysis`: ``.steps`` (pandas DataFrame, one row per rank and step),
        ``.verdict`` and ``.summary()``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        TraceFormatError: no trace files, an unreadable or empty trace (``TraceDamagedError``
            for damage inside a trace that no rule repairs: file, line and column).
        AnalysisError: the traces cannot be analyzed as one job (see :func:`analyze_tables`).
    """
    path = Path(path)
    return analyze_files(find_trace_files(path), run_info, skip_unreadable=path.is_dir())


# Below this much trace text (estimated from the files' sizes), starting worker processes costs
# more than it saves: one A100 rank (35 MB of text) is analyzed in about 0.3 s.
PARALLEL_MIN_TEXT_BYTES = 200 << 20
_GZIP_RATIO = 10  # text bytes per gzip byte, a low guess for Kineto traces (20x is common)


def text_bytes(files: list[Path]) -> int:
    """Estimated text bytes of trace files (gzip ones count :data:`_GZIP_RATIO` times their size)."""
    total = 0
    for f in files:
        size = Path(f).stat().st_size
        total += size * (_GZIP_RATIO if str(f).endswith(".gz") else 1)
    return total


def choose_executor(files: list[Path], jobs: int | None):
    """The executor for ``files``: ``jobs`` worker processes (None: one per core when the traces
    are large enough to gain from it, :data:`PARALLEL_MIN_TEXT_BYTES`), else serial."""
    from perfscope.analysis import executors

    if jobs is None:
        jobs = executors.cores() if text_bytes(files) >= PARALLEL_MIN_TEXT_BYTES else 1
    if jobs <= 1:
        return executors.SerialExecutor()
    return executors.ProcessExecutor(jobs)


def analyze_files(
    files: list[Path],
    run_info: dict | None = None,
    *,
    skip_unreadable: bool = False,
    common_steps_only: bool = False,
    jobs: int | None = None,
    executor=None,
    progress=None,
) -> Analysis:
    """Analyze the given trace files as one run (see :func:`analyze`).

    Args:
        files: Trace files, one or more per rank.
        run_info: Run metadata for the summary.
        skip_unreadable: Skip files that cannot be read (with a warning, and listed in
            ``Analysis.skipped``) as long as one readable trace remains; otherwise such a file is
            an error. A file that breaks perfscope itself is skipped the same way, named as an
            internal error, so that one file cannot stop the analysis of a directory.
        common_steps_only: See :func:`analyze_tables`.
        jobs: Worker processes on this machine (None: one per core for large traces, else
            none; 1: none). Ignored when ``executor`` is given.
        executor: A :class:`perfscope.analysis.executors.RankExecutor` to run the per-file work
            on (a :class:`~perfscope.analysis.executors.DaskExecutor` for a cluster); the caller
            closes it.
        progress: A :class:`perfscope.analysis.progress.Progress`, told of bytes and files done.

    Raises:
        TraceFormatError: an unreadable or empty trace (every one, with ``skip_unreadable``).
        AnalysisError: see :func:`analyze_tables`.
        ExecutorError: the executor could not run a file (a worker died for good).
    """
    if len(files) > 1:
        from perfscope.analysis.job import prescan_world_sizes

        prescan_world_sizes(files)  # several jobs in one folder: said before any file is parsed
    own = executor is None
    if own:
        executor = choose_executor(files, jobs)
    try:
        rank_traces, skipped = _run_files(files, executor, skip_unreadable, progress, own)
    finally:
        if own:
            executor.close()
    if not rank_traces:
        first = skipped[0].reason
        raise TraceFormatError(first if len(skipped) == 1 else f"no readable trace among {len(files)} files ({first}, ...)")
    analysis = combine(rank_traces, run_info, common_steps_only=common_steps_only)
    analysis.warnings[:0] = [f"skipped {s.reason}" for s in skipped]
    analysis.skipped = skipped
    return analysis


def _run_files(files, executor, skip_unreadable: bool, progress, own: bool = False) -> tuple[list[RankTrace], list[dict]]:
    from perfscope.analysis.executors import SerialExecutor

    here = progress.bytes_in_file if progress else None
    if len(files) == 1 and executor.pool is not None:
        # one large file: its batches on every worker; a pool of our own is shut down once they
        # are decoded, so that its workers' memory is gone before the table is assembled
        with executor.running(files[0]):
            results = [analyze_file(files[0], executor.pool, here, executor.close if own else None)]
    elif isinstance(executor, SerialExecutor):
        results = (analyze_file(f, None, here) for f in files)
    else:
        # workers (on other machines, in other directories) get absolute paths; what they return
        # names each file as the caller did, so the summary is the same whoever did the work
        results = executor.map(analyze_as, [FileItem(str(Path(f).absolute()), str(f)) for f in files])
    results = iter(results)
    try:
        return _collect(files, results, skip_unreadable, progress)
    finally:  # an error part way: the executor's work still queued is cancelled now
        close = getattr(results, "close", None)
        if close is not None:
            close()


def _collect(files, results, skip_unreadable: bool, progress) -> tuple[list[RankTrace], list[Skipped]]:
    rank_traces, skipped = [], []
    for f, (status, value) in zip(files, results):
        if progress is not None:
            progress.file_done(f)
        if status == "ok":
            rank_traces.append(value)
            continue
        if not skip_unreadable:
            raise value
        if isinstance(value, TraceFormatError):
            skipped.append(Skipped(path=str(f), reason=str(value), damaged=isinstance(value, TraceDamagedError)))
        else:
            skipped.append(Skipped(path=str(f), reason=f"{f}: could not be read (internal error: {type(value).__name__}: "
                                                       f"{value}; please report it)", damaged=True))
    return rank_traces, skipped
