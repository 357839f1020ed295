"""Where traces go and how they are written.

Layout: ``<out_dir>/traces/rank<R>.pt.trace.json.gz``, one file per rank. It is
the layout the TensorBoard profiler plugin reads (worker name ``rank<R>``, no
span), so ``tensorboard --logdir <out_dir>`` works next to perfscope.
"""

from __future__ import annotations

import os
import pathlib
import re
import tempfile
import time
from collections.abc import Iterable
from typing import Any

from perfscope.collect.errors import CollectError

TRACE_SUFFIX = ".pt.trace.json.gz"
_RANK_TRACE = re.compile(r"^rank(\d+)\.pt\.trace\.json\.gz$")


def trace_file_name(rank: int) -> str:
    """File name of one rank's trace, e.g. ``rank0.pt.trace.json.gz``."""
    return f"rank{rank}{TRACE_SUFFIX}"


def absolute_out_dir(out_dir: os.PathLike | str) -> pathlib.Path:
    """``out_dir`` made absolute against the current directory, now.

    Taken before the script runs: a script that calls ``os.chdir`` must not
    move the traces written at the end of its window (symlinks are kept as
    typed, unlike ``resolve()``, so paths shown to the user stay recognizable).
    """
    return pathlib.Path(os.path.abspath(os.fspath(out_dir)))


def prepare_trace_dir(out_dir: os.PathLike | str) -> pathlib.Path:
    """Create ``<out_dir>/traces`` and check that files can be written there.

    Checked by writing a probe file, not with ``os.access``: as root, or on
    network file systems, permission bits do not tell.

    Args:
        out_dir: The output directory (created with parents if missing);
            a relative one is taken relative to the current directory.

    Returns:
        The trace directory, as an absolute path.

    Raises:
        CollectError: The directory cannot be created or written to.
    """
    trace_dir = absolute_out_dir(out_dir) / "traces"
    try:
        trace_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=trace_dir, prefix=".perfscope-probe-"):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise CollectError(f"cannot write to output directory {out_dir}: {reason}") from None
    return trace_dir


def rank_traces(trace_dir: pathlib.Path) -> list[pathlib.Path]:
    """The ``rank<R>`` trace files in ``trace_dir``, in rank order."""
    found = []
    for path in trace_dir.iterdir() if trace_dir.is_dir() else ():
        match = _RANK_TRACE.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def remove_stale_rank_traces(
    trace_dir: os.PathLike | str, keep: Iterable[os.PathLike | str]
) -> list[pathlib.Path]:
    """Delete the ``rank<R>`` traces in ``trace_dir`` that are not in ``keep``.

    A run never deletes old traces before it has written its own (a failed
    rerun must not lose the previous run's data); each rank's file is replaced
    atomically instead. Traces of ranks the new run did not have (an earlier
    run with more ranks) stay behind; call this once the new run's traces have
    been analyzed, with ``keep=result.trace_files``.

    Args:
        trace_dir: The trace directory (``<out_dir>/traces``).
        keep: Trace files to keep, e.g. ``CollectResult.trace_files``.

    Returns:
        The files deleted, in rank order.
    """
    kept = {pathlib.Path(path).resolve() for path in keep}
    removed = []
    for path in rank_traces(pathlib.Path(trace_dir)):
        if path.resolve() not in kept:
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def rank_trace_stamps(trace_dir: pathlib.Path) -> dict[str, tuple[int, int, int]]:
    """Identify the ``rank<R>`` traces present now: file name -> (inode, mtime ns, size).

    Taken before a launch, it tells afterwards which traces the launch wrote
    (:func:`rank_traces_written_since`). Exact where modification times are
    not: a trace is written to a new file and renamed over the old one, so
    its inode always differs from the file it replaced.
    """
    stamps = {}
    for path in rank_traces(trace_dir):
        try:
            st = path.stat()
        except OSError:
            continue
        stamps[path.name] = (st.st_ino, st.st_mtime_ns, st.st_size)
    return stamps


def rank_traces_written_since(
    trace_dir: pathlib.Path, ranks: int | Iterable[int], before: dict[str, tuple[int, int, int]]
) -> list[pathlib.Path]:
    """Traces of ``ranks`` that are new or replaced since ``before``.

    Args:
        trace_dir: The trace directory.
        ranks: The run's ranks (a count: ``0 .. ranks-1``; a node of a multi-node job: its
            global ranks); other files are an older run's.
        before: :func:`rank_trace_stamps` taken before the run started.

    Returns:
        This run's trace files, in rank order.
    """
    now = rank_trace_stamps(trace_dir)
    names = [trace_file_name(rank) for rank in (range(ranks) if isinstance(ranks, int) else ranks)]
    return [trace_dir / name for name in names if name in now and now[name] != before.get(name)]


class TraceExporter:
    """``on_trace_ready`` callback writing one rank's trace atomically.

    The profiler exports to a temporary file in the same directory, which is
    then renamed over the final name, so readers (rank 0 waiting for the other
    ranks, TensorBoard) never see a half-written file. Export errors are kept,
    not raised: the callback runs inside the user's training loop and a full
    disk must not look like a crash of their script.

    Args:
        path: The final trace path; made absolute now, since the export runs
            inside the script, which may have changed directory by then.

    Attributes:
        written: True once the trace file exists.
        error: The exception that stopped the export, if any.
    """

    def __init__(self, path: pathlib.Path) -> None:
        self.path = pathlib.Path(os.path.abspath(path))
        self.written = False
        self.error: Exception | None = None

    def __call__(self, prof: Any) -> None:
        # Must end in ".gz": the profiler gzips only paths with that suffix.
        # The name does not match the TensorBoard pattern, so it is never read.
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp.gz")
        try:
            prof.export_chrome_trace(str(tmp))
            os.replace(tmp, self.path)
            self.written = True
        except Exception as exc:  # noqa: BLE001 - reported by the session
            self.error = exc
            tmp.unlink(missing_ok=True)


def wait_for_rank_traces(
    trace_dir: os.PathLike | str,
    world_size: int,
    timeout_s: float,
    *,
    newer_than: float | None = None,
    poll_s: float = 0.5,
) -> list[pathlib.Path]:
    """Wait until every rank's trace file is in ``trace_dir``, or time out.

    Used by rank 0 of a job started with torchrun: the other ranks write their
    traces into the same (shared) directory when they finish. Files appear
    atomically, so a file that exists is complete.

    Args:
        trace_dir: The shared trace directory.
        world_size: Number of ranks; files ``rank0`` .. ``rank<world_size-1>``.
        timeout_s: Longest wait, in seconds; 0 checks once.
        newer_than: Ignore files last modified before this time (seconds
            since the epoch), i.e. traces left by an earlier run.
        poll_s: Seconds between checks.

    Returns:
        The rank trace files present when all appeared or the time ran out, in
        rank order. Fewer than ``world_size`` means some rank wrote no trace
        in time (it failed, or the directory is not shared between nodes).
    """
    trace_dir = pathlib.Path(trace_dir)
    expected = [trace_dir / trace_file_name(rank) for rank in range(world_size)]
    deadline = time.monotonic() + max(0.0, timeout_s)
    while True:
        present = [path for path in expected if _is_fresh(path, newer_than)]
        if len(present) == world_size or time.monotonic() >= deadline:
            return present
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))


def _is_fresh(path: pathlib.Path, newer_than: float | None) -> bool:
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return False
    # One second of slack: coarse file-system timestamps and clock skew.
    return newer_than is None or mtime >= newer_than - 1.0
