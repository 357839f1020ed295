"""Parameter importances: Optuna's fANOVA share of the value's variance per knob, as horizontal bars."""

from __future__ import annotations

from perfscope.record.tune_schema import TuneRecord
from perfscope.reports.html import figure, note, num, section, truncate
from perfscope.reports.palette import BLUE
from perfscope.reports.plots import hbars


def entries(record: TuneRecord) -> list[tuple[str, float]]:
    """(knob, share) pairs with a finite, non-negative share, largest first."""
    items = [(str(k), num(v)) for k, v in (record.importances or {}).items()]
    return sorted(((k, v) for k, v in items if v is not None and v >= 0), key=lambda kv: -kv[1])


def chart(items: list[tuple[str, float]]) -> str:
    rows = [{"label": truncate(name, 28), "end": f"{100 * v:.1f}%",
             "segments": [(v, BLUE, f"{name}: {100 * v:.1f}% of the explained variance", "")]} for name, v in items]
    return hbars("importances", rows, "parameter importance per knob",
                 "share of the trial value's variance (fANOVA)", left=190, right=70, bar_h=16, gap=6, percent=True)


def render(record: TuneRecord) -> str:
    title = "Parameter importances"
    items = entries(record)
    if not items:
        return section("importances", title, note(
            "Not available: no importances in the record (they need at least three complete trials that "
            "differ in their knobs)."))
    return section("importances", title, figure(chart(items), (
        "How much of the variation of the trial value each knob explains (Optuna's fANOVA over the complete "
        "trials, runs that failed counted at 0; the shares add up to 100%). A large share says the knob matters, not which value "
        "is best: the trial table shows that.")))
