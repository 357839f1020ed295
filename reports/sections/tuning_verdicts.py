"""The verdict before and after: the baseline's bottleneck and the recommendation's, each with its
class shares as a stacked bar (the colours of the bottleneck report's evidence bar)."""

from __future__ import annotations

from perfscope.record.tune_schema import After, Baseline, TuneRecord
from perfscope.reports.html import esc, figure, legend, note, num, pct, section, table
from perfscope.reports.palette import CLASS_COLOURS, CLASS_ORDER
from perfscope.reports.sections.tuning_record import word
from perfscope.reports.plots import hbars


def _fractions(part: Baseline | After | None) -> dict[str, float | None]:
    f = (part.fractions if part is not None else None) or {}
    return {c: num(f.get(c)) for c in CLASS_ORDER}


def _ms_per_step(share: float | None, step_us: float | None) -> str:
    """A class's time per step (ms): its share of the step time."""
    return f"{share * step_us / 1000:.2f}" if share is not None and step_us is not None else "-"


def _bars(rows: list[tuple[str, dict]]) -> str:
    """One 100%-wide stacked bar per run: each class's share of that run's step time."""
    drawn = []
    for label, fr in rows:
        total = sum(max(v or 0.0, 0.0) for v in fr.values())
        segments = [(max(fr[c] or 0.0, 0.0) / total, CLASS_COLOURS[c], f"{label}: {c} {100 * (fr[c] or 0.0) / total:.1f}%",
                     f"{c} {100 * (fr[c] or 0.0) / total:.0f}%") for c in CLASS_ORDER] if total > 0 else []
        drawn.append({"label": label, "segments": segments, "end": "" if total > 0 else "no shares recorded"})
    return hbars("verdicts", drawn, "share of step time by class, before and after",
                 "share of step time (each bar is 100% of its run's counted steps)", bar_h=26, gap=10, right=30,
                 x_max=1.0, percent=True)


def _link(path) -> str:
    return f" ({esc(path)})" if isinstance(path, str) and path.strip() else ""


def render(record: TuneRecord) -> str:
    title = "Verdict before and after"
    base, after = record.baseline, record.after
    if base is None and after is None:
        return section("verdicts", title, note("Not available: the record holds neither profile."))
    fb, fa = _fractions(base), _fractions(after)
    rows = [("baseline", fb)] + ([("recommended", fa)] if after is not None else [])
    chart = figure(_bars(rows), "Each class's share of the counted steps' total time (all ranks), as in the "
                   "bottleneck report's evidence bar (docs/metrics.md).")
    chart += legend([(c, CLASS_COLOURS[c]) for c in CLASS_ORDER])
    return section("verdicts", title, _lead(base or Baseline(), after) + chart
                   + _class_table(base or Baseline(), after, fb, fa))


def _lead(base: Baseline, after: After | None) -> str:
    """The verdict before and after (or the baseline's alone), with where each profile is."""
    vb, va = word(base.verdict, "unknown"), word(after.verdict if after is not None else None, "unknown")
    if after is None:
        return (f'<p class="verdict">Baseline: <strong>{esc(vb)}</strong>.<small>After: not available (no '
                "recommended configuration was profiled).</small></p>")
    change = (f"The verdict changed from <strong>{esc(vb)}</strong> to <strong>{esc(va)}</strong>." if vb != va
              else f"The verdict is unchanged: <strong>{esc(vb)}</strong>.")
    return (f'<p class="verdict">{change}<small>Baseline profile{_link(base.summary)}, '
            f'recommendation profile{_link(after.summary)}: the bottleneck report of each has the '
            "details.</small></p>")


def _class_table(base: Baseline, after: After | None, fb: dict, fa: dict) -> str:
    """Each class's ms per step and share before and after, and the change."""
    sb, sa = num(base.step_time_us), num(after.step_time_us if after is not None else None)
    shown = after is not None
    table_rows = [("", ["step time", _ms_per_step(1.0, sb), _ms_per_step(1.0, sa) if shown else "-", "-", "-",
                        f"{(sa - sb) / 1000:+.2f} ms" if sa is not None and sb is not None else "-"])]
    table_rows += [("", [esc(c), _ms_per_step(fb[c], sb), _ms_per_step(fa[c], sa) if shown else "-",
                         pct(fb[c]), pct(fa[c]) if shown else "-", _change(fb[c], fa[c], sb, sa)]) for c in CLASS_ORDER]
    return table([("class", "l"), ("baseline ms/step", ""), ("recommended ms/step", ""), ("baseline share", ""),
                  ("recommended share", ""), ("change", "")], table_rows,
                 "Milliseconds per step of each class (its share of the profiled steps' step time, docs/metrics.md) "
                 "beside the shares: a faster run can hold a larger share of a smaller time. Change in ms per step "
                 "and in percentage points (pt).")


def _change(fb: float | None, fa: float | None, sb: float | None, sa: float | None) -> str:
    """``+x.xx ms (+y.y pt)``: a class's change in ms per step and in its share, "-" where unknown."""
    d = dms = "-"
    if fb is not None and fa is not None:
        d = f"{100 * (fa - fb) + 0.0:+.1f} pt"
        if sb is not None and sa is not None:
            dms = f"{(fa * sa - fb * sb) / 1000:+.2f} ms"
    return f"{esc(dms)} ({esc(d)})"
