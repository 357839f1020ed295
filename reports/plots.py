"""The report's common chart kinds, drawn through :class:`perfscope.reports.charts.Chart`: stacked columns (the
per-step breakdown), plain columns (histograms, per-step peaks) and horizontal bars (shares, ranks,
importances).

Both take values already in the unit of their axis (ms, GiB, counts), one tooltip per column or
segment, and return the inline SVG (str).
"""

from __future__ import annotations

import math

from perfscope.reports.charts import NICE_STEPS, Chart, cached, integer_label, or_note
from perfscope.reports.html import clean
from perfscope.reports.palette import DARK as OUTLINE_COLOUR

# Beyond this many columns the labels under them are thinned to round positions and a column's
# second line (a step's verdict) is left to its tooltip and the table: they would overlap.
MAX_LABELLED = 40


def _bar_corners(x: float, half: float, y0: float, y1: float) -> list[tuple[float, float]]:
    return [(x - half, y0), (x - half, y1), (x + half, y1), (x + half, y0)]


@or_note
@cached
def stacked_columns(key: str, bars: list[dict], parts: list[tuple[str, str]], unit_label: str, label: str,
                    height: int = 260, groups: list[tuple[int, int, str]] | None = None,
                    y_max: float | None = None) -> str:
    """Vertical stacked columns, one per entry of ``bars``.

    Args:
        key: the chart's id prefix, unique in the page (see :class:`perfscope.reports.charts.Chart`).
        bars: ``{"values": [v per part], "label": str, "sub": str, "title": str, "faded": bool,
            "outline": float | None}``; values in the unit of ``unit_label``, negative ones drawn
            as nothing; ``outline``: a second height drawn as a dashed, unfilled column around the
            stack (the step as measured, beside the stack on a provisional verdict's clock).
        parts: (name, colour) per stacked segment, bottom first.
        unit_label: the y axis title, with its unit.
        label: the chart's accessible name.
        groups: (first bar, last bar, text) spans labelled under the columns (the ranks).
        y_max: the y axis reaches at least this high (to share one scale between two charts).
    """
    from matplotlib.ticker import MaxNLocator

    n = max(len(bars), 1)
    slot = max(14.0, min(80.0, 900.0 / n))
    labelled = len(bars) <= MAX_LABELLED
    width = max(66 + slot * n, 600.0)
    bottom = (36 if labelled else 26) + (22 if groups else 0)
    plot_h = height - 10 - bottom
    with Chart(key, width, height, (56, 10, 10, bottom)) as c:
        ax = c.ax
        base = _stack(c, bars, parts)
        base = _outlines(c, bars, base)
        ax.update_datalim([(-0.5, 0.0), (len(bars) - 0.5, max(base + [y_max or 0.0]) or 1.0)])
        ax.set_xlim(-0.5, n - 0.5)
        ax.yaxis.set_major_locator(MaxNLocator(6, steps=NICE_STEPS))
        ax.set_ylim(0, _round_top(max(base + [y_max or 0.0]), ax.yaxis))
        ax.yaxis.set_major_formatter(integer_label)
        ax.yaxis.grid(True)
        ax.set_ylabel(clean(unit_label))
        _x_labels(ax, bars, labelled)
        ax.tick_params(axis="x", length=0)
        _group_labels(ax, groups or [], -(bottom - 14) / plot_h, plot_h)
        return c.svg(label)


def _stack(c, bars: list[dict], parts: list[tuple[str, str]]) -> list[float]:
    """Every positive segment, stacked per column, as one collection (matplotlib's cost is per
    artist), each with its tooltip; returns each column's top."""
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import to_rgba

    base = [0.0] * len(bars)
    verts, colours, texts = [], [], []
    for k, (name, colour) in enumerate(parts):
        for i, b in enumerate(bars):
            v = b["values"][k]
            if v > 0:
                verts.append(_bar_corners(i, 0.36, base[i], base[i] + v))
                colours.append(to_rgba(colour, 0.45 if b.get("faded") else 1.0))
                texts.append(f'{b["title"]} · {name}: {v:.2f}')
                base[i] += v
    if verts:
        c.tips(c.ax.add_collection(PolyCollection(verts, facecolors=colours, edgecolors="none")), texts)
    return base


