"""The short per-step table and verdict printed to the terminal after an analysis."""

from __future__ import annotations

from perfscope.analysis.verdict import CLASSES

MAX_ROWS = 24  # beyond this the table shows the first and last steps only
# The cost columns add up to 100% of each step; "other" (GPU idle on dependencies) is GPU-only.
COST_COLUMNS = {"gpu": (*CLASSES, "other"), "cpu": CLASSES}


def _row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.rjust(w) if i < len(cells) - 1 else c for i, (c, w) in enumerate(zip(cells, widths)))


def format_summary(summary: dict) -> str:
    """Plain-text rendering of a summary record: per-step table, verdict, advice.

    Times are shown in milliseconds and class costs as percentages of step time.
    """
    costs = COST_COLUMNS[summary.get("mode", "gpu")]
    head = ["rank", "step", "step ms"] + [f"{c} %" for c in costs] + ["verdict"]
    rows = []
    for s in summary["steps"]:
        step = f"{s['step']}" + ("" if s["complete"] else "*")
        rows.append(
            [str(s["rank"]), step, f"{s['step_time_us'] / 1000:.2f}"]
            + [f"{100 * s[f'{c}_cost_frac']:.1f}" for c in costs]
            + [s["verdict"]]
        )
    if len(rows) > MAX_ROWS:
        half = MAX_ROWS // 2
        rows = rows[:half] + [["..."] + [""] * (len(head) - 1)] + rows[-half:]
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    lines = [_row(head, widths)] + [_row(r, widths) for r in rows]
    o = summary["overall"]
    if any(not s["complete"] for s in summary["steps"]):
        lines.append("(* step cut off by the end of profiling, not counted in the verdict)")
    fr = ", ".join(f"{c} {100 * o['fractions'][c]:.0f}%" for c in costs)
    lines += [
        "(% of each step: io, comm and launch are the removable causes"
        + ("; other is GPU idle time spent waiting on dependencies)" if summary.get("mode") == "gpu" else ")"),
        "",
        f"verdict: {o['verdict']} (runner-up {o['runner_up']}; share of step time: {fr}; "
        f"mean step {o['mean_step_time_us'] / 1000:.2f} ms)",
        f"advice: {o['advice']}",
    ]
    lines += [f"note: {n}" for n in summary.get("notes", [])]
    lines += [f"warning: {w}" for w in summary.get("warnings", [])]
    return "\n".join(lines)
