"""``perfscope diff A B``: two analyses side by side, the change of each metric, the verdict change and
the step time ratio (the inverse of the speed-up: :mod:`perfscope.steptime`); plus a short text
version for the terminal.

The tuner uses it for before/after comparisons, so every number is taken the same way as in the
report: over each run's counted steps, all ranks.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from perfscope.atomic import write_text_atomic
from perfscope import steptime
from perfscope.record.view import Record, record_of
from perfscope.text import safe
from perfscope.reports import model
from perfscope.reports.html import esc, figure, legend, ms, num, page, pct, section, table
from perfscope.reports.palette import CLASS_ORDER, part_us, parts
from perfscope.reports.sections import steps as steps_section
from perfscope.reports.sections import verdict as verdict_section
from perfscope.reports.plots import hbars


def _frac(record: Record, c: str) -> float | None:
    fractions = model.overall(record).fractions
    return getattr(fractions, c, None) if fractions is not None else None


def _verdict(record: Record) -> str:
    o = model.overall(record)
    if o.verdict:
        return o.verdict + (", provisional" if o.provisional is True else "")
    return "no verdict" if record.overall is not None else "-"


def ratio(a: dict | Record, b: dict | Record) -> float | None:
    """B's step time over A's (below 1: B is faster): the inverse of the speed-up, throughput
    over each run's window (:mod:`perfscope.steptime`)."""
    ma, mb = model.step_time(record_of(a)), model.step_time(record_of(b))
    return mb / ma if ma and mb is not None else None


def ratio_words(r: float | None) -> str:
    if r is None or not r > 0:  # a step time of 0 in a hand-edited summary: no ratio to invert
        return "step time ratio unknown"
    if abs(r - 1) < 0.005:
        return f"B/A {r:.2f}x: no change"
    return f"B/A {r:.2f}x: B is {1 / r:.2f}x faster" if r < 1 else f"B/A {r:.2f}x: B is {r:.2f}x slower"


def _mean_part(record: Record, columns) -> float | None:
    vals = [part_us(s, columns) for s in model.counted_steps(record)]
    return statistics.fmean(vals) if vals else None


def _median_col(record: Record, col: str) -> float | None:
    vals = [v for v in (num(s.get(col)) for s in model.counted_steps(record)) if v is not None]
    return statistics.median(vals) if vals else None


def metric_rows(a: dict | Record, b: dict | Record) -> list[tuple[str, str, str, str]]:
    """(metric, A, B, change) rows, already formatted (plain text)."""
    a, b = record_of(a), record_of(b)
    same_mode = a.mode == b.mode
    rows = [("verdict", _verdict(a), _verdict(b), "unchanged" if _verdict(a) == _verdict(b) else "changed"),
            _time_row("step time (window / steps)", model.step_time(a), model.step_time(b)),
            _time_row("median step (all rows, for reference)", model.overall(a).median_step_time_us,
                      model.overall(b).median_step_time_us)]
    rows += [_share_row(c, _frac(a, c), _frac(b, c)) for c in CLASS_ORDER]
    if same_mode:
        rows += [_time_row(f"{label} per step (mean)", _mean_part(a, cols), _mean_part(b, cols))
                 for _, label, _, cols in parts(str(a.mode))]
    rows.append(("steps counted", str(model.overall(a).steps_counted), str(model.overall(b).steps_counted), "-"))
    if same_mode:  # a count: kept apart from the millisecond rows above
        rows.append(_count_row(a, b))
    return rows + _run_rows(a, b)


def _run_rows(a: Record, b: Record) -> list[tuple[str, str, str, str]]:
    """Ranks analyzed, world size and mode of both runs."""
    def fact(r: Record, key: str) -> str:
        value = getattr(r.run, key) if r.run is not None else None
        return "-" if value is None else str(value)

    rows = [(label, fact(a, key), fact(b, key), "-")
            for key, label in (("ranks_analyzed", "ranks analyzed"), ("world_size", "world size"))]
    return rows + [("mode", a.mode or "-", b.mode or "-", "-")]


def _time_row(label: str, va: float | None, vb: float | None) -> tuple[str, str, str, str]:
    """A time (µs) in both runs, and its change in ms and as a ratio."""
    change = "-"
    if va is not None and vb is not None:
        change = f"{(vb - va) / 1000:+.2f} ms" + (f" ({vb / va:.2f}x)" if va else "")
    return (label, ms(va), ms(vb), change)


def _share_row(c: str, fa: float | None, fb: float | None) -> tuple[str, str, str, str]:
    change = f"{100 * (fb - fa) + 0.0:+.1f} pt" if fa is not None and fb is not None else "-"
    return (f"{c} share of step time", pct(fa), pct(fb), change)