def _outlines(c, bars: list[dict], base: list[float]) -> list[float]:
    """Each bar's ``outline`` height as a dashed, unfilled column with its tooltip; returns each
    column's top (the higher of the stack and its outline)."""
    from matplotlib.collections import PolyCollection

    verts, texts, tops = [], [], list(base)
    for i, b in enumerate(bars):
        v = b.get("outline")
        if isinstance(v, (int, float)) and math.isfinite(v) and v > 0:
            verts.append(_bar_corners(i, 0.42, 0.0, v))
            texts.append(f'{b["title"]} · as measured: {v:.2f}')
            tops[i] = max(tops[i], v)
    if verts:
        c.tips(c.ax.add_collection(PolyCollection(verts, facecolors="none", edgecolors=OUTLINE_COLOUR,
                                                  linestyles="dashed", linewidths=0.8)), texts)
    return tops


def _x_labels(ax, bars: list[dict], labelled: bool) -> None:
    """Each column's label (and sub-label), or, for many columns, about 20 of them."""
    from matplotlib.ticker import FixedLocator, MaxNLocator

    if labelled:
        ax.set_xticks(range(len(bars)), [clean(b["label"] + ("\n" + b["sub"] if b.get("sub") else "")) for b in bars])
        return
    at = [int(t) for t in MaxNLocator(20, integer=True, steps=NICE_STEPS).tick_values(0, len(bars) - 1) if 0 <= t < len(bars)]
    ax.xaxis.set_major_locator(FixedLocator(at))
    ax.set_xticklabels([clean(bars[i]["label"]) for i in at])


def _group_labels(ax, groups: list[tuple[int, int, str]], y: float, plot_h: float) -> None:
    """A line under each span of columns, with its text (the ranks)."""
    from matplotlib.transforms import blended_transform_factory

    below = blended_transform_factory(ax.transData, ax.transAxes)
    for first, last, text in groups:
        ax.plot([first - 0.45, last + 0.45], [y, y], transform=below, clip_on=False, color="#444444", lw=1)
        ax.text((first + last) / 2, y - 4 / plot_h, clean(text), transform=below, ha="center", va="top", fontsize=11)


def _round_top(peak: float, axis) -> float:
    """The value axis' end: its locator's first tick at or above ``peak`` (1 when everything is 0)."""
    ticks = axis.get_major_locator().tick_values(0, peak if peak > 0 else 1.0)
    return next((t for t in ticks if t >= peak * (1 - 1e-9) and t > 0), peak or 1.0)


def _count_axis(ax, peak: float, log: bool) -> None:
    """The value axis of :func:`columns`: logarithmic by decades (``log`` and a peak of 1 or
    more), else linear with nice steps, both labelled in whole numbers."""
    from matplotlib.ticker import LogLocator, MaxNLocator, NullLocator

    if log and peak >= 1:
        ax.set_yscale("log")
        ax.set_ylim(0.7, 10.0 ** max(1, math.ceil(math.log10(peak) - 1e-9)))
        ax.yaxis.set_major_locator(LogLocator(base=10))
        ax.yaxis.set_minor_locator(NullLocator())
    else:
        ax.yaxis.set_major_locator(MaxNLocator(5, steps=NICE_STEPS))
        ax.set_ylim(0, _round_top(peak, ax.yaxis))
    ax.yaxis.set_major_formatter(integer_label)


@or_note
@cached
def columns(key: str, values: list[float], labels: list[str], colour: str, unit_label: str, label: str,
            titles: list[str] | None = None, height: int = 220, width: int = 440,
            colours: list[str] | None = None, log: bool = False) -> str:
    """Plain vertical columns with a y axis in ``unit_label``.

    Args:
        key: the chart's id prefix, unique in the page.
        values: one per column, in the axis unit; columns of 0 or less are not drawn.
        labels: under each column (rotated).
        titles: each column's tooltip (default ``"label: value"``).
        log: a logarithmic axis (for counts spanning decades, where a linear one flattens the
            small bins to nothing); a count of 1 still shows as a short column.
    """
    labels = [*labels, *[""] * len(values)][: len(values)]  # a summary's lists may disagree in length
    titles = [*(titles or []), *[None] * len(values)][: len(values)]
    with Chart(key, width, height, (56, 8, 10, 52)) as c:
        ax = c.ax
        shown = [i for i, v in enumerate(values) if v > 0]
        bars = ax.bar(shown, [values[i] for i in shown], width=0.7,
                      color=[(colours[i] if colours else colour) for i in shown])
        c.tips(bars, [titles[i] or f"{labels[i]}: {values[i]:g}" for i in shown])
        ax.set_xlim(-0.5, max(len(values), 1) - 0.5)
        _count_axis(ax, max(values, default=0.0), log)
        ax.yaxis.grid(True)
        ax.set_ylabel(clean(unit_label))
        ax.set_xticks(range(len(values)), [clean(s) for s in labels], rotation=35, ha="right",
                      rotation_mode="anchor", fontsize=9)
        ax.tick_params(axis="x", length=0)
        return c.svg(label)


