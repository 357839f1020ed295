"""The trial history chart: each trial's value by trial number, one marker per outcome, the baseline
as a reference line and the best feasible value so far as a step line.

Markers are ``<g class="mk mk-OUTCOME">`` groups with a ``<title>`` (the browser's tooltip), so a
test counts them and a reader hovers them. Pruned trials sit at the last throughput so far they
reported (``tuning_record.last_value``; not drawn without one); infeasible trials sit on the x axis
at 0, whatever value the study stored for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfscope.record.tune_schema import Trial, TuneRecord
from perfscope.reports.html import clean, esc, num, truncate
from perfscope.reports.palette import BLUE, DARK, GREEN, ORANGE, VERMILLION
from perfscope.reports.sections.tuning_record import (
    INFEASIBLE,
    amount,
    changes_text,
    failure_text,
    last_value,
    outcome,
    same_trial,
    trials,
    unit,
    word,
)
from perfscope.reports.charts import NICE_STEPS, Chart, cached, integer_label, or_note

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


def points(record: TuneRecord) -> tuple[list[Point], list[Trial]]:
    """(the markers drawn, the trials not drawn: running, unnumbered, or without a value)."""
    u = unit(record)
    drawn, skipped = [], []
    for t in trials(record):
        point = _point(t, u)
        if point is None:
            skipped.append(t)
        else:
            drawn.append(point)
    return drawn, skipped


def _point(t: Trial, u: str) -> Point | None:
    """The marker of one trial (an infeasible one on the x axis, a pruned one at its last value),
    or None when it has nothing to draw."""
    n, kind = num(t.number), outcome(t)
    if n is None or kind == "running":
        return None
    role = word(t.role, "")
    head = f"trial {word(t.number)}" + (f" ({role})" if role else "")
    config = changes_text(t.config, "your settings" if role == "baseline" else "no change")
    if kind == INFEASIBLE:
        return Point(n, 0.0, kind, truncate(f"{head}: {failure_text(t) or 'infeasible'} · {config}", 400))
    v = last_value(t) if kind == "pruned" else num(t.value)
    if v is None:
        return None
    shown = f"pruned at {amount(v)} {u}" if kind == "pruned" else f"{amount(v)} {u}"
    return Point(n, v, kind, truncate(f"{head}: {shown} · {config}", 400))


def best_so_far(drawn: list[Point]) -> list[tuple[float, float]]:
    """(trial number, best complete value up to it) at each trial that raised it."""
    out, best = [], None
    for p in sorted(drawn, key=lambda p: p.number):
        if p.outcome == "complete" and (best is None or p.value > best):
            best = p.value
            out.append((p.number, best))
    return out


def shape(kind: str, x: float, y: float) -> str:
    """A legend key's shape centred at ``x``, ``y`` (the chart's markers are matplotlib's, MARKERS)."""
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


def key(kind: str) -> str:
    """A legend entry with the marker's own shape."""
    return (f'<span><svg class="key" viewBox="0 0 14 14" width="14" height="14" aria-hidden="true">'
            f'{shape(kind, 7, 7)}</svg>{esc(LABELS[kind])}</span>')


def line_key(cls: str, colour: str, label: str) -> str:
    return (f'<span><svg class="key" viewBox="0 0 22 14" width="22" height="14" aria-hidden="true">'
            f'<line class="{cls}" x1="1" x2="21" y1="7" y2="7" stroke="{colour}"/></svg>{esc(label)}</span>')


# outcome -> matplotlib marker: (marker, size in units, face, edge, edge width); key() draws the same shapes
MARKERS = {
    "complete": ("o", 9.0, BLUE, "#ffffff", 1.0),
    "pruned": ("^", 10.0, "#ffffff", ORANGE, 2.0),
    INFEASIBLE: ("x", 8.0, VERMILLION, VERMILLION, 2.5),
}


@or_note
@cached
def _draw(drawn: list[Point], steps: list[tuple[float, float]], base_value: float | None, u: str, x_lo: float,
          x_hi: float, recommended) -> str:
    """The chart's SVG: markers per outcome, the baseline and the best-so-far line."""
    from matplotlib.ticker import MaxNLocator

    with Chart("history", WIDTH, HEIGHT, (LEFT, RIGHT, TOP, BOTTOM)) as c:
        ax = c.ax
        ax.set_xlim(x_lo - 0.5, x_hi + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(MAX_X_LABELS, integer=True, steps=NICE_STEPS))
        ax.yaxis.set_major_locator(MaxNLocator(6, steps=NICE_STEPS))
        top = 1.05 * max([p.value for p in drawn] + [base_value or 0.0])  # headroom for the markers
        ax.set_ylim(0, next((t for t in ax.yaxis.get_major_locator().tick_values(0, top or 1.0) if t >= top and t > 0),
                            top or 1.0))
        ax.yaxis.grid(True)
        ax.yaxis.set_major_formatter(integer_label)
        ax.set_xlabel("trial number")
        ax.set_ylabel(clean(f"trial value ({u})"))
        if base_value is not None:
            c.tip(ax.axhline(base_value, color=DARK, lw=1.5, ls=(0, (6, 4))), f"baseline: {amount(base_value)} {u}")
            _label(ax, f"baseline {amount(base_value)}", base_value, 0)
        if steps:
            _best_line(ax, steps, base_value, x_hi)
        _markers(c, drawn, recommended)
        return c.svg(f"trial value ({u}) by trial number")


