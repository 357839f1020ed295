"""Analysis of a whole run: every rank's traces -> one per-step frame, verdicts, and the summary.

This is the public entry point behind ``perfscope analyze`` and ``perfscope.analyze()``. It never
imports torch, so traces from a cluster can be analyzed on any machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from perfscope.analysis.cpu_metrics import cpu_step_metrics
from perfscope.analysis.details import build_details
from perfscope.analysis.gpu_metrics import gpu_step_metrics
from perfscope.analysis.steps import Launches, StepWindows, find_steps, launch_times
from perfscope.analysis.verdict import RunVerdict, classify, cost_fractions, run_verdict
from perfscope.errors import AnalysisError, TraceFormatError
from perfscope.trace import TraceTable, build_table, find_trace_files, read_trace
from perfscope.trace.reader import gc_paused
from perfscope.trace.kinds import GPU_KINDS

NO_MARKERS_NOTE = "no ProfilerStep# markers: analyzed the whole trace as one window (step 0)"


@dataclass
class RankTrace:
    """What one trace file contributed.

    Attributes:
        table: The columnar trace.
        mode: ``"gpu"`` when it holds GPU events, else ``"cpu"``.
        metrics: Per-step metrics (``*_us``), one row per step.
        windows: The steps and their windows.
        launches: The launching runtime call of every GPU event.
        warnings: Problems with the step markers (duplicates, overlaps).
    """

    table: TraceTable
    mode: str
    metrics: pd.DataFrame
    windows: StepWindows
    launches: Launches
    warnings: list[str] = field(default_factory=list)

    @property
    def steps(self) -> np.ndarray:
        """Step numbers, in row order."""
        return self.windows.step

    @property
    def complete(self) -> np.ndarray:
        """Per-step completeness (False: cut off by the end of profiling)."""
        return self.windows.complete

    @property
    def has_markers(self) -> bool:
        return self.windows.has_markers


def analyze_table(table: TraceTable) -> RankTrace:
    """Find the steps of one trace and measure them.

    Raises:
        TraceFormatError: the trace holds no duration events (empty or metadata-only).
    """
    if table.n_events == 0:
        where = table.path or table.worker
        raise TraceFormatError(f"{where}: trace holds no events to analyze (empty or metadata only)")
    launch = launch_times(table)
    windows = find_steps(table, launch)
    if len(windows) == 0:
        raise TraceFormatError(f"{table.path}: trace holds no events to analyze (empty or metadata only)")
    mode = "gpu" if table.mask(*GPU_KINDS).any() else "cpu"
    metrics = gpu_step_metrics(table, windows, launch) if mode == "gpu" else cpu_step_metrics(table, windows)
    where = table.path.name if table.path else table.worker
    return RankTrace(table, mode, metrics, windows, launch, [f"{where}: {w}" for w in windows.warnings])


@dataclass
class Analysis:
    """The analysis of a run.

    Attributes:
        steps: One row per (rank, step): ``rank``, ``worker``, ``step``, ``complete``, ``mode``,
            metrics in microseconds (``*_us``) and as fractions of step time (``*_frac``), the
            class costs (``io_frac``, ``comm_frac``, ``launch_frac``, ``compute_frac``),
            ``verdict`` and ``runner_up``.
        verdict: The run's verdict (over the total time of complete steps of all ranks).
        mode: ``"gpu"`` or ``"cpu"``.
        traces: Per-file facts (path, worker, rank, mode, events, markers, devices, warnings).
        notes: Statements about how the traces were read (e.g. no step markers).
        warnings: Problems that did not stop the analysis (truncated files...).
        run_info: Metadata of the profiled run when perfscope recorded it, else ``{}``.
        details: Run-level detail for the report (:func:`perfscope.analysis.details.build_details`).
        tables: The trace tables analyzed, by resolved file path, so the report's timeline
            need not parse the traces a second time.
    """

    steps: pd.DataFrame
    verdict: RunVerdict
    mode: str
    traces: list[dict]
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    run_info: dict = field(default_factory=dict)
    details: dict = field(default_factory=dict)
    tables: dict = field(default_factory=dict, repr=False)

    @property
    def ranks_analyzed(self) -> int:
        """Number of distinct ranks in the analysis."""
        return int(self.steps["rank"].nunique())

    @property
    def world_size(self) -> int:
        """The job's world size as the traces record it (``distributedInfo``), else the ranks analyzed."""
        recorded = [t["distributed_info"].get("world_size") for t in self.traces]
        recorded = [w for w in recorded if isinstance(w, int)]
        return max(recorded) if recorded else self.ranks_analyzed

    def summary(self) -> dict:
        """The versioned ``summary.json`` record (see ``docs/summary.md``)."""
        from perfscope.summary import build_summary

        return build_summary(self)