def _count_row(a: Record, b: Record) -> tuple[str, str, str, str]:
    """Kernels (GPU) or operators (CPU) per step, median count, in runs of one mode."""
    gpu = a.mode == "gpu"
    ka, kb = _median_col(a, "kernel_count" if gpu else "operator_count"), _median_col(b, "kernel_count" if gpu else "operator_count")
    return (f"{'kernels' if gpu else 'operators'} per step (median count)",
            "-" if ka is None else f"{ka:,.0f}", "-" if kb is None else f"{kb:,.0f}",
            f"{kb - ka:+,.0f}" if ka is not None and kb is not None else "-")


def text_diff(a: dict | Record, b: dict | Record, label_a: str = "A", label_b: str = "B") -> str:
    """A few lines for the terminal: both runs, the verdict change, the step time ratio, the shares."""
    a, b = record_of(a), record_of(b)
    va, vb = _verdict(a), _verdict(b)
    sa, sb = model.step_time(a), model.step_time(b)
    shares = ", ".join(
        f"{c} {pct(_frac(a, c), 0)} -> {pct(_frac(b, c), 0)}" for c in CLASS_ORDER if c != "other" or a.mode == "gpu"
    )
    return "\n".join(safe(line) for line in [  # escaped per line: a name's newline cannot start a line
        f"A: {label_a}  {va}, step time {ms(sa)}",
        f"B: {label_b}  {vb}, step time {ms(sb)}",
        f"verdict: {va} -> {vb}" if va != vb else f"verdict: unchanged ({va})",
        f"step time (window / steps): {ms(sa)} -> {ms(sb)} ({ratio_words(ratio(a, b))})",
        f"share of step time: {shares}",
    ] + ([f"note: A is a {a.mode} run and B a {b.mode} run: their step times do not compare, only "
          "the shares"] if a.mode != b.mode else []) + _provisional_notes(a, b))


def _provisional_notes(a: Record, b: Record) -> list[str]:
    """A note for each run whose verdict is provisional: its figures are without the waits for a
    core, and what it measured."""
    out = []
    for key, r in (("A", a), ("B", b)):
        if model.overall(r).provisional is not True:
            continue
        wall = steptime.measured_step_time_us(model.counted_steps(r))
        out.append(f"note: {key}'s verdict is provisional (a busy machine): its step time and shares are without "
                   f"the waits for a core; {ms(wall)} as measured")
    return out


def _composition(a: Record, b: Record) -> str:
    """Two horizontal bars on one ms scale: the mean step of A and B split into the partition."""
    mode = str(a.mode)
    groups = parts(mode) if a.mode == b.mode else ()
    if not groups:
        return ""
    vals = {k: [(_mean_part(s, cols) or 0.0) / 1000 for _, _, _, cols in groups] for k, s in (("A", a), ("B", b))}
    rows = [{"label": key, "segments": [(v, colour, f"{key}: {label} {v:.2f} ms", "")
                                        for v, (_, label, colour, _) in zip(vals[key], groups)],
             "end": f"{sum(vals[key]):.2f} ms"} for key in ("A", "B")]
    svg = hbars("composition", rows, "mean step time of A and B by part",
                "mean time per step (ms), same scale for both runs", left=30, bar_h=22, gap=8)
    return figure(svg, "Mean step time of each run (counted steps, all ranks) split into the step "
                  "partition (ms).") + legend([(label, colour) for _, label, colour, _ in groups])


def _side(record: Record, key: str, label: str, y_max: float) -> str:
    head = (f'<h3>{esc(key)}: {esc(label)}</h3><p class="verdict"><strong>{esc(_verdict(record))}</strong>'
            f"<small>step time {ms(model.step_time(record))}; "
            + ", ".join(f"{esc(c)} {pct(_frac(record, c), 0)}" for c in CLASS_ORDER) + "</small></p>")
    mode = model.mode(record)
    steps, _ = steps_section.shown_steps(model.steps_on_verdict_clock(record))
    chart = steps_section.chart(steps, mode, y_max, key=f"steps-{key}") if steps else ""
    wif = model.what_if(record)
    lis = "".join(f"<li>{esc(verdict_section.what_if_sentence(c, wif[c], mode))}</li>" for c in wif)
    return head + chart + (f"<h3>What-if bounds</h3><ul>{lis}</ul>" if lis else "")


