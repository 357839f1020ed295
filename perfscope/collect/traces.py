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
from typing import Any

from perfscope.collect.errors import CollectError

TRACE_SUFFIX = ".pt.trace.json.gz"
_RANK_TRACE = re.compile(r"^rank(\d+)\.pt\.trace\.json\.gz$")


def trace_file_name(rank: int) -> str:
    """File name of one rank's trace, e.g. ``rank0.pt.trace.json.gz``."""
    return f"rank{rank}{TRACE_SUFFIX}"


def prepare_trace_dir(out_dir: os.PathLike | str) -> pathlib.Path:
    """Create ``<out_dir>/traces`` and check that files can be written there.

    Checked by writing a probe file, not with ``os.access``: as root, or on
    network file systems, permission bits do not tell.

    Args:
        out_dir: The output directory (created with parents if missing).

    Returns:
        The trace directory.

    Raises:
        CollectError: The directory cannot be created or written to.
    """
    trace_dir = pathlib.Path(out_dir) / "traces"
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


def remove_rank_traces(trace_dir: pathlib.Path) -> None:
    """Delete old ``rank<R>`` traces so a new run never reports stale ones."""
    for path in rank_traces(trace_dir):
        path.unlink(missing_ok=True)


class TraceExporter:
    """``on_trace_ready`` callback writing one rank's trace atomically.

    The profiler exports to a temporary file in the same directory, which is
    then renamed over the final name, so readers (rank 0 waiting for the other
    ranks, TensorBoard) never see a half-written file. Export errors are kept,
    not raised: the callback runs inside the user's training loop and a full
    disk must not look like a crash of their script.

    Args:
        path: The final trace path.

    Attributes:
        written: True once the trace file exists.
        error: The exception that stopped the export, if any.
    """

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
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
