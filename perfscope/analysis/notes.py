"""Words for the steps the verdict leaves out, and for a run with no verdict at all."""

from __future__ import annotations

import pandas as pd

from perfscope.analysis import evidence as ev
from perfscope.analysis.verdict import HOST_CONTENDED_ADVICE, RunVerdict, no_verdict
from perfscope.text import plural

MAX_GROUPS = 12  # notes about left-out steps; beyond, one line says how many more

# What to do when every step was left out, by the status that left out most of them.
NO_VERDICT_ADVICE = {
    ev.INCOMPLETE: "Profile again so that whole steps are recorded: more active steps (--active), a trace file the "
                   "writer finished, and the GPU activity the profiler should record.",
    ev.INITIALISATION: "Profile later in the run, past start-up: raise --skip-first (or the profiler schedule's "
                       "wait/warmup) so that the window holds training steps.",
    ev.HOST_CONTENDED: HOST_CONTENDED_ADVICE,
}
QUEUED_ADVICE = ("Let the GPU catch up before the window opens: perfscope profile waits for it at the window's start; "
                 "with a profiler of your own, end the last warm-up step with torch.cuda.synchronize(), or record more "
                 "active steps so that the window's own work outweighs what came before it.")


def spans(steps) -> str:
    """``[3, 4, 5, 9]`` -> ``"3-5, 9"``."""
    values = sorted(int(s) for s in steps)
    out, start, prev = [], None, None
    for v in values:
        if start is None:
            start = prev = v
        elif v == prev + 1:
            prev = v
        else:
            out.append(f"{start}-{prev}" if prev > start else str(start))
            start = prev = v
    if start is not None:
        out.append(f"{start}-{prev}" if prev > start else str(start))
    return ", ".join(out)


def status_notes(frame: pd.DataFrame) -> list[str]:
    """One note per (worker, status, reason) of the steps not counted in the verdict."""
    left = frame[frame["status"] != ev.OK]
    if left.empty:
        return []
    notes = []
    # Waits for a core differ a little from step to step: one note per worker for all of them, not
    # one per figure (a lengthened window on a busy machine holds tens of such steps).
    contended = left["status"].eq(ev.HOST_CONTENDED)
    if "core_wait_us" in left.columns and contended.sum() > 1:
        for worker, rows in left[contended].groupby("worker", sort=False):
            share = 100 * rows["core_wait_us"] / rows["step_time_us"].where(rows["step_time_us"] > 0)
            if len(rows) < 2 or share.isna().any():
                continue
            notes.append(f"{worker}: {plural(len(rows), 'step')} {spans(rows['step'])} {ev.HOST_CONTENDED} (the "
                         f"training thread waited {share.min():.0f}-{share.max():.0f}% of each step for a core; "
                         "summary.json has each step's figures); not counted in the verdict")
            left = left.drop(rows.index)
    groups = left.groupby(["worker", "status", "status_reason"], sort=False)["step"]
    for (worker, status, reason), steps in groups:
        word = "step" if len(steps) == 1 else "steps"
        notes.append(f"{worker}: {word} {spans(steps)} {status} ({reason}); not counted in the verdict")
    if len(notes) > MAX_GROUPS:
        rest = len(notes) - MAX_GROUPS
        notes = notes[:MAX_GROUPS] + [f"... and {plural(rest, 'more group')} of steps not counted (summary.json lists every step)"]
    return notes


def verdict_of_none(frame: pd.DataFrame, run_reasons: list[str | None]) -> RunVerdict:
    """The run verdict when no step is counted: the reason in one line, and what to do."""
    reasons = [r for r in run_reasons if r]
    counts = frame["status"].value_counts()
    top = str(counts.index[0])
    if reasons:
        reason = reasons[0]
    elif len(counts) == 1 and frame["status_reason"].nunique() == 1:
        reason = f"every step is {top}: {frame['status_reason'].iloc[0]}"
    else:
        parts = ", ".join(f"{plural(int(n), 'step')} {s}" for s, n in counts.items())
        reason = f"no step has the evidence for a verdict ({parts}; the notes give each reason)"
    advice = NO_VERDICT_ADVICE.get(top, NO_VERDICT_ADVICE[ev.INCOMPLETE])
    queued = frame["status_reason"].fillna("").str.contains(ev.QUEUED_MARK, regex=False)
    if top == ev.INCOMPLETE and queued.sum() > len(frame) / 2:
        advice = QUEUED_ADVICE
    return no_verdict(reason, advice)


def provisional_note(rv: RunVerdict, steps: int) -> str:
    """The note that says a verdict is provisional, on how many steps, and how busy the machine was."""
    share = rv.core_wait_share or 0.0
    return (f"provisional verdict: no step had clean evidence; {plural(steps, 'step')} that waited for cores "
            f"({share:.0%} of their time) were classified with that wait taken out (docs/metrics.md, \"Provisional "
            "verdict\"); profile on a quieter machine, or with fewer busy processes, for a verdict without it")


# A counted step this long whose training thread recorded fewer operators than this: the work ran
# where the trace does not show it (another thread or process, a compiled graph, code the profiler
# does not instrument), so the partition of the step rests on little. The case that set the figures:
# 4 operators in a 413 ms step.
SPARSE_OPERATORS = 8
SPARSE_STEP_US = 50_000.0


def sparse_steps_note(frame: pd.DataFrame, operators: pd.Series) -> str | None:
    """A note naming the counted steps of at least :data:`SPARSE_STEP_US` whose training thread
    recorded fewer than :data:`SPARSE_OPERATORS` operators, or None.

    Args:
        frame: The steps (``rank``, ``step``, ``counted``, ``step_time_us``).
        operators: Operators on each step's training thread, indexed like ``frame``.
    """
    sparse = frame["counted"].astype(bool) & (operators < SPARSE_OPERATORS) & (frame["step_time_us"] >= SPARSE_STEP_US)
    if not sparse.any():
        return None
    rows = frame[sparse]
    fewest = int(operators[sparse].min())
    where = "; ".join(f"rank {r}: steps {spans(g['step'])}" for r, g in rows.groupby("rank"))
    return (f"{plural(len(rows), 'counted step')} of {rows['step_time_us'].min() / 1000:.0f} ms or more recorded "
            f"{'almost no' if fewest else 'no'} operators on the training thread (as few as {fewest}; {where}): the "
            "work ran where the trace does not show it (another thread or process, a compiled graph), so the verdict "
            "rests on little evidence; profile with the work on the training thread, or read it as a hint")