def speedup_words(speedup: dict) -> str:
    """The tuner's confirmed speed-up in one sentence (the figure its report and best.yaml state).

    Args:
        speedup: ``{ratio, low, high, rounds, unit}``: B's throughput over A's and its 95%
            interval (ratios), from ``rounds`` interleaved confirmation rounds, in ``unit``
            (samples/s or steps/s) over each run's measured window.
    """
    r, lo, hi = (num(speedup.get(k)) for k in ("ratio", "low", "high"))
    if r is None:
        return "speed-up unknown"
    interval = f" (95% interval {lo:.2f}x–{hi:.2f}x)" if lo is not None and hi is not None else ""
    rounds = num(speedup.get("rounds"))
    over = f" over {rounds:.0f} interleaved rounds" if rounds else ""
    return (f"B is {r:.2f}x faster{interval}: throughput ({speedup.get('unit') or 'samples/s'}) over the measured "
            f"window{over}")


def render_diff(a: dict | Record, b: dict | Record, label_a: str = "A", label_b: str = "B",
                speedup: dict | None = None) -> str:
    """The comparison page of two summary records (A before, B after; plain data or
    :class:`~perfscope.record.view.Record`).

    Args:
        speedup: The tuner's confirmed speed-up of B over A (:func:`speedup_words`); when given it
            is the page's headline figure, and the profiled steps' step time ratio is shown as
            what it is (a few profiled steps).

    Raises:
        PerfscopeError: a field of the wrong type (:func:`~perfscope.record.view.record_of`).
    """
    a, b = record_of(a), record_of(b)
    va, vb = _verdict(a), _verdict(b)
    rows = [("", [esc(m), esc(x), esc(y), esc(c)]) for m, x, y, c in metric_rows(a, b)]
    tab = table([("metric", "l"), ("A", ""), ("B", ""), ("change (B - A)", "")], rows,
                "Over each run's counted steps, all ranks. Shares change in percentage points (pt).")
    summary_sec = section("summary", "Change", _lead(a, b, speedup) + _composition(a, b))
    metrics_sec = section("metrics", "Metrics", tab)
    y_max = max([max(num(s.get("step_time_us")) or 0.0, num(s.get("wall_step_time_us")) or 0.0) / 1000
                 for s in model.steps_on_verdict_clock(a) + model.steps_on_verdict_clock(b)] + [0.0])
    sides = section("sides", "Side by side", f'<div class="cols"><div>{_side(a, "A", label_a, y_max)}</div>'
                    f'<div>{_side(b, "B", label_b, y_max)}</div></div>')
    header = (f'<h1>perfscope diff</h1><p class="muted">A: {esc(label_a)} (analyzed {esc(a.generated_at or "-")}) · '
              f'B: {esc(label_b)} (analyzed {esc(b.generated_at or "-")})</p>')
    nav = [("summary", "Change"), ("metrics", "Metrics"), ("sides", "Side by side")]
    return page(f"perfscope diff: {va} -> {vb}", header, nav, summary_sec + metrics_sec + sides)


def _lead(a: Record, b: Record, speedup: dict | None) -> str:
    """The verdict change and the step time ratio, or the tuner's confirmed speed-up first."""
    va, vb = _verdict(a), _verdict(b)
    sa, sb = model.step_time(a), model.step_time(b)
    change = (f"The verdict changed from <strong>{esc(va)}</strong> to <strong>{esc(vb)}</strong>." if va != vb
              else f"The verdict is unchanged: <strong>{esc(va)}</strong>.")
    r = ratio(a, b)
    if speedup:
        lead = (f'<p class="verdict">{esc(speedup_words(speedup))}.<small>{change} Step time of the profiled '
                f"steps {ms(sa)} → {ms(sb)} ({esc(ratio_words(r))}): a few steps each, not the "
                "speed-up figure.</small></p>")
    else:
        lead = (f'<p class="verdict">{change}<small>Step time {ms(sa)} → {ms(sb)} '
                f"({esc(ratio_words(r))}): each run's window over its steps, the inverse of throughput "
                "(docs/metrics.md, Step time).</small></p>")
    if a.mode != b.mode:
        lead += '<p class="warn">The runs are of different modes (GPU and CPU-only): only the shares compare.</p>'
    return lead + "".join(f'<p class="warn">{esc(n.removeprefix("note: "))}</p>' for n in _provisional_notes(a, b))


def write_diff(a: dict | Record, b: dict | Record, path: str | Path, label_a: str = "A", label_b: str = "B",
               speedup: dict | None = None) -> Path:
    """Render the comparison (:func:`render_diff`) and write it to ``path`` atomically."""
    return write_text_atomic(path, render_diff(a, b, label_a, label_b, speedup))
