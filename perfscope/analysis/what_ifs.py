"""What-ifs of two GPU knobs, from the trace: CUDA graphs for launch waits, channels-last for layout
transposes. Times are µs, from the trace.

**CUDA graphs** (``compile: reduce-overhead``) replay a whole step's kernels with one launch, so the
GPU no longer waits for the host between kernels: the step's launch cost (the ``launch`` class's
parts, ``launch_wait_us`` and ``kernel_wait_us``) is what they can remove at best
(:func:`graphs_cost`, from the same per-step cost shares as the verdict).

**Layout transposes.** On NCHW (PyTorch's default, "contiguous") tensors cuDNN's Tensor Core
convolutions reorder their inputs and outputs to NHWC and back, in kernels named
``nchwToNhwcKernel`` and ``nhwcToNchwKernel``; with the model and its images channels-last
(``channels_last: true``) those kernels go. Their GPU time within the verdict's steps is the
removable part (:func:`transpose_cost`): a bound, since on a busy stream other kernels may not
close the gap at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfscope import steptime
from perfscope.analysis.intervals import locate
from perfscope.trace.kinds import EventKind

if TYPE_CHECKING:
    from perfscope.analysis.rank_trace import RankTrace

TRANSPOSE_KERNELS = r"nchwtonhwc|nhwctonchw"
MIN_SHARE = 0.03  # below 3% of the step the advice does not mention the transposes
MIN_GRAPHS_SHARE = 0.05  # nor CUDA graphs below 5% of launch waits (a knob with a compile cost)


def removal(steps: pd.DataFrame, removable_us: np.ndarray) -> tuple[np.ndarray, dict]:
    """A part of each step that a knob could remove, as the run's step time with and without it.

    Args:
        steps: The verdict's steps: ``rank``, ``step``, ``step_time_us`` (one row each).
        removable_us: ``(len(steps),)`` µs of each step the knob could remove.

    Returns:
        ``(removable, what_if)``: the removable µs clipped to each step's time, and ``share`` (the
        removable time over the steps' time), ``step_time_us`` and ``step_time_without_us`` (the
        run's step time now and without it, :mod:`perfscope.steptime`) and ``speedup`` (a bound:
        nothing else takes the removed time's place).
    """
    step = steps["step_time_us"].to_numpy(dtype=float)
    removable = np.minimum(np.asarray(removable_us, dtype=float), step)
    rows = steps[["rank", "step", "step_time_us"]].assign(
        removed_cost_frac=np.divide(removable, step, out=np.zeros_like(step), where=step > 0)).to_dict("records")
    now, without = steptime.step_time_us(rows), steptime.step_time_us(rows, cost="removed")
    return removable, {"share": float(removable.sum() / step.sum()) if step.sum() > 0 else 0.0,
                       "step_time_us": now, "step_time_without_us": without, "speedup": steptime.speedup(now, without)}


def pattern_removal(parts: list[pd.DataFrame], count: str,
                    removable: str) -> tuple[pd.DataFrame, np.ndarray, dict] | None:
    """A pattern's steps over ranks and what removing it would leave.

    Args:
        parts: Each rank's verdict steps (``rank``, ``step``, ``step_time_us``) with the pattern's
            ``count`` per step and its ``removable`` µs per step.

    Returns:
        ``(steps, removable µs per step, what-if)`` as :func:`removal`'s, or None where there are
        no steps or none holds the pattern.
    """
    if not parts:
        return None
    df = pd.concat(parts, ignore_index=True)
    if not (df[count] > 0).any():
        return None
    spent, what_if = removal(df, df[removable].to_numpy())
    return df, spent, what_if


def graphs_cost(frame: pd.DataFrame) -> dict | None:
    """The CUDA-graphs what-if over the verdict's steps (``frame``: their rows with the classes'
    ``*_cost_frac`` shares): ``share`` (the launch cost over step time), ``step_time_us`` and
    ``step_time_without_us`` (the run's step time now and without it) and ``speedup``; None
    without a launch cost or a GPU step."""
    if frame.empty or "launch_cost_frac" not in frame.columns or not (frame["mode"] == "gpu").any():
        return None
    rows = frame[frame["mode"] == "gpu"].to_dict("records")
    now, without = steptime.step_time_us(rows), steptime.step_time_us(rows, cost="launch")
    if not now or not without or without >= now:  # no launch cost, or nothing but launch waits
        return None
    return {"share": 1.0 - without / now, "step_time_us": now, "step_time_without_us": without,
            "speedup": steptime.speedup(now, without)}


def transpose_cost(rank_traces: list[RankTrace], ranks: list[int], frame: pd.DataFrame) -> dict | None:
    """cuDNN's layout transposes over the verdict's steps (module docstring).

    Args:
        rank_traces, ranks: The analyzed traces and their ranks.
        frame: The verdict's steps (``rank``, ``worker``, ``step``, ``step_time_us``).

    Returns:
        None when no such kernel ran in them; else ``kernels_per_step`` (mean),
        ``transpose_us_per_step`` (mean GPU time), ``share`` (of step time), ``step_time_us``,
        ``step_time_without_us`` and ``speedup`` (the bound).
    """
    records = []
    for rt, rank in zip(rank_traces, ranks):
        if rt.mode == "cpu":
            continue
        mine = frame[(frame["rank"] == rank) & (frame["worker"] == rt.table.worker)]
        if mine.empty:
            continue
        t, w = rt.table, rt.windows
        sel = np.flatnonzero(np.isin(w.step, mine["step"].to_numpy()))
        order = sel[np.argsort(w.start[sel], kind="stable")]
        flag = t.name_flag(lambda names: pd.Series(names, dtype=object).str.contains(
            TRANSPOSE_KERNELS, case=False, regex=True).fillna(False))
        kernels = np.flatnonzero((t.kind == EventKind.KERNEL) & flag)
        owner = locate(t.ts_ns[kernels], w.start[order], w.end[order])
        inside = owner >= 0
        spent = pd.Series(t.dur_ns[kernels[inside]] / 1000.0).groupby(w.step[order][owner[inside]]).agg(["sum", "size"])
        part = mine[["rank", "step", "step_time_us"]].merge(
            spent.rename(columns={"sum": "transpose_us", "size": "kernels"}), left_on="step", right_index=True,
            how="left").fillna({"transpose_us": 0.0, "kernels": 0})
        records.append(part)
    found = pattern_removal(records, "kernels", "transpose_us")
    if found is None:
        return None
    df, spent, what_if = found
    if not what_if["step_time_us"] or not what_if["step_time_without_us"]:
        return None
    return {"kernels_per_step": float(df["kernels"].mean()), "transpose_us_per_step": float(spent.mean()), **what_if}


def graphs_line(cost: dict | None, cuda_graphs: bool) -> str | None:
    """The CUDA-graphs sentence of the GPU launch advice (None for a run that replays graphs
    already, or whose launch waits are under :data:`MIN_GRAPHS_SHARE` of the step)."""
    if not cost or cuda_graphs or cost.get("share", 0.0) < MIN_GRAPHS_SHARE:
        return None
    now, without = cost["step_time_us"] / 1000.0, cost["step_time_without_us"] / 1000.0
    return (f"Capture the step in CUDA graphs: the GPU waits for the host's launches for {cost['share']:.0%} of the "
            f"step. Set compile: reduce-overhead in a --config file (torch.compile with CUDA graphs): step time "
            f"{now:.1f} ms -> at best {without:.1f} ms, about {cost['speedup']:.2f}x (every launch wait gone).")


def transpose_line(cost: dict | None) -> str | None:
    """The channels-last sentence of the compute advice (None below :data:`MIN_SHARE`)."""
    if not cost or cost.get("share", 0.0) < MIN_SHARE:
        return None
    now, without = cost["step_time_us"] / 1000.0, cost["step_time_without_us"] / 1000.0
    return (f"Store the convolutions channels-last: cuDNN spent {cost['share']:.0%} of the step reordering NCHW "
            f"tensors to NHWC and back ({cost['kernels_per_step']:.0f} transpose kernels a step). Set channels_last: "
            f"true in a --config file (or model.to(memory_format=torch.channels_last) and the same for the images): "
            f"step time {now:.1f} ms -> at best {without:.1f} ms, about {cost['speedup']:.2f}x.")
