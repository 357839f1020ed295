"""Confirmation: each candidate's speed-up over the baseline with its interval on a logarithmic ratio
axis (lines at 1.0 and at 1 + min_gain), and the measurements of every round."""

from __future__ import annotations

import math
from itertools import zip_longest

from perfscope.record.tune_schema import Candidate, TuneRecord
from perfscope.record.values import finite_numbers
from perfscope.reports.html import clean, esc, figure, note, num, section, table
from perfscope.reports.palette import DARK, GREEN, GREY, VERMILLION
from perfscope.reports.sections.tuning_record import (
    amount,
    candidates,
    changes_text,
    confidence,
    min_gain,
    ratio,
    rounds,
    unit,
    word,
)
from perfscope.reports.charts import Chart, cached, or_note

NICE_RATIOS = (0.1, 0.2, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 2.0, 3.0, 4.0, 5.0, 7.0,
               10.0, 20.0, 50.0, 100.0)
MIN_TICK_GAP = 36  # pixels between tick labels


def round_ratios(c: Candidate) -> list[float]:
    """candidate / baseline of each round where both are positive numbers."""
    return [b / a for a, b in zip(finite_numbers(c.baseline), finite_numbers(c.candidate)) if a > 0 and b > 0]


def _ticks(lo: float, hi: float, x_of) -> list[float]:
    """Round ratios inside [lo, hi], 1.0 first, then each one far enough from those kept."""
    kept = [1.0]
    for t in sorted((t for t in NICE_RATIOS if lo <= t <= hi and t != 1.0), key=lambda t: abs(math.log(t))):
        if all(abs(x_of(t) - x_of(k)) >= MIN_TICK_GAP for k in kept):
            kept.append(t)
    return sorted(kept)


@or_note
@cached
def chart(threshold: float, cands: list[Candidate]) -> str:
    """Each candidate's speed-up with its interval and rounds, against 1.0x and ``threshold`` (the
    bar to clear, 1 + min_gain); from these two only, so that the drawing is cached across
    checkpoints of the record (:func:`perfscope.reports.charts.cached`)."""
    from matplotlib.ticker import FixedLocator, NullLocator

    values = [1.0, threshold] + [v for c in cands for v in _ratios(c)]
    lo, hi = min(values) / 1.08, max(values) * 1.08
    left, width, row_h = 150, 700, 36

    def x_of(r: float) -> float:
        return (math.log(r) - math.log(lo)) / (math.log(hi) - math.log(lo)) * width

    with Chart("confirmation", left + width + 30, len(cands) * row_h + 50, (left, 30, 8, 42)) as ch:
        ax = ch.ax
        ax.set_xscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(len(cands) - 0.5, -0.5)
        ticks = _ticks(lo, hi, x_of)
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(lambda t, _pos: f"{t:g}x")
        ax.xaxis.grid(True)
        ax.set_xlabel("speed-up (candidate / baseline; logarithmic axis)")
        ax.set_yticks(range(len(cands)), [clean(f"trial {word(c.trial)}") for c in cands])
        ax.tick_params(axis="y", length=0)
        ax.spines["left"].set_visible(False)
        ch.tip(ax.axvline(1.0, color="#444444", lw=1), "1.0x: no change")
        if threshold > 1.0:
            ch.tip(ax.axvline(threshold, color=VERMILLION, lw=1.5, ls=(0, (6, 4))),
                   f"{threshold:.3g}x: 1 + min_gain, the bar to clear")
        for k, c in enumerate(cands):
            _candidate_row(ch, k, c)
        return ch.svg("speed-up of each candidate with its interval")


def _ratios(c: Candidate) -> list[float]:
    """A candidate's positive speed-up, interval ends and round ratios: what the axis must hold."""
    return [v for v in (num(x) for x in (c.speedup, c.ci_low, c.ci_high)) if v is not None and v > 0] \
        + round_ratios(c)


def _round_dots(ch, k: int, rr: list[float]) -> None:
    """Each round's ratio as a dot above row k."""
    if rr:
        dots = ch.ax.plot(rr, [k - 0.3] * len(rr), ls="none", marker="o", ms=5, color=DARK, alpha=0.55, mew=0)[0]
        ch.tips(dots, [f"one round: {r:.3f}x" for r in rr])


def _candidate_row(ch, k: int, c: Candidate) -> None:
    """Row k of the chart: the candidate's rounds (dots), its interval (bar) and speed-up (diamond)."""
    from matplotlib.collections import LineCollection

    ax = ch.ax
    colour = GREEN if c.faster is True else GREY
    _round_dots(ch, k, round_ratios(c))
    a, b, s = num(c.ci_low), num(c.ci_high), num(c.speedup)
    has_interval = bool(a and b and a > 0 and b > 0)
    tip = f"trial {word(c.trial)}: {ratio(s)}" + (f", interval {a:.2f}x–{b:.2f}x" if has_interval else "")
    if has_interval:
        bar = LineCollection([[(a, k), (b, k)], [(a, k - 0.17), (a, k + 0.17)], [(b, k - 0.17), (b, k + 0.17)]],
                             colors=colour, linewidths=[4, 2, 2])
        ch.tip(ax.add_collection(bar), tip, cls="ci")
    if s is not None and s > 0:
        ch.tip(ax.plot([s], [k], ls="none", marker="D", ms=9, mfc=colour, mec="#ffffff")[0], tip)


def _summary_table(record: TuneRecord, cands: list[Candidate]) -> str:
    threshold = 1 + min_gain(record)
    rows = []
    for c in cands:
        a, b = num(c.ci_low), num(c.ci_high)
        faster = c.faster is True
        rows.append(("hl" if faster else "", [
            esc(word(c.trial)), esc(changes_text(c.config)), ratio(c.speedup),
            f"{a:.2f}x–{b:.2f}x" if a is not None and b is not None else "-",
            "yes" if faster else "no",
        ]))
    return table([("trial", ""), ("configuration (changes)", "name"), ("speed-up", ""),
                  (f"{confidence(record):.0%} interval", ""), (f"faster (low end > {threshold:.2f}x)", "l")], rows,
                 "Speed-up: geometric mean over the rounds of candidate / baseline, measured back to back.")


def _rounds_table(record: TuneRecord, c: Candidate) -> str:
    u = unit(record)
    base, cand = finite_numbers(c.baseline), finite_numbers(c.candidate)
    rows = []
    for i, (a, b) in enumerate(zip_longest(base, cand), start=1):
        r = ratio(b / a) if a and b is not None and a > 0 else "-"
        rows.append(("", [str(i), amount(a), amount(b), r]))
    if not rows:
        return note(f"Trial {word(c.trial)}: no round measurements in the record.")
    return table([("round", ""), (f"baseline ({u})", ""), (f"candidate ({u})", ""), ("ratio", "")], rows,
                 f"Trial {word(c.trial)}: each round measures the baseline, then the candidate.")


def render(record: TuneRecord) -> str:
    title = "Confirmation"
    cands = candidates(record)
    if record.confirmation is None:
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
    fig = figure(chart(threshold, cands), (
        "Per candidate: the speed-up (diamond), its interval (bar; green when it clears the bar) and each "
        "round's ratio (dots). Black line: 1.0x, no change; red dashed line: 1 + min_gain."))
    per_round = "<h3>Rounds</h3>" + "".join(_rounds_table(record, c) for c in cands)
    return section("confirmation", title, lead + fig + _summary_table(record, cands) + per_round)
