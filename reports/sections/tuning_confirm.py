"""Confirmation: each candidate's speed-up over the baseline with its interval on a logarithmic ratio
axis (lines at 1.0 and at 1 + min_gain), and the measurements of every round."""

from __future__ import annotations

import math
from itertools import zip_longest

from reports.html import esc, figure, note, num, section, table
from reports.palette import DARK, GREEN, GREY, VERMILLION
from reports.sections.tuning_record import (
    amount,
    candidates,
    changes_text,
    confidence,
    min_gain,
    numbers,
    obj,
    ratio,
    rounds,
    unit,
    word,
)
from reports.svg import open_svg, text

NICE_RATIOS = (0.1, 0.2, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 2.0, 3.0, 4.0, 5.0, 7.0,
               10.0, 20.0, 50.0, 100.0)
MIN_TICK_GAP = 36  # pixels between tick labels


def round_ratios(c: dict) -> list[float]:
    """candidate / baseline of each round where both are positive numbers."""
    return [b / a for a, b in zip(numbers(c.get("baseline")), numbers(c.get("candidate"))) if a > 0 and b > 0]


def _ticks(lo: float, hi: float, x_of) -> list[float]:
    """Round ratios inside [lo, hi], 1.0 first, then each one far enough from those kept."""
    kept = [1.0]
    for t in sorted((t for t in NICE_RATIOS if lo <= t <= hi and t != 1.0), key=lambda t: abs(math.log(t))):
        if all(abs(x_of(t) - x_of(k)) >= MIN_TICK_GAP for k in kept):
            kept.append(t)
    return sorted(kept)


def chart(record: dict, cands: list[dict]) -> str:
    threshold = 1 + min_gain(record)
    values = [1.0, threshold]
    for c in cands:
        values += [v for v in (num(c.get(k)) for k in ("speedup", "ci_low", "ci_high")) if v is not None and v > 0]
        values += round_ratios(c)
    lo, hi = min(values) / 1.08, max(values) * 1.08
    left, width, row_h = 150, 700, 36
    height = 14 + len(cands) * row_h + 40

    def x_of(r: float) -> float:
        return left + (math.log(r) - math.log(lo)) / (math.log(hi) - math.log(lo)) * width

    bottom = 14 + len(cands) * row_h
    out = [open_svg(left + width + 30, height, "speed-up of each candidate with its interval")]
    for t in _ticks(lo, hi, x_of):
        x = x_of(t)
        out.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="8" y2="{bottom:.1f}"/>')
        out.append(text(x, bottom + 14, f"{t:g}x", "middle"))
    out.append(f'<line class="axis" x1="{left}" x2="{left + width}" y1="{bottom:.1f}" y2="{bottom:.1f}"/>')
    x1 = x_of(1.0)
    out.append(f'<line class="axis" x1="{x1:.1f}" x2="{x1:.1f}" y1="4" y2="{bottom:.1f}"><title>1.0x: no change</title></line>')
    if threshold > 1.0:
        xt = x_of(threshold)
        out.append(f'<line class="ref" stroke="{VERMILLION}" x1="{xt:.1f}" x2="{xt:.1f}" y1="4" y2="{bottom:.1f}">'
                   f"<title>{esc(f'{threshold:.3g}x: 1 + min_gain, the bar to clear')}</title></line>")
    for k, c in enumerate(cands):
        y = 14 + k * row_h + row_h / 2
        out.append(text(left - 8, y + 4, f"trial {word(c.get('trial'))}", "end"))
        colour = GREEN if c.get("faster") is True else GREY
        for r in round_ratios(c):
            out.append(f'<circle cx="{x_of(r):.1f}" cy="{y - 11:.1f}" r="2.5" fill="{DARK}" fill-opacity="0.55">'
                       f"<title>{esc(f'one round: {r:.3f}x')}</title></circle>")
        a, b, s = (num(c.get(key)) for key in ("ci_low", "ci_high", "speedup"))
        interval = f", interval {a:.2f}x–{b:.2f}x" if a and b and a > 0 and b > 0 else ""
        tip = f"trial {word(c.get('trial'))}: {ratio(s)}{interval}"
        if interval:
            xa, xb = x_of(a), x_of(b)
            out.append(f'<g class="ci"><title>{esc(tip)}</title>'
                       f'<line x1="{xa:.1f}" x2="{xb:.1f}" y1="{y:.1f}" y2="{y:.1f}" stroke="{colour}" stroke-width="4"/>'
                       f'<line x1="{xa:.1f}" x2="{xa:.1f}" y1="{y - 6:.1f}" y2="{y + 6:.1f}" stroke="{colour}" stroke-width="2"/>'
                       f'<line x1="{xb:.1f}" x2="{xb:.1f}" y1="{y - 6:.1f}" y2="{y + 6:.1f}" stroke="{colour}" stroke-width="2"/></g>')
        if s is not None and s > 0:
            xs = x_of(s)
            out.append(f'<path d="M{xs:.1f},{y - 6:.1f} L{xs + 6:.1f},{y:.1f} L{xs:.1f},{y + 6:.1f} L{xs - 6:.1f},{y:.1f} Z" '
                       f'fill="{colour}" stroke="#fff"><title>{esc(tip)}</title></path>')
    out.append(text(left + width / 2, height - 6, "speed-up (candidate / baseline; logarithmic axis)", "middle"))
    out.append("</svg>")
    return "".join(out)


