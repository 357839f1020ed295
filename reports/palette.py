"""Colours and the groups of the step partition the charts draw.

The colours are the Okabe-Ito palette, distinguishable with the common forms of colour blindness.
A part keeps its colour everywhere: in the evidence bar, the per-step bars, the timeline.
"""

from __future__ import annotations

from perfscope.classes import CHART_ORDER, OTHER, TABLE

ORANGE = "#E69F00"
SKY = "#56B4E9"
GREEN = "#009E73"
YELLOW = "#F0E442"
BLUE = "#0072B2"
VERMILLION = "#D55E00"
PURPLE = "#CC79A7"
GREY = "#999999"
DARK = "#4D4D4D"

# The run's classes (docs/metrics.md, Classification).
NAMED = {"orange": ORANGE, "sky": SKY, "green": GREEN, "yellow": YELLOW, "blue": BLUE, "vermillion": VERMILLION,
         "purple": PURPLE, "grey": GREY, "dark": DARK}
CLASS_COLOURS = {c.name: NAMED[c.colour] for c in (*TABLE, OTHER)}
CLASS_ORDER = CHART_ORDER

# Per-step partition, grouped for the stacked bars: (key, label, colour, summary columns).
# Each mode's groups add up to the step time (docs/metrics.md).
GPU_PARTS = (
    ("compute", "compute", GREEN, ("compute_us",)),
    ("other_mem", "other copies / memset", BLUE, ("exposed_other_mem_us",)),
    ("comm", "exposed communication", PURPLE, ("exposed_comm_us",)),
    ("h2d", "exposed H2D copy + H2D wait", VERMILLION, ("exposed_h2d_us", "h2d_wait_us")),
    ("input", "input wait", ORANGE, ("input_wait_us",)),
    ("launch", "launch wait", SKY, ("launch_wait_us",)),
    # its own colour: a kernel waiting behind the one before it is not the host being slow to launch
    ("kernel_wait", "kernel wait", YELLOW, ("kernel_wait_us",)),
    ("other_idle", "other idle", GREY, ("other_idle_us",)),
)
CPU_PARTS = (
    ("operators", "operators", GREEN, ("operator_us",)),
    ("comm", "exposed communication", PURPLE, ("exposed_comm_us",)),
    ("dataloader", "DataLoader", ORANGE, ("dataloader_us",)),
    ("overhead", "framework overhead", SKY, ("framework_overhead_us",)),
)


def _with_class(groups, mode: str):
    """The groups with their class in the label (``DataLoader (io)``), as the verdict bar names
    them; the class of a part is where ``perfscope.analysis.verdict.COSTS`` counts its columns."""
    from perfscope.analysis.verdict import COSTS

    costs = COSTS[mode]
    out = []
    for key, label, colour, cols in groups:
        cls = next((c for c, owned in costs.items() if set(cols) <= set(owned)), None)
        out.append((key, f"{label} ({cls})" if cls and cls != label else label, colour, cols))
    return tuple(out)


def parts(mode: str):
    """The stacked-bar groups of a mode's step partition, each label naming its class."""
    return _with_class(GPU_PARTS, "gpu") if mode == "gpu" else _with_class(CPU_PARTS, "cpu")


def part_us(step: dict, columns) -> float:
    """Sum of a step's ``columns`` (microseconds); missing or null values count as 0."""
    total = 0.0
    for c in columns:
        v = step.get(c)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v:
            total += float(v)
    return total
