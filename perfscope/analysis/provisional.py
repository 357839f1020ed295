"""A provisional verdict for a run whose every step waited for cores.

A step on a busy machine (``host-contended``, :mod:`perfscope.analysis.evidence`) is not counted:
time the training thread spent runnable but off the CPU stretched whatever part of the step it
fell in, and a starved launch-bound loop can look compute-bound. When *no* step of the run is
``ok``, silence helps nobody, so the contended steps are classified on what the job would need if
it had its cores:

- the wait (:func:`perfscope.analysis.evidence.core_wait_us`) is taken out of the parts of the
  step where the thread works: the framework's own time and the operators' on a CPU trace
  (``framework_overhead``, ``operator``), the host launch gaps on a GPU trace (``launch_wait``,
  ``kernel_wait``), in proportion to their time. Not out of waits for data or collectives: a
  thread blocked on a queue or a socket is asleep, not waiting for a core. The step time loses
  the same amount;
- the steps so adjusted are classified by the ordinary rule (:func:`perfscope.analysis.verdict.run_verdict`),
  and the verdict is labelled *provisional*, with the wait's share of the steps' time beside it.

Its limits: where a wait fell is not recorded, only how long it was, so a run whose thread was
descheduled mostly inside operators and one descheduled mostly between them get the same
adjustment; and removing the wait does not give back the cache a preempted thread lost. A
contention share near or above one half says the machine, not the program, set the pace: the
console says so beside the verdict.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from perfscope.record.schema import Facts
from perfscope.analysis.verdict import CLASSES, COSTS, RunVerdict, classify, cost_fractions, run_verdict
from perfscope.text import plural
from perfscope.steptime import WORK_COLUMNS



def without_core_wait(rows: pd.DataFrame, mode: str) -> pd.DataFrame:
    """``rows`` (per-step metrics with ``core_wait_us``) with each step's wait for a core taken out
    of its work columns (:data:`WORK_COLUMNS`) in proportion, and out of ``step_time_us``;
    ``work_keep`` is the factor the work kept (1 where nothing was taken), for any other work
    measured in the step (an optimizer's range) to be put on the same clock.

    A wait larger than the work columns hold is taken out only up to them. Rows without a known
    wait are returned unchanged.
    """
    out = rows.copy()
    cols = [c for c in WORK_COLUMNS[mode] if c in out.columns]
    work = out[cols].to_numpy(dtype=float).sum(axis=1) if cols else np.zeros(len(out))
    wait = np.nan_to_num(out["core_wait_us"].to_numpy(dtype=float), nan=0.0)
    taken = np.clip(wait, 0.0, work)
    keep = np.where(work > 0, 1.0 - taken / np.where(work > 0, work, 1.0), 1.0)
    for c in cols:
        out[c] = out[c].to_numpy(dtype=float) * keep
    out["step_time_us"] = out["step_time_us"].to_numpy(dtype=float) - taken
    out["work_keep"] = keep
    return out


def waitfree(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` of the analysis frame on the clock of a provisional verdict: each step without its
    waits for a core (:func:`without_core_wait`, by the row's ``mode``) and its class costs
    (``*_cost_frac``) recomputed on that step time, so that every share, what-if and rate derived
    from the rows divides time of one clock by time of the same clock. Rows left without time are
    dropped; the index is kept.
    """
    rows = rows[rows["step_time_us"] > 0]
    parts = [without_core_wait(rows[rows["mode"] == m], m) for m in COSTS if (rows["mode"] == m).any()]
    if not parts:
        return rows.assign(work_keep=1.0)
    adjusted = pd.concat(parts).loc[rows.index]
    adjusted = adjusted[adjusted["step_time_us"] > 0]
    if adjusted.empty:
        return adjusted
    costs = pd.concat([cost_fractions(adjusted[adjusted["mode"] == m], m) for m in COSTS
                       if (adjusted["mode"] == m).any()]).loc[adjusted.index]
    adjusted[list(costs.columns)] = costs
    return adjusted


def provisional_verdict(adjusted: pd.DataFrame, measured: pd.DataFrame, mode: str,
                        facts: Facts | None = None) -> tuple[RunVerdict, pd.Series] | None:
    """The provisional verdict of the analysis frame's steps that waited for cores, with a known
    ``core_wait_us`` (the caller chooses them: ``combine`` in :mod:`perfscope.analysis.run`).

    Args:
        adjusted: Those rows on the verdict's clock, as :func:`waitfree` gives them (computed once
            by the caller, which derives every other figure from them too).
        measured: The same rows as measured (``step_time_us`` and ``core_wait_us``; a superset of
            ``adjusted``'s index), for the waits' share of their wall time.
        mode: ``"gpu"`` or ``"cpu"``.
        facts: As for :func:`perfscope.analysis.verdict.run_verdict`.

    Returns:
        ``(verdict, per-step verdicts)`` -- the run's :class:`RunVerdict` with ``provisional`` set
        and ``core_wait_share`` the waits' share of those steps' wall time, and each classified
        row's verdict (indexed as ``adjusted``) -- or None when no row has a positive step time.
    """
    if adjusted.empty:
        return None
    costs = adjusted[[f"{c}_cost_frac" for c in (*CLASSES, "other")]]
    per_step, _ = classify(costs)
    verdict = run_verdict(per_step, costs, adjusted["step_time_us"].to_numpy(), mode, facts)
    wall = float(measured.loc[adjusted.index, "step_time_us"].sum())
    share = float(measured.loc[adjusted.index, "core_wait_us"].clip(lower=0).sum()) / wall if wall > 0 else 0.0
    verdict = replace(verdict, provisional=True, core_wait_share=min(share, 1.0))
    return verdict, pd.Series(per_step, index=adjusted.index, dtype=object)


# Where intra-op workers waited (perfscope.record.host_steps.workers_waited): what the user can do.
SPIN_ADVICE_LINE = ("Profile with one intra-op thread (torch.set_num_threads(1) or OMP_NUM_THREADS=1): the training "
                    "thread then waits for no worker, and a busy machine gets a provisional verdict; or profile on a "
                    "quieter machine.")


def spin_verdict(adjusted: pd.DataFrame, mode: str, facts: Facts | None = None) -> RunVerdict | None:
    """The provisional verdict at the other end of what the steps' work may be, where intra-op
    workers waited for cores: each step's ``spin_bound_us`` (the most its training thread may have
    spun at the end of parallel operators, CPU time its own wait does not show) taken out of its
    operators and its step time too. None where no step has such a bound (CPU traces only: a GPU
    step's host work is not where its math runs).

    The truth lies between :func:`provisional_verdict` (no spinning taken out) and this (all of it):
    where both name one class, that class stands; where they differ, the trace cannot tell.
    """
    if mode != "cpu" or "spin_bound_us" not in adjusted.columns or "operator_us" not in adjusted.columns:
        return None
    spin = np.nan_to_num(adjusted["spin_bound_us"].to_numpy(dtype=float), nan=0.0)
    if not (spin > 0).any():
        return None
    rows = adjusted.copy()
    operators = rows["operator_us"].to_numpy(dtype=float)
    # spinning is CPU time: the waits taken out left it whole in the operators' time
    taken = np.clip(spin, 0.0, operators)
    rows["operator_us"] = operators - taken
    rows["step_time_us"] = rows["step_time_us"].to_numpy(dtype=float) - taken
    rows = rows[rows["step_time_us"] > 0]
    if rows.empty:
        return None
    costs = cost_fractions(rows, mode)
    per_step, _ = classify(costs)
    return run_verdict(per_step, costs, rows["step_time_us"].to_numpy(), mode, facts)


def spin_reason(verdict: str | None, other: str | None, adjusted: pd.DataFrame) -> str:
    """Why a provisional verdict is withheld where intra-op workers waited (:func:`spin_verdict`)."""
    spun = int((np.nan_to_num(adjusted["spin_bound_us"].to_numpy(dtype=float), nan=0.0) > 0).sum())
    return (f"every step waited for cores, and in {plural(spun, 'step')} the intra-op threads did too, while the "
            f"training thread may have spun for them in CPU time its own wait does not show: without that time "
            f"the steps read {verdict or 'no class'}, with all of it taken out {other or 'no class'}, so the trace "
            "cannot tell which")