@or_note
@cached
def hbars(key: str, rows: list[dict], label: str, x_label: str | None, width: int = 900, bar_h: float = 18,
          gap: float = 8, left: float = 110, right: float = 80, x_max: float | None = None,
          percent: bool = False) -> str:
    """Horizontal bars, one row each, their segments stacked from the left.

    Args:
        key: the chart's id prefix, unique in the page.
        rows: ``{"label": str, "segments": [(value, colour, tooltip, caption or "")], "end": str,
            "inner": [(value, colour, tooltip)]}``; values in the axis unit; a segment's caption is
            written inside it where it fits; ``end`` is written after the bar; ``inner`` segments
            are drawn as a thinner bar on top (a part measured inside the whole).
        x_label: the x axis title with its unit; None draws no x axis (a bar of shares).
        x_max: the axis ends at least this high (default: the longest row).
        percent: tick labels as percentages of values given as fractions.
    """
    bottom = 34 if x_label else 4
    height = 6 + len(rows) * (bar_h + gap) + bottom
    plot_w = width - left - right
    with Chart(key, width, height, (left, right, 6, bottom)) as c:
        ax = c.ax
        peak = _peak(rows, x_max)
        frac_h = bar_h / (bar_h + gap)
        outer, inner = [], []  # (row, left, value, colour, tooltip): one bar() call each, not one per segment
        for k, r in enumerate(rows):
            x = _segments(ax, k, r, outer, peak / plot_w)
            inner += [(k, 0.0, v, colour, tip) for v, colour, tip in r.get("inner") or [] if v > 0]
            if r.get("end"):
                ax.annotate(clean(r["end"]), (x, k), xytext=(4, 0), textcoords="offset points", va="center",
                            fontsize=10, annotation_clip=False)
        _bars(c, outer, frac_h)
        _bars(c, inner, frac_h * 0.55)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_yticks(range(len(rows)), [clean(r["label"]) for r in rows])
        ax.tick_params(axis="y", length=0)
        ax.spines["left"].set_visible(bool(x_label))
        _x_axis(ax, x_label, peak, percent)
        return c.svg(label)


def _peak(rows: list[dict], x_max: float | None) -> float:
    """The longest row (its positive segments summed), at least x_max; 1.0 when all are empty."""
    return max([sum(max(v, 0.0) for v, *_ in r["segments"]) for r in rows] + [x_max or 0.0]) or 1.0


def _bars(c, bars: list, height: float) -> None:
    """Queued segments (row, left, value, colour, tooltip) drawn with one barh call."""
    if bars:
        ys, xs, vs, colours, tips = zip(*bars)
        c.tips(c.ax.barh(ys, vs, left=xs, height=height, color=colours), list(tips))


def _segments(ax, k: int, row: dict, outer: list, units_per_px: float) -> float:
    """Row k's positive segments queued in ``outer``, each captioned inside where its caption fits
    (about 6.5 px a character); returns where the row ends."""
    x = 0.0
    for v, colour, tip, caption in row["segments"]:
        if v <= 0:
            continue
        outer.append((k, x, v, colour, tip))
        if caption and v / units_per_px > 6.5 * len(caption):
            ax.text(x + v / 2, k, clean(caption), ha="center", va="center", fontsize=10, color="#111111")
        x += v
    return x


def _x_axis(ax, x_label: str | None, peak: float, percent: bool) -> None:
    """The value axis, up to a round value above the peak; none for a bar of shares."""
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    if not x_label:
        ax.set_xlim(0, peak)
        ax.xaxis.set_visible(False)
        ax.spines["bottom"].set_visible(False)
        return
    ax.xaxis.set_major_locator(MaxNLocator(8, steps=NICE_STEPS))
    ax.set_xlim(0, _round_top(peak, ax.xaxis))
    ax.xaxis.set_major_formatter(PercentFormatter(1.0, decimals=0) if percent else integer_label)
    ax.xaxis.grid(True)
    ax.set_xlabel(clean(x_label))