def _label(ax, text: str, y: float, nudge: float) -> None:
    """A label right of the plot at height y (data), nudged by points."""
    ax.annotate(clean(text), (1, y), xycoords=("axes fraction", "data"), xytext=(4, nudge),
                textcoords="offset points", va="center", fontsize=10, annotation_clip=False)


def _best_line(ax, steps: list[tuple[float, float]], base_value: float | None, x_hi: float) -> None:
    """The best-so-far step line and its label, moved off the baseline's label where they would touch."""
    xs = [n for n, _ in steps] + [x_hi + 0.5]
    ys = [v for _, v in steps] + [steps[-1][1]]
    ax.step(xs, ys, where="post", color=GREEN, lw=2)
    best = steps[-1][1]
    span = ax.get_ylim()[1] or 1.0
    if base_value is None or abs(best - base_value) / span * (HEIGHT - TOP - BOTTOM) > 12:
        _label(ax, f"best {amount(best)}", best, 0)
    elif best != base_value:  # close to the baseline's label: put it below or above that one
        _label(ax, f"best {amount(best)}", best, -12 if best < base_value else 12)


def _markers(c, drawn: list[Point], recommended) -> None:
    """A marker per trial in its outcome's shape, with its tip; a ring round the recommended one."""
    if recommended is not None:
        _ring(c, [p for p in drawn if same_trial(p.number, recommended)])
    for kind in MARKERS:
        mine = [p for p in drawn if p.outcome == kind]
        if mine:
            _outcome(c, kind, mine)


def _outcome(c, kind: str, mine: list[Point]) -> None:
    """The markers of the trials of one outcome, in its shape (:data:`MARKERS`), with their tips."""
    mk, size, face, edge, ew = MARKERS[kind]
    line = c.ax.plot([p.number for p in mine], [max(p.value, 0.0) for p in mine], ls="none", marker=mk, ms=size,
                     mfc=face, mec=edge, mew=ew, clip_on=False)[0]
    c.tips(line, [p.tip for p in mine], cls=f"mk mk-{kind}")


def chart(record: TuneRecord, recommended=None) -> tuple[str, str]:
    """(the SVG, its legend), or two empty strings when nothing can be drawn."""
    drawn, _ = points(record)
    if not drawn:
        return "", ""
    u = unit(record)
    base_value = num(record.baseline.value) if record.baseline is not None else None
    x_lo, x_hi = min(min(p.number for p in drawn), 0.0), max(p.number for p in drawn)
    x_hi = max(x_hi, x_lo + 1)
    steps = best_so_far(drawn)
    svg = _draw(drawn, steps, base_value, u, x_lo, x_hi, recommended)
    return svg, _legend(drawn, steps, base_value, recommended)


def _ring(c, recommended: list[Point]) -> None:
    """A ring round the recommended trial's marker."""
    for p in recommended:
        c.tip(c.ax.plot([p.number], [max(p.value, 0.0)], "o", ms=18, mfc="none", mec=DARK, mew=1.5, clip_on=False)[0],
              f"trial {tick(p.number)}: recommended")


def _legend(drawn: list[Point], steps: list[tuple[float, float]], base_value: float | None, recommended) -> str:
    """The chart's legend: the outcomes drawn, the baseline, the best-so-far line, the ring."""
    kinds = [k for k in ("complete", "pruned", INFEASIBLE) if any(p.outcome == k for p in drawn)]
    keys = [key(k) for k in kinds]
    if base_value is not None:
        keys.append(line_key("ref", DARK, "baseline"))
    if steps:
        keys.append(line_key("bestline", GREEN, "best feasible value so far"))
    if recommended is not None and any(same_trial(p.number, recommended) for p in drawn):
        keys.append('<span><svg class="key" viewBox="0 0 22 22" width="14" height="14" aria-hidden="true">'
                    f'<circle cx="11" cy="11" r="9" fill="none" stroke="{DARK}" stroke-width="2"/></svg>recommended</span>')
    return '<div class="legend">' + "".join(keys) + "</div>"


def tick(n: float) -> str:
    return f"{n:.0f}" if n == int(n) else f"{n:g}"