def _summary_table(record: dict, cands: list[dict]) -> str:
    threshold = 1 + min_gain(record)
    rows = []
    for c in cands:
        a, b = num(c.get("ci_low")), num(c.get("ci_high"))
        faster = c.get("faster") is True
        rows.append(("hl" if faster else "", [
            esc(word(c.get("trial"))), esc(changes_text(c.get("config"))), ratio(c.get("speedup")),
            f"{a:.2f}x–{b:.2f}x" if a is not None and b is not None else "-",
            "yes" if faster else "no",
        ]))
    return table([("trial", ""), ("configuration (changes)", "name"), ("speed-up", ""),
                  (f"{confidence(record):.0%} interval", ""), (f"faster (low end > {threshold:.2f}x)", "l")], rows,
                 "Speed-up: geometric mean over the rounds of candidate / baseline, measured back to back.")


def _rounds_table(record: dict, c: dict) -> str:
    u = unit(record)
    base, cand = numbers(c.get("baseline")), numbers(c.get("candidate"))
    rows = []
    for i, (a, b) in enumerate(zip_longest(base, cand), start=1):
        r = ratio(b / a) if a and b is not None and a > 0 else "-"
        rows.append(("", [str(i), amount(a), amount(b), r]))
    if not rows:
        return note(f"Trial {word(c.get('trial'))}: no round measurements in the record.")
    return table([("round", ""), (f"baseline ({u})", ""), (f"candidate ({u})", ""), ("ratio", "")], rows,
                 f"Trial {word(c.get('trial'))}: each round measures the baseline, then the candidate.")


def render(record: dict) -> str:
    title = "Confirmation"
    conf = obj(record.get("confirmation"))
    cands = candidates(record)
    if not conf:
        return section("confirmation", title, note(
            "Not available: no confirmation ran (no trial of the search beat the baseline, or the tuning "
            "stopped before it)."))
    if not cands:
        return section("confirmation", title, note("Not available: the confirmation holds no candidate."))
    n = rounds(record)
    threshold = 1 + min_gain(record)
    lead = (f'<p class="muted">{esc(f"{len(cands)} candidate" + ("s" if len(cands) != 1 else ""))} measured again '
            + (f"in {n} rounds " if n else "")
            + "interleaved with the baseline (B C1 C2 B C1 C2 ...), the speed-up with a "
            + f"{confidence(record):.0%} interval (Student's t on the paired log ratios). A candidate is faster only "
            + f"when the whole interval lies above {threshold:.2f}x (1 + min_gain).</p>")
    fig = figure(chart(record, cands), (
        "Per candidate: the speed-up (diamond), its interval (bar; green when it clears the bar) and each "
        "round's ratio (dots). Black line: 1.0x, no change; red dashed line: 1 + min_gain."))
    per_round = "<h3>Rounds</h3>" + "".join(_rounds_table(record, c) for c in cands)
    return section("confirmation", title, lead + fig + _summary_table(record, cands) + per_round)
