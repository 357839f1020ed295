"""What a trial's profiled steps say: its verdict and class shares (and the baseline's verdict in
words), its step time and its memory peak, read from the analysis of the traces the trial wrote (the same analysis as ``perfscope
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


def verdict_text(verdict: str | None, summary: dict | None, outcome=None) -> str:
    """The baseline's verdict in words: provisional where it is, and why there is none.

    Args:
        verdict, summary: The baseline's verdict and summary record (None: no trace analysed).
        outcome: The baseline's :class:`~perfscope.tuner.trial.TrialOutcome`: when it wrote no
            trace because the script ended before its profiled steps, the words say so.
    """
    if summary is None:
        return _unknown_text(outcome)
    overall = record_of(summary).overall_or_empty()
    if verdict is None:
        return f"none ({overall.reason or 'no step could be classified'}; every applicable knob is searched)"
    if overall.provisional is True:
        return (f"{verdict}, provisional (busy host: {100 * (overall.core_wait_share or 0.0):.0f}% of the "
                "profiled steps waiting for a core)")
    return verdict


def _unknown_text(outcome) -> str:
    """Why the baseline has no verdict when no trace was analysed: the script ended before its
    profiled steps (no trace written), or the trace could not be read."""
    if outcome is not None and not outcome.trace_files:
        ran = len(outcome.losses) if outcome.losses else None
        more = f" (it ran {ran} steps; try `-- --steps {2 * ran}`)" if ran else ""
        return ("unknown (the script ended before its profiled steps: let it run longer, its arguments after --"
                f"{more}; every applicable knob is searched)")
    return "unknown (the profiled steps' trace could not be read: every applicable knob is searched)"
