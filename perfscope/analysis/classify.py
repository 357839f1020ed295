"""Bottleneck classification: one verdict per step.

Each step's time is split into four costs, as fractions of its step time (``docs/metrics.md``):

==============  =============================================  ===========================================
class           GPU trace                                      CPU-only trace
==============  =============================================  ===========================================
io              input_wait + exposed_h2d + h2d_wait            dataloader
comm            exposed_comm                                   exposed_comm
launch          launch_wait + kernel_wait                      framework_overhead
compute         compute + exposed_other_mem                    operator
(other)         other_idle                                     (none)
==============  =============================================  ===========================================

The five add up to the step time. ``other`` -- GPU idle with work queued for longer than a launch
takes (waits on another stream's event, synchronisation, staged copies) -- is reported but names no
verdict: no single knob addresses it.

io, comm and launch are *removable*: the right knob takes them out of the step. Compute is the
floor a step cannot go below without faster kernels. The verdict names the removable cause whose
removal saves the most time, provided it costs at least its threshold; when none does, the step is
compute-bound. The runner-up is the next class by cost.

The classes, their columns, thresholds (and where they come from), advice and wording are one
table, :mod:`perfscope.classes`; this module classifies steps with it, and
:mod:`perfscope.analysis.verdict` the run.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfscope.classes import CLASSES, COSTS, THRESHOLDS

VERDICTS = {c: f"{c}-bound" for c in CLASSES}


def cost_fractions(metrics: pd.DataFrame, mode: str) -> pd.DataFrame:
    """Per-step cost of each class as a fraction of step time.

    Args:
        metrics: Per-step metrics (``*_us`` columns) of one mode.
        mode: ``"gpu"`` or ``"cpu"``.

    Returns:
        Columns ``io_cost_frac``, ``comm_cost_frac``, ``launch_cost_frac``, ``compute_cost_frac``
        and ``other_cost_frac`` (0..1, summing to 1 for a step with non-zero time).

    Raises:
        ValueError: unknown mode.
    """
    if mode not in ("gpu", "cpu"):
        raise ValueError(f"mode must be 'gpu' or 'cpu', got {mode!r}")
    table = COSTS[mode]
    step = metrics["step_time_us"].to_numpy(dtype=float)
    safe = np.where(step > 0, step, 1.0)
    return pd.DataFrame(
        {f"{c}_cost_frac": sum((metrics[col].to_numpy(dtype=float) for col in cols), np.zeros(len(step))) / safe for c, cols in table.items()},
        index=metrics.index,
    )


def classify(costs: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Verdict and runner-up per step from :func:`cost_fractions`.

    Returns:
        Two object arrays of verdict strings (``"io-bound"``...), one entry per row; the
        runner-up is None where no class but the verdict's has a share.
    """
    frac = costs[[f"{c}_cost_frac" for c in CLASSES]].to_numpy(dtype=float)
    removable = frac[:, :3]
    thresholds = np.array([THRESHOLDS[c] for c in CLASSES[:3]])
    over = removable >= thresholds
    best_removable = np.argmax(np.where(over, removable, -1.0), axis=1)
    verdict_idx = np.where(over.any(axis=1), best_removable, CLASSES.index("compute"))
    ranked = np.argsort(-frac, axis=1, kind="stable")
    runner_idx = np.where(ranked[:, 0] == verdict_idx, ranked[:, 1], ranked[:, 0])
    names = np.array([VERDICTS[c] for c in CLASSES], dtype=object)
    # no runner-up where no other class has any share (an io-bound step of io alone)
    has_share = frac[np.arange(len(frac)), runner_idx] > 0
    return names[verdict_idx], np.where(has_share, names[runner_idx], None)