@or_note
@cached
def levels(key: str, series: list[tuple[str, list[float], list[float], str]], x_label: str, unit_label: str,
           label: str, width: int = 900, height: int = 240) -> str:
    """Levels over time as steps (a level holds until the next point), one line per series.

    Args:
        key: the chart's id prefix, unique in the page.
        series: ``(name, xs, ys, colour)``, xs ascending in the x unit, ys in ``unit_label``; a
            series with fewer than two points is not drawn. Each line's tooltip is its name and peak.
        x_label, unit_label: the axes' titles with their units.
    """
    from matplotlib.ticker import MaxNLocator

    drawn = [s for s in series if len(s[1]) >= 2 and len(s[1]) == len(s[2])]
    with Chart(key, width, height, (64, 110, 10, 40)) as c:
        ax = c.ax
        low, high = 0.0, 0.0
        for name, xs, ys, colour in drawn:
            (line,) = ax.step(xs, ys, where="post", color=colour, linewidth=1.5)
            c.tip(line, f"{name}: peak {max(ys):.3g} {unit_label}")
            ax.annotate(clean(name), (xs[-1], ys[-1]), xytext=(4, 0), textcoords="offset points", va="center",
                        fontsize=10, color=colour, annotation_clip=False)
            low, high = min(low, min(ys)), max(high, max(ys))
        ax.yaxis.set_major_locator(MaxNLocator(5, steps=NICE_STEPS))
        ax.set_ylim(low, _round_top(high, ax.yaxis) if high > 0 else 1.0)
        ax.yaxis.set_major_formatter(integer_label)
        ax.xaxis.set_major_locator(MaxNLocator(8, steps=NICE_STEPS))
        ax.set_xlim(0, max([s[1][-1] for s in drawn], default=1.0) or 1.0)
        ax.xaxis.set_major_formatter(integer_label)
        ax.yaxis.grid(True)
        ax.set_ylabel(clean(unit_label))
        ax.set_xlabel(clean(x_label))
        return c.svg(label)


def _stacked_steps(c, xs: list[float], parts: list[tuple[str, list[float], str]],
                   marks: list[tuple[float, float, str]]) -> float:
    """Stack :func:`run_steps`' phases on ``c`` (two steps or more); returns the highest value
    drawn, marks included (ms)."""
    if len(xs) < 2:
        return max([m[1] for m in marks], default=1.0)
    # a step's band spans [step, step + 1): the last one needs its right edge
    ends = [*xs, xs[-1] + 1]
    areas = c.ax.stackplot(ends, *[[*p[1], p[1][-1]] for p in parts], colors=[p[2] for p in parts], step="post",
                           linewidth=0)
    for area, (name, ys, colour) in zip(areas, parts):
        c.tip(area, f"{name}: median {sorted(ys)[len(ys) // 2]:.3g} ms a step")
    top = [sum(v) for v in zip(*[p[1] for p in parts])]
    return max(top + [m[1] for m in marks])


@or_note
@cached
def run_steps(key: str, xs: list[float], parts: list[tuple[str, list[float], str]], window: tuple[float, float] | None,
              marks: list[tuple[float, float, str]], label: str, width: int = 900, height: int = 260) -> str:
    """Every step of a run: its phases stacked over the step number, the profiled window shaded,
    the slow steps marked (the legend is the caller's, in HTML).

    Args:
        key: the chart's id prefix, unique in the page.
        xs: step numbers, ascending.
        parts: ``(name, ms per step, colour)``, stacked in order; each as long as ``xs``.
        window: (first, last) step of the profiled window, or None.
        marks: ``(step, ms, tooltip)`` of the slow steps.
    """
    from matplotlib.ticker import MaxNLocator

    with Chart(key, width, height, (64, 20, 10, 40)) as c:
        ax = c.ax
        high = _stacked_steps(c, xs, parts, marks)
        if window is not None:
            span = ax.axvspan(window[0], window[1] + 1, color="#999999", alpha=0.25, linewidth=0)
            c.tip(span, f"profiled window: steps {window[0]:g}-{window[1]:g}")
        for step, value, tip in marks:
            (dot,) = ax.plot([step + 0.5], [value], marker="v", color="#D55E00", markersize=7, linestyle="none")
            c.tip(dot, tip)
        ax.yaxis.set_major_locator(MaxNLocator(5, steps=NICE_STEPS))
        ax.set_ylim(0, _round_top(high, ax.yaxis) if high > 0 else 1.0)
        ax.xaxis.set_major_locator(MaxNLocator(8, integer=True))
        ax.set_xlim(xs[0] if xs else 0, (xs[-1] + 1) if xs else 1)
        ax.yaxis.grid(True)
        ax.set_ylabel("ms")
        ax.set_xlabel("step")
        return c.svg(label)
