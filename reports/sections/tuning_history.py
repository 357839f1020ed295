"""The trial history chart: each trial's value by trial number, one marker per outcome, the baseline
as a reference line and the best feasible value so far as a step line.

Markers are ``<g class="mk mk-OUTCOME">`` groups with a ``<title>`` (the browser's tooltip), so a
test counts them and a reader hovers them. Pruned trials sit at the last throughput so far they
reported (``tuning_record.last_value``; not drawn without one); infeasible trials sit on the x axis
at 0, whatever value the study stored for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from reports.html import esc, num, truncate
from reports.palette import BLUE, DARK, GREEN, ORANGE, VERMILLION
from reports.sections.tuning_record import (
    INFEASIBLE,
    amount,
    changes_text,
    failure_text,
    last_value,
    obj,
    outcome,
    same_trial,
    trials,
    unit,
    word,
)
from reports.svg import nice_ticks, open_svg, text, y_axis

LEFT, RIGHT, TOP, BOTTOM = 64, 96, 12, 44
WIDTH, HEIGHT = 900, 320
MAX_X_LABELS = 20

# outcome -> legend label
LABELS = {
    "complete": "complete (feasible)",
    "pruned": "pruned (at the last throughput so far it reported)",
    INFEASIBLE: "infeasible (failed, out of memory, timeout, unsafe): on the x axis",
}


@dataclass(frozen=True)
class Point:
    number: float
    value: float
    outcome: str
    tip: str


def points(record: dict) -> tuple[list[Point], list[dict]]:
    """(the markers drawn, the trials not drawn: running, unnumbered, or without a value)."""
    u = unit(record)
    drawn, skipped = [], []
    for t in trials(record):
        n, kind = num(t.get("number")), outcome(t)
        role = word(t.get("role"), "")
        head = f"trial {word(t.get('number'))}" + (f" ({role})" if role else "")
        config = changes_text(t.get("config"), "your settings" if role == "baseline" else "no change")
        if n is None or kind == "running":
            skipped.append(t)
        elif kind == INFEASIBLE:
            reason = failure_text(t) or "infeasible"
            drawn.append(Point(n, 0.0, kind, truncate(f"{head}: {reason} · {config}", 400)))
        elif kind == "pruned":
            v = last_value(t)
            if v is None:
                skipped.append(t)
            else:
                drawn.append(Point(n, v, kind, truncate(f"{head}: pruned at {amount(v)} {u} · {config}", 400)))
        else:
            v = num(t.get("value"))
            if v is None:
                skipped.append(t)
            else:
                drawn.append(Point(n, v, kind, truncate(f"{head}: {amount(v)} {u} · {config}", 400)))
    return drawn, skipped


def best_so_far(drawn: list[Point]) -> list[tuple[float, float]]:
    """(trial number, best complete value up to it) at each trial that raised it."""
    out, best = [], None
    for p in sorted(drawn, key=lambda p: p.number):
        if p.outcome == "complete" and (best is None or p.value > best):
            best = p.value
            out.append((p.number, best))
    return out


def shape(kind: str, x: float, y: float) -> str:
    """A marker's shape centred at ``x``, ``y``."""
    if kind == "complete":
        out = f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="{BLUE}" stroke="#fff" stroke-width="1"/>'
    elif kind == "pruned":
        out = (f'<path d="M{x:.1f},{y - 5.5:.1f} L{x + 5:.1f},{y + 3.5:.1f} L{x - 5:.1f},{y + 3.5:.1f} Z" '
               f'fill="#fff" stroke="{ORANGE}" stroke-width="2"/>')
    else:
        d = 4.5
        out = (f'<rect x="{x - d:.1f}" y="{y - d:.1f}" width="{2 * d:.1f}" height="{2 * d:.1f}" fill="#fff" fill-opacity="0.01"/>'
               f'<path d="M{x - d:.1f},{y - d:.1f} L{x + d:.1f},{y + d:.1f} M{x - d:.1f},{y + d:.1f} L{x + d:.1f},{y - d:.1f}" '
               f'stroke="{VERMILLION}" stroke-width="2.5" stroke-linecap="round"/>')
    return out


def marker(kind: str, x: float, y: float, tip: str) -> str:
    """One marker: its shape inside a group titled ``tip`` (the tooltip)."""
    return f'<g class="mk mk-{kind}"><title>{esc(tip)}</title>{shape(kind, x, y)}</g>'


def key(kind: str) -> str:
    """A legend entry with the marker's own shape."""
    return (f'<span><svg class="key" viewBox="0 0 14 14" width="14" height="14" aria-hidden="true">'
            f'{shape(kind, 7, 7)}</svg>{esc(LABELS[kind])}</span>')


def line_key(cls: str, colour: str, label: str) -> str:
    return (f'<span><svg class="key" viewBox="0 0 22 14" width="22" height="14" aria-hidden="true">'
            f'<line class="{cls}" x1="1" x2="21" y1="7" y2="7" stroke="{colour}"/></svg>{esc(label)}</span>')


