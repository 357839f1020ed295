"""Parameter importances: Optuna's fANOVA share of the value's variance per knob, as horizontal bars."""

from __future__ import annotations

from reports.html import figure, note, num, section, truncate
from reports.palette import BLUE
from reports.sections.tuning_record import obj
from reports.svg import open_svg, rect, text


def entries(record: dict) -> list[tuple[str, float]]:
    """(knob, share) pairs with a finite, non-negative share, largest first."""
    items = [(str(k), num(v)) for k, v in obj(record.get("importances")).items()]
    return sorted(((k, v) for k, v in items if v is not None and v >= 0), key=lambda kv: -kv[1])


def chart(items: list[tuple[str, float]]) -> str:
    left, width, bar_h, gap = 190, 620, 16, 6
    height = 8 + len(items) * (bar_h + gap) + 22
    peak = max((v for _, v in items), default=0.0) or 1.0
    out = [open_svg(left + width + 70, height, "parameter importance per knob")]
    for k, (name, v) in enumerate(items):
        y = 8 + k * (bar_h + gap)
        out.append(text(left - 8, y + bar_h - 4, truncate(name, 28), "end"))
        w = v / peak * width
        out.append(rect(left, y, w, bar_h, BLUE, f"{name}: {100 * v:.1f}% of the explained variance"))
        out.append(text(left + w + 4, y + bar_h - 4, f"{100 * v:.1f}%", "start", "lbl"))
    out.append(f'<line class="axis" x1="{left}" x2="{left}" y1="4" y2="{height - 20}"/>')
    out.append(text(left + width / 2, height - 5, "share of the trial value's variance (fANOVA)", "middle"))
    out.append("</svg>")
    return "".join(out)


def render(record: dict) -> str:
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