# Time columns that are not parts of a step, so no share of it.
_NOT_SHARES = ("step_time_us", "cpu_span_us", "gpu_extended_span_us", "median_kernel_us", "median_operator_us")


def _with_fractions(metrics: pd.DataFrame) -> pd.DataFrame:
    step = metrics["step_time_us"].to_numpy(dtype=float)
    safe = np.where(step > 0, step, 1.0)
    fracs = {
        col[:-3] + "_frac": metrics[col].to_numpy(dtype=float) / safe
        for col in metrics.columns
        if col.endswith("_us") and col not in _NOT_SHARES
    }
    return pd.concat([metrics, pd.DataFrame(fracs, index=metrics.index)], axis=1)


def _assign_ranks(rank_traces: list[RankTrace]) -> list[int]:
    """Rank of each trace: from distributedInfo or the file name, else by worker name order."""
    known = [rt.table.rank for rt in rank_traces]
    workers = sorted({rt.table.worker for rt, r in zip(rank_traces, known) if r is None})
    used = {r for r in known if r is not None}
    free = (r for r in range(len(rank_traces) + len(used)) if r not in used)
    by_worker = {w: next(free) for w in workers}
    return [r if r is not None else by_worker[rt.table.worker] for rt, r in zip(rank_traces, known)]


def _check_steps(frame: pd.DataFrame, common_steps_only: bool, notes: list[str]) -> pd.DataFrame:
    """Check that ranks hold the same steps; returns the frame (restricted to the common steps
    when ``common_steps_only`` and they differ)."""
    dup = frame.duplicated(["rank", "step"])
    if dup.any():
        r, s = frame.loc[dup, ["rank", "step"]].iloc[0]
        raise AnalysisError(f"two traces of rank {r} both hold step {s}: analyze them separately")
    per_rank = frame.groupby("rank")["step"].apply(lambda s: tuple(sorted(s)))
    if per_rank.nunique() <= 1:
        return frame
    desc = "; ".join(f"rank {r}: steps {_span(v)}" for r, v in per_rank.items())
    common = set.intersection(*(set(v) for v in per_rank))
    if not common_steps_only or not common:
        raise AnalysisError(f"ranks disagree on step numbers ({desc}); profile all ranks with the same schedule or analyze them separately")
    notes.append(f"ranks captured different steps ({desc}); analyzed the {len(common)} steps all ranks hold")
    return frame[frame["step"].isin(common)]