def _x_ticks(lo: float, hi: float) -> list[int]:
    lo_i, hi_i = math.floor(lo), math.ceil(hi)
    span = hi_i - lo_i
    if span <= MAX_X_LABELS:
        return list(range(lo_i, hi_i + 1))
    step = max(1, int(nice_ticks(span, 10)[1]))
    return [v for v in range(lo_i - lo_i % step, hi_i + 1, step) if v >= lo_i]


def chart(record: dict, recommended=None) -> tuple[str, str]:
    """(the SVG, its legend), or two empty strings when nothing can be drawn."""
    drawn, _ = points(record)
    if not drawn:
        return "", ""
    u = unit(record)
    base_value = num(obj(record.get("baseline")).get("value"))
    x_lo, x_hi = min(p.number for p in drawn), max(p.number for p in drawn)
    x_lo, x_hi = min(x_lo, 0.0), max(x_hi, x_lo + 1)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    ticks = nice_ticks(1.05 * max([p.value for p in drawn] + [base_value or 0.0]))  # headroom for the markers
    scale = plot_h / ticks[-1] if ticks[-1] > 0 else 0.0

    def x_of(n: float) -> float:
        return LEFT + (n - x_lo + 0.5) / (x_hi - x_lo + 1) * plot_w

    def y_of(v: float) -> float:
        return TOP + plot_h - max(v, 0.0) * scale

    out = [open_svg(WIDTH, HEIGHT, f"trial value ({u}) by trial number")]
    out += y_axis(LEFT, WIDTH - RIGHT, y_of, ticks, f"trial value ({u})", TOP, TOP + plot_h)
    for n in _x_ticks(x_lo, x_hi):
        x = x_of(n)
        out.append(f'<line class="axis" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP + plot_h:.1f}" y2="{TOP + plot_h + 4:.1f}"/>')
        out.append(text(x, TOP + plot_h + 15, str(n), "middle"))
    out.append(text(LEFT + plot_w / 2, HEIGHT - 8, "trial number", "middle"))
    if base_value is not None:
        y = y_of(base_value)
        out.append(f'<line class="ref" x1="{LEFT:.1f}" x2="{WIDTH - RIGHT:.1f}" y1="{y:.1f}" y2="{y:.1f}" stroke="{DARK}">'
                   f"<title>{esc(f'baseline: {amount(base_value)} {u}')}</title></line>")
        out.append(text(WIDTH - RIGHT + 4, y + 4, f"baseline {amount(base_value)}", "start", "lbl"))
    steps = best_so_far(drawn)
    if steps:
        pts, prev = [], None
        for n, v in steps:
            if prev is not None:
                pts.append((x_of(n), y_of(prev)))
            pts.append((x_of(n), y_of(v)))
            prev = v
        pts.append((x_of(x_hi) + plot_w / (x_hi - x_lo + 1) / 2, y_of(prev)))
        out.append(f'<polyline class="bestline" stroke="{GREEN}" points="'
                   + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts) + '"/>')
        yb = y_of(prev)
        if base_value is None or abs(yb - y_of(base_value)) > 12:
            out.append(text(WIDTH - RIGHT + 4, yb + 4, f"best {amount(prev)}", "start", "lbl"))
        elif prev != base_value:  # close to the baseline's label: put it below or above that one
            out.append(text(WIDTH - RIGHT + 4, yb + (16 if prev < base_value else -8), f"best {amount(prev)}", "start", "lbl"))
    for p in drawn:
        x, y = x_of(p.number), y_of(p.value)
        if recommended is not None and same_trial(p.number, recommended):
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="9" fill="none" stroke="{DARK}" stroke-width="1.5">'
                       f"<title>{esc(f'trial {tick(p.number)}: recommended')}</title></circle>")
        out.append(marker(p.outcome, x, y, p.tip))
    out.append("</svg>")
    kinds = [k for k in ("complete", "pruned", INFEASIBLE) if any(p.outcome == k for p in drawn)]
    keys = [key(k) for k in kinds]
    if base_value is not None:
        keys.append(line_key("ref", DARK, "baseline"))
    if steps:
        keys.append(line_key("bestline", GREEN, "best feasible value so far"))
    if recommended is not None and any(same_trial(p.number, recommended) for p in drawn):
        keys.append('<span><svg class="key" viewBox="0 0 22 22" width="14" height="14" aria-hidden="true">'
                    f'<circle cx="11" cy="11" r="9" fill="none" stroke="{DARK}" stroke-width="2"/></svg>recommended</span>')
    return "".join(out), '<div class="legend">' + "".join(keys) + "</div>"


def tick(n: float) -> str:
    return f"{n:.0f}" if n == int(n) else f"{n:g}"
