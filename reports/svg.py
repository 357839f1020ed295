"""Hand-written inline SVG, for the drawings that are not charts with axes: the timeline's lanes
(thousands of events merged per pixel) and the verdict's evidence bar (one bar of shares). Charts
with axes are matplotlib's (reports/charts.py).

Drawings are plain strings with every label escaped; they scale with the page (``viewBox``) and
need no script, font or file from outside.
"""

from __future__ import annotations

import math

from perfscope.reports.html import esc


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
