"""What a trial's profiled steps say: its verdict and class shares, its step time and its memory
peak, read from the analysis of the traces the trial wrote (the same analysis as ``perfscope
analyze``), for the trial's user attributes and the tuning record."""

from __future__ import annotations

from perfscope.errors import PerfscopeError
from perfscope.record.view import record_of
from perfscope.tuner.trial import TrialOutcome


def trial_verdict(outcome: TrialOutcome) -> tuple[str | None, dict | None, dict | None]:
    """(verdict, fractions, summary) of a trial's profiled steps, or Nones without a usable trace."""
    if not outcome.trace_files:
        return None, None, None
    from perfscope.analysis.run import analyze_files

    try:
        analysis = analyze_files(outcome.trace_files, run_info={"source": "perfscope tune trial"})
        summary = analysis.summary()
    except (PerfscopeError, ValueError, OSError):
        return None, None, None
    overall = summary["overall"]  # the analysis writes it, verdict and fractions included
    return overall["verdict"], overall["fractions"], summary


def memory_of(summary: dict | None) -> dict | None:
    """The profiled steps' memory peak of a trial (``details.memory``'s run-wide figures: ``kind``,
    ``peak_bytes``, ``capacity_bytes``, ``headroom_share``, ``near_limit``), or None unmeasured."""
    details = record_of(summary).details if summary is not None else None
    m = details.memory if details is not None else None
    if m is None:
        return None
    return {k: getattr(m, k) for k in ("kind", "peak_bytes", "capacity_bytes", "headroom_share", "near_limit")}


def step_time_of(summary: dict | None) -> float | None:
    """The profiled steps' step time (µs, :mod:`perfscope.steptime`) of a trial's summary, or None."""
    overall = record_of(summary).overall if summary is not None else None
    return overall.step_time_us if overall is not None else None
