"""Hand-written inline SVG: axes with units, stacked bars, plain bars.

Charts are plain strings with every label escaped; they scale with the page (``viewBox``) and
need no script, font or file from outside.
"""

from __future__ import annotations

import math

from reports.html import esc


def nice_ticks(top: float, target: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``top`` (about ``target`` of them)."""
    if not top or top <= 0 or not math.isfinite(top):
        return [0.0, 1.0]
    raw = top / target
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    n = math.ceil(top / step - 1e-9)
    return [round(i * step, 10) for i in range(n + 1)]


def tick_label(v: float) -> str:
    return f"{v:.0f}" if v == int(v) else f"{v:g}"


def open_svg(width: float, height: float, label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" '
            f'width="{width:.0f}" role="img" aria-label="{esc(label)}">')


def rect(x, y, w, h, fill, title: str | None = None, opacity: float | None = None, cls: str = "") -> str:
    op = f' fill-opacity="{opacity:.2f}"' if opacity is not None and opacity < 1 else ""
    c = f' class="{cls}"' if cls else ""
    attrs = f'x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" height="{h:.1f}" fill="{fill}"{op}{c}'
    return f"<rect {attrs}><title>{esc(title)}</title></rect>" if title else f"<rect {attrs}/>"


def text(x, y, s, anchor: str = "start", cls: str = "", extra: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{c}{extra}>{esc(s)}</text>'


def y_axis(x0: float, x1: float, y_of, ticks: list[float], unit_label: str, y_top: float, y_bottom: float) -> list[str]:
    """Horizontal grid lines with labels at ``ticks`` and a rotated axis title."""
    out = []
    for t in ticks:
        y = y_of(t)
        out.append(f'<line class="grid" x1="{x0:.1f}" x2="{x1:.1f}" y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(text(x0 - 4, y + 3.5, tick_label(t), "end"))
    out.append(f'<line class="axis" x1="{x0:.1f}" x2="{x0:.1f}" y1="{y_top:.1f}" y2="{y_bottom:.1f}"/>')
    out.append(f'<line class="axis" x1="{x0:.1f}" x2="{x1:.1f}" y1="{y_bottom:.1f}" y2="{y_bottom:.1f}"/>')
    mid = (y_top + y_bottom) / 2
    out.append(text(12, mid, unit_label, "middle", extra=f' transform="rotate(-90 12 {mid:.1f})"'))
    return out


def stacked_columns(bars: list[dict], parts: list[tuple[str, str]], unit_label: str, label: str,
                    height: int = 260, min_slot: float = 14.0, groups: list[tuple[int, int, str]] | None = None,
                    y_max: float | None = None) -> str:
    """Vertical stacked bars.

    Args:
        bars: ``{"values": [v per part], "label": str, "sub": str, "title": str, "faded": bool}``.
        parts: (name, colour) per stacked segment, bottom first.
        unit_label: y-axis title with unit.
        label: accessible name.
        groups: (first bar, last bar, text) spans labelled under the bars (e.g. ranks).
        y_max: top of the y axis at least this high (to share a scale between charts).
    """
    left, right, top, bottom = 56, 10, 10, 58 if groups else 44
    slot = max(min_slot, min(80.0, 900.0 / max(len(bars), 1)))
    width = max(left + right + slot * len(bars), 600)
    plot_h = height - top - bottom
    peak = max([sum(b["values"]) for b in bars] + [y_max or 0.0])
    ticks = nice_ticks(peak)
    scale = plot_h / ticks[-1] if ticks[-1] > 0 else 0.0

    def y_of(v):
        return top + plot_h - v * scale

    out = [open_svg(width, height, label)]
    out += y_axis(left, width - right, y_of, ticks, unit_label, top, top + plot_h)
    bw = slot * 0.72
    for i, b in enumerate(bars):
        x = left + i * slot + (slot - bw) / 2
        base = 0.0
        op = 0.45 if b.get("faded") else None
        for v, (name, colour) in zip(b["values"], parts):
            if v > 0:
                out.append(rect(x, y_of(base + v), bw, v * scale, colour, f'{b["title"]} · {name}: {v:.2f}', op))
            base += v
        cx = x + bw / 2
        out.append(text(cx, top + plot_h + 12, b["label"], "middle"))
        if b.get("sub"):
            if slot >= 40:
                out.append(text(cx, top + plot_h + 24, b["sub"], "middle", "lbl"))
            else:
                yy = top + plot_h + 18
                out.append(text(cx + 3, yy, b["sub"], "end", "lbl", f' transform="rotate(-60 {cx + 3:.1f} {yy:.1f})"'))
    for first, last, g in groups or []:
        x0, x1 = left + first * slot + 2, left + (last + 1) * slot - 2
        yy = height - 8
        out.append(f'<line class="axis" x1="{x0:.1f}" x2="{x1:.1f}" y1="{yy - 10:.1f}" y2="{yy - 10:.1f}"/>')
        out.append(text((x0 + x1) / 2, yy, g, "middle"))
    out.append("</svg>")
    return "".join(out)


def hbar(parts: list[tuple[str, float, str]], total: float, label: str, width: int = 900, height: int = 34) -> str:
    """One horizontal stacked bar: (name, value, colour) segments, labelled where they fit."""
    out = [open_svg(width, height, label)]
    x = 0.0
    scale = width / total if total > 0 else 0.0
    for name, v, colour in parts:
        if v <= 0 or total <= 0:  # negative parts (a hand-edited summary) can sum to nothing
            continue
        w = v * scale
        out.append(rect(x, 2, w, height - 4, colour, f"{name}: {100 * v / total:.1f}%"))
        caption = f"{name} {100 * v / total:.0f}%"
        if w > 7 * len(caption):
            out.append(text(x + w / 2, height / 2 + 4, caption, "middle", "lbl"))
        x += w
    out.append("</svg>")
    return "".join(out)


def columns(values: list[float], labels: list[str], colour: str, unit_label: str, label: str,
            titles: list[str] | None = None, height: int = 220, width: int = 440, colours: list[str] | None = None,
            log: bool = False) -> str:
    """Plain vertical bars with a y axis in ``unit_label``; ``log``: a logarithmic axis from 1 (for
    counts spanning decades, where a linear axis flattens the small bins to nothing)."""
    left, right, top, bottom = 56, 8, 10, 52
    plot_h = height - top - bottom
    peak = max(values, default=0.0)
    if log and peak >= 1:
        ticks = [10.0 ** k for k in range(math.ceil(math.log10(peak)) + 1)] if peak > 1 else [1.0, 10.0]
        span = math.log10(ticks[-1]) or 1.0

        def height_of(v):
            return plot_h * math.log10(v) / span if v >= 1 else 0.0
    else:
        ticks = nice_ticks(peak)
        scale = plot_h / ticks[-1] if ticks[-1] > 0 else 0.0

        def height_of(v):
            return v * scale
    slot = (width - left - right) / max(len(values), 1)

    def y_of(v):
        return top + plot_h - height_of(v)

    out = [open_svg(width, height, label)]
    out += y_axis(left, width - right, y_of, ticks, unit_label, top, top + plot_h)
    for i, v in enumerate(values):
        x = left + i * slot + slot * 0.15
        c = colours[i] if colours else colour
        if v > 0:
            out.append(rect(x, y_of(v), slot * 0.7, height_of(v), c, titles[i] if titles else f"{labels[i]}: {v:g}"))
        cx, yy = x + slot * 0.35 + 3, top + plot_h + 12
        out.append(text(cx, yy, labels[i], "end", "lbl", f' transform="rotate(-35 {cx:.1f} {yy:.1f})"'))
    out.append("</svg>")
    return "".join(out)
