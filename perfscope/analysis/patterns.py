"""Known fusable patterns in a profile: Swin-style window attention, which ``fused_ops`` replaces.

The pattern, as the main thread's top-level operators show it (times in µs, from the trace):
a matrix product (``q @ k^T``), the relative-position bias gathered from its table
(``aten::index``), one or two adds (bias, shift mask), ``aten::softmax``, and a matrix product
(``@ v``) -- the textbook formulation of timm's, torchvision's (which gathers the bias before the
first product) and this project's ``WindowAttention``. An attention without the gathered bias (a
plain transformer) is not this pattern. The operator names cannot tell window attention from a
global attention with a relative-position bias (BEiT): there the advice is wrong, ``fused_ops.find``
lists no module, and the tuner does not search the knob (it needs the modules in the run's facts).

The estimate. The fused operator still runs the two matrix products; what it removes is
everything else of the pattern (the gather, the adds, the scaling, the softmax as separate passes,
and on a GPU their kernel launches). On a CPU it also runs both products at the speed of the
faster one (they have the same number of multiply-adds; ``@ v`` after Swin's shift mask reads
subnormal probabilities, which x86 cores process about 30x slower), so the products are kept at
twice the faster one's time; on a GPU, the GEMM kernels' time is kept. The forward is measured;
the backward of these operators is not attributable in a trace, and the time it saves is taken as :data:`BACKWARD_FACTOR` times the
forward's: the backward has the four products (kept) and the softmax gradient and bias reduction,
which the fused backward still runs in fewer passes. With 1, the estimate on ``examples/swin.py``
(1.4x–1.5x) sat at the top of the measured end-to-end gains (1.2x–1.5x); 2 (the backward's usual
share of a step) overstated them (1.9x). Per step:
``removable = (1 + BACKWARD_FACTOR) * (pattern time - its matrix products' time)``, and the what-if
removes it from every rank's step, then takes the run's step time (:func:`perfscope.steptime.what_if`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfscope.analysis.what_ifs import pattern_removal
from perfscope.trace.kinds import EventKind

if TYPE_CHECKING:
    from perfscope.analysis.rank_trace import RankTrace

MATMULS = frozenset({"aten::matmul", "aten::bmm", "aten::baddbmm", "aten::mm"})
GATHERS = frozenset({"aten::index"})
ADDS = frozenset({"aten::add", "aten::add_"})
SOFTMAXES = frozenset({"aten::softmax", "aten::_softmax"})
LOOK_BACK = 64  # top-level ops before the softmax searched (torchvision builds its shift mask in between)
SCALES = frozenset({"aten::mul", "aten::div"})  # q * scale, just before the first product
BACKWARD_FACTOR = 1.0
MIN_SHARE = 0.05  # below 5% of the step, the advice does not mention it
GEMM_KERNEL_WORDS = ("gemm", "matmul", "cutlass", "bmm")


def match_spans(names: np.ndarray) -> list[tuple[int, int, list[int]]]:
    """The pattern's occurrences in a sequence of top-level operator names.

    Args:
        names: ``(n,)`` operator names in call order.

    Returns:
        ``(first, last, products)`` per occurrence: positions of its first and last operator and
        of its two matrix products.
    """
    out = []
    for i in np.flatnonzero(np.isin(names, list(SOFTMAXES))):
        after = _find(names, range(i + 1, min(i + 3, len(names))), MATMULS)
        # The nearest product before the softmax that has the gather and an add after it.
        first = _find(names, range(i - 1, max(-1, i - LOOK_BACK - 1), -1), MATMULS)
        if after is None or first is None or (out and first <= out[-1][1]):
            continue
        if _adds_a_gathered_bias(names, first, i):
            scale = _find(names, range(first - 1, max(-1, first - 3), -1), SCALES)
            out.append((first if scale is None else scale, after, [first, after]))
    return out


def _adds_a_gathered_bias(names: np.ndarray, first: int, softmax: int) -> bool:
    """An index gather shortly before the softmax and an add between the first product and it.
    The gather may come before the first product (torchvision gathers the bias first)."""
    return (any(n in GATHERS for n in names[max(0, softmax - LOOK_BACK):softmax])
            and any(n in ADDS for n in names[first + 1:softmax]))


def _find(names: np.ndarray, positions: range, wanted: frozenset) -> int | None:
    """The first of ``positions`` whose operator is one of ``wanted``, or None."""
    return next((j for j in positions if names[j] in wanted), None)


def _step_costs(rt: RankTrace, rows: np.ndarray, step_of_row: np.ndarray) -> pd.DataFrame:
    """Per step: occurrences, forward time of the pattern and of its products (µs)."""
    t = rt.table
    spans = match_spans(t.name_of(rows))
    if rt.mode != "cpu" and spans:  # kernels by launch time, once: each span is then a slice
        linked = rt.launches.linked()
        kernels = linked[t.kind[linked] == EventKind.KERNEL]
        kernels = kernels[np.argsort(rt.launches.start_of(kernels), kind="stable")]
        launched = rt.launches.start_of(kernels)
        names = pd.Series(t.name_of(kernels), dtype=object).str.lower()
        is_gemm = names.str.contains("|".join(GEMM_KERNEL_WORDS), regex=True).to_numpy(dtype=bool)
    records = []
    for first, last, products in spans:
        start, end = t.ts_ns[rows[first]], t.end_of(rows[last])
        if rt.mode == "cpu":
            # Both products have N * N * d multiply-adds per window and head; the fused operator
            # runs both at the faster one's speed (the slower one is held back by what the fused
            # operator removes: subnormal probabilities after a shift mask, a strided operand).
            total = (end - start) / 1000.0
            kept = 2 * min(int(t.dur_ns[rows[p]]) for p in products) / 1000.0  # int: no int32 overflow
        else:  # the kernels launched from inside the span
            lo, hi = np.searchsorted(launched, start, "left"), np.searchsorted(launched, end, "right")
            dur = t.dur_ns[kernels[lo:hi]]
            total = dur.sum() / 1000.0
            kept = dur[is_gemm[lo:hi]].sum() / 1000.0
        records.append({"step": int(step_of_row[first]), "total_us": float(total), "kept_us": float(kept)})
    if not records:
        return pd.DataFrame(columns=["step", "calls", "forward_us", "removable_us"])
    df = pd.DataFrame(records)
    g = df.groupby("step")
    return pd.DataFrame({"calls": g.size(), "forward_us": g["total_us"].sum(),
                         "removable_us": (1 + BACKWARD_FACTOR) * (g["total_us"].sum() - g["kept_us"].sum())}
                        ).reset_index()


def window_attention_cost(rank_traces: list[RankTrace], ranks: list[int], frame: pd.DataFrame) -> dict | None:
    """The window-attention pattern over the counted steps, with its what-if (module docstring).

    Args:
        rank_traces, ranks: The analyzed traces and their ranks.
        frame: The counted steps (``rank``, ``worker``, ``step``, ``step_time_us``).

    Returns:
        None when no counted step holds the pattern; else ``calls_per_step`` (median),
        ``forward_us_per_step`` and ``removable_us_per_step`` (medians, µs), ``share`` (removable
        time over step time, all counted steps), ``step_time_us``, ``step_time_without_us`` (the
        run's step time now and without the removable time, :mod:`perfscope.steptime`),
        ``speedup``, and ``backward_factor``.
    """
    from perfscope.analysis.operators import top_level_ops

    parts = []
    for rt, rank in zip(rank_traces, ranks):
        mine = frame[(frame["rank"] == rank) & (frame["worker"] == rt.table.worker)]
        if mine.empty:
            continue
        w = rt.windows
        sel = np.flatnonzero(np.isin(w.step, mine["step"].to_numpy()))
        rows = top_level_ops(rt, w.start[sel], w.end[sel])
        owner = np.searchsorted(w.start[sel], rt.table.ts_ns[rows], side="right") - 1
        costs = _step_costs(rt, rows, w.step[sel][np.clip(owner, 0, None)])
        part = mine[["rank", "step", "step_time_us"]].merge(costs, on="step", how="left").fillna(0.0)
        if rt.mode == "cpu" and "work_keep" in mine.columns:  # host time: on the verdict's clock (optimizer_step)
            part["removable_us"] *= mine["work_keep"].to_numpy(dtype=float)
        parts.append(part)
    found = pattern_removal(parts, "calls", "removable_us")
    if found is None:
        return None
    df, removable, what_if = found
    return {"pattern": "window_attention", "calls_per_step": float(df["calls"].median()),
            "forward_us_per_step": float(df["forward_us"].median()),
            "removable_us_per_step": float(np.median(removable)), **what_if, "backward_factor": BACKWARD_FACTOR}


def advice_line(cost: dict | None) -> str | None:
    """The advice sentence for :func:`window_attention_cost`'s result, or None when the pattern
    is absent or takes less than :data:`MIN_SHARE` of the step."""
    if not cost or cost.get("share", 0.0) < MIN_SHARE:
        return None
    now, without = cost["step_time_us"] / 1000.0, cost["step_time_without_us"] / 1000.0
    gain = f" (about {cost['speedup']:.2f}x)" if cost.get("speedup") else ""
    return (f"Fuse the window attention: the profile shows Swin-style window attention "
            f"({cost['calls_per_step']:g} calls a step; its passes besides the matrix products take about "
            f"{cost['share']:.0%} of the step, backward estimated). Set fused_ops: true in a --config file "
            f"(or call fused_ops.swap(model)): estimated step time {now:.1f} ms -> {without:.1f} ms{gain}.")