def _span(steps: tuple) -> str:
    return f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else str(steps[0])


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
        AnalysisError: ranks disagree on step numbers, or one step is in two traces of a rank.
    """
    rank_traces = [analyze_table(t) for t in tables]
    ranks = _assign_ranks(rank_traces)
    frames, traces, notes, warnings = [], [], [], []
    for rt, rank in zip(rank_traces, ranks):
        f = _with_fractions(rt.metrics)
        f.insert(0, "rank", rank)
        f.insert(1, "worker", rt.table.worker)
        f.insert(2, "step", rt.steps)
        f.insert(3, "complete", rt.complete)
        f.insert(4, "mode", rt.mode)
        frames.append(f)
        devices = [d.get("name") for d in rt.table.device_properties if isinstance(d, dict)]
        traces.append(
            {
                "path": str(rt.table.path) if rt.table.path else None,
                "worker": rt.table.worker,
                "rank": rank,
                "mode": rt.mode,
                "events": rt.table.n_events,
                "has_step_markers": rt.has_markers,
                "devices": devices,
                "distributed_info": {k: v for k, v in rt.table.distributed_info.items() if k in ("backend", "rank", "world_size", "nccl_version")},
                "warnings": rt.table.warnings + rt.warnings,
            }
        )
        warnings.extend(rt.table.warnings + rt.warnings)
        if not rt.has_markers:
            notes.append(f"{rt.table.worker}: {NO_MARKERS_NOTE}")
        if not rt.complete.all():
            cut = ", ".join(str(s) for s in rt.steps[~rt.complete])
            notes.append(f"{rt.table.worker}: step {cut} was cut off by the end of profiling; shown but not counted in the verdict")
    frame = pd.concat(frames, ignore_index=True)
    marked = {rank for rt, rank in zip(rank_traces, ranks) if rt.has_markers}
    unmarked = set(ranks) - marked
    if marked and unmarked:
        raise AnalysisError(
            f"rank {min(unmarked)} has no ProfilerStep# markers but rank {min(marked)} has; "
            "steps cannot be matched across ranks, analyze them separately"
        )
    if marked:
        frame = _check_steps(frame, common_steps_only, notes)
    frame = frame.sort_values(["rank", "step"], kind="stable").reset_index(drop=True)

    mode = "gpu" if (frame["mode"] == "gpu").any() else "cpu"
    costs = pd.concat(
        [cost_fractions(frame[frame["mode"] == m], m) for m in ("gpu", "cpu") if (frame["mode"] == m).any()]
    ).loc[frame.index]
    verdict, runner_up = classify(costs)
    frame = pd.concat([frame, costs], axis=1)
    frame["verdict"] = verdict
    frame["runner_up"] = runner_up
    counted = frame["complete"].to_numpy(dtype=bool)
    if not counted.any():  # only cut-off steps: use them rather than nothing
        counted[:] = True
        notes.append("every step was cut off; the verdict uses them anyway")
    rv = run_verdict(frame.loc[counted, "verdict"].to_numpy(), costs.loc[counted], frame.loc[counted, "step_time_us"].to_numpy(), mode)
    details = build_details(rank_traces, ranks, frame.loc[counted], mode)
    tables_by_path = {str(Path(t.path).resolve()): t for t in tables if t.path is not None}
    return Analysis(frame, rv, mode, traces, notes, warnings, dict(run_info or {}), details, tables_by_path)


def analyze(path: str | Path, run_info: dict | None = None) -> Analysis:
    """Analyze a trace file, or a directory of per-rank traces.

    Args:
        path: A ``.json`` / ``.json.gz`` Kineto trace, or a directory searched recursively for
            them (one file per rank, TensorBoard layout ``<worker>[.<span>].pt.trace.json.gz``).
            In a directory, files that turn out not to be traces are skipped with a warning.
        run_info: Metadata of the run when perfscope profiled it (stored in the summary).

    Returns:
        The :class:`Analysis`: ``.steps`` (pandas DataFrame, one row per rank and step),
        ``.verdict`` and ``.summary()``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        TraceFormatError: no trace files, an unreadable or empty trace.
        AnalysisError: ranks disagree on step numbers.
    """
    path = Path(path)
    return analyze_files(find_trace_files(path), run_info, skip_unreadable=path.is_dir())


def analyze_files(
    files: list[Path],
    run_info: dict | None = None,
    *,
    skip_unreadable: bool = False,
    common_steps_only: bool = False,
) -> Analysis:
    """Analyze the given trace files as one run (see :func:`analyze`).

    Args:
        files: Trace files, one or more per rank.
        run_info: Run metadata for the summary.
        skip_unreadable: Skip files that are not readable traces (with a warning) as long as one
            readable trace remains; otherwise such a file is an error.
        common_steps_only: See :func:`analyze_tables`.

    Raises:
        TraceFormatError: an unreadable or empty trace (every one, with ``skip_unreadable``).
        AnalysisError: ranks disagree on step numbers.
    """
    tables, skipped = [], []
    for f in files:
        try:
            raw = read_trace(f)
            with gc_paused():
                table = build_table(raw)
            del raw  # free the parsed JSON before reading the next rank
            if table.n_events == 0:
                raise TraceFormatError(f"{f}: trace holds no events to analyze (empty or metadata only)")
        except TraceFormatError as e:
            if not skip_unreadable:
                raise
            skipped.append(str(e))
            continue
        tables.append(table)
    if not tables:
        raise TraceFormatError(skipped[0] if len(skipped) == 1 else f"no readable trace among {len(files)} files ({skipped[0]}, ...)")
    analysis = analyze_tables(tables, run_info, common_steps_only=common_steps_only)
    analysis.warnings[:0] = [f"skipped {s}" for s in skipped]
    return analysis
