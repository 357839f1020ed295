"""Verdict first: the run's bottleneck in words, the evidence, and what to change with what-if bounds."""

from __future__ import annotations

from perfscope.analysis.verdict import ADVICE, THRESHOLDS
from perfscope.analysis.waits import wait_shares
from perfscope.classes import MEANING, REMOVAL, TITLE
from perfscope.record.schema import OtherWaits, Overall
from perfscope.record.view import Record, record_of
from perfscope.reports import model
from perfscope.reports.sections import telemetry
from perfscope.reports.html import esc, figure, legend, ms, num, pct, section
from perfscope.reports.palette import CLASS_COLOURS, CLASS_ORDER
from perfscope.reports.svg import hbar

MIN_SPEEDUP = 1.01  # below this a removable class is not worth a recommendation
LISTED_SHARE_OF_THRESHOLD = 0.5
"""A cause other than the verdict's is listed as a change to make only from half its threshold up
(io or comm 5% of the step, launch 12.5%): far under it, a knob for it is not what the run needs."""


def what_if_sentence(cls: str, w: dict, mode: str) -> str:
    now, without = num(w.get("step_time_us")), num(w.get("step_time_without_us"))
    speedup = num(w.get("speedup")) or (now / without if now and without else None)
    x = f", about {speedup:.2f}x" if speedup else ""
    return (f"{REMOVAL[(cls, mode)]} would cut the step time from {ms(now)} to {ms(without)}{x} (removed step by "
            "step). This is an upper bound: it assumes nothing else takes the removed time's place.")


def _advice(record: Record, cls: str, mode: str) -> str:
    """The analysis's own advice for a class (fitted to the trace: a run replaying CUDA graphs is
    not told to use them); the generic line for summaries written before it was recorded."""
    given = model.details(record).advice
    fitted = getattr(given, cls, None) if given is not None else None
    return fitted if fitted is not None else ADVICE[(cls, mode)]


def _share(overall: Overall, cls: str) -> float | None:
    """``overall.fractions`` of a class (or ``other``), None where the record has none."""
    return getattr(overall.fractions, cls, None) if overall.fractions is not None else None


def _waits(record: Record) -> str:
    """When ``other`` is the largest share: say so, and what the GPU waited on."""
    overall = model.overall(record)
    if not overall.other_largest:
        return ""
    share = pct(_share(overall, "other"), 0)
    items = _wait_items(model.details(record).other_waits or OtherWaits())
    listing = f"<p>What the GPU waited on (docs/metrics.md, Other):</p><ul>{''.join(items)}</ul>" if items else ""
    return (f'<p class="warn"><strong>The largest share is other, {esc(share)} of step time</strong>: the GPU sat idle '
            "with its next work already queued, waiting on a dependency, which no single knob removes. The verdict "
            "above names the largest cause a knob does remove.</p>" + listing)


def _wait_items(waits: OtherWaits) -> list[str]:
    """A list item per cause of the GPU's waits with time of its own: its share and top calls."""
    return [_wait_item(cause, share, calls) for cause, share, calls in wait_shares(waits)]


def _wait_item(cause: str, share: float, calls: list) -> str:
    names = ", ".join(f"{k} {ms(v)}" for k, v in calls[:3])
    return f"<li>{esc(cause)}: {pct(share, 0)}{esc(' (' + names + ')') if names else ''}</li>"


def _ranked(wif: dict, verdict: str, overall: Overall | None = None) -> list[str]:
    """The causes worth recommending, the verdict's first, then by the step time left without them;
    another cause only where its share reaches :data:`LISTED_SHARE_OF_THRESHOLD` of its threshold."""
    ranked = sorted(wif, key=lambda c: num(wif[c].get("step_time_without_us")) or 0.0)
    ranked = [c for c in ranked if c == verdict or (
        (num(wif[c].get("speedup")) or 0.0) >= MIN_SPEEDUP
        and (overall is None or (_share(overall, c) or 0.0) >= LISTED_SHARE_OF_THRESHOLD * THRESHOLDS[c]))]
    if verdict in ranked:
        ranked.remove(verdict)
        ranked.insert(0, verdict)
    return ranked


def _recommendations(record: Record, mode: str) -> str:
    overall = model.overall(record)
    verdict = (overall.verdict or "").removesuffix("-bound")
    wif = model.what_if(record)
    ranked = _ranked(wif, verdict, overall)
    items = []
    if verdict == "compute":
        items.append((
            "compute", _advice(record, "compute", mode),
            "No what-if estimate: compute is the time the measured breakdown cannot remove; only faster "
            "kernels (or fewer of them) shorten it.",
        ))
    for c in ranked[:3]:
        items.append((c, _advice(record, c, mode), what_if_sentence(c, wif[c], mode)))
    if not items:
        return '<p class="muted">No removable cause costs enough to recommend a change.</p>'
    lis = "".join(
        f'<li><strong>{esc(TITLE[c])}</strong> ({esc(c)}, {pct(_share(overall, c), 0)} of step time). '
        f'{esc(advice)}<span class="whatif">{esc(w)}</span></li>'
        for c, advice, w in items
    )
    return f'<h3>What to change</h3><ol class="recs">{lis}</ol>'


def _no_verdict(overall: Overall) -> str:
    by = ", ".join(f"{n:.0f} {s}" for s, n in (overall.steps_by_status or {}).items())
    head = (f'<p class="verdict keep"><strong>No verdict</strong>: {esc(overall.reason or "no step could be classified")}.'
            f"<small>perfscope classifies only steps whose evidence is whole: not incomplete, not start-up, not on a "
            f"starved host{esc(' (steps here: ' + by + ')') if by else ''}; "
            'see <a href="#quality">Data quality</a> for each step.</small></p>')
    return section("verdict", "Verdict", head + f"<h3>What to do</h3><p>{esc(overall.advice or '')}</p>")


def render(summary: dict | Record) -> str:
    record = record_of(summary)
    mode = model.mode(record)
    overall = model.overall(record)
    if not overall.verdict:
        return _no_verdict(overall)
    return section("verdict", "Verdict", _headline(record, mode) + _cost(record) + _busy_host(overall) + _waits(record)
                   + _evidence(overall, mode) + _recommendations(record, mode))


def _cost(record: Record) -> str:
    """The console's cost line (``--price-per-hour``) and energy line, as paragraphs; empty without them."""
    from perfscope.console_views import cost_line, energy_line

    out = ""
    for css, title, line in (("cost", "Cost", cost_line(record)), ("energy", "Energy", energy_line(record))):
        if line:
            out += f'<p class="{css}"><strong>{title}</strong>: {esc(line.split(": ", 1)[1])}.</p>'
    return out


def _evidence(overall: Overall, mode: str) -> str:
    """The bar of each class's share of the step time, its caption and legend."""
    shares = {c: _share(overall, c) for c in CLASS_ORDER}
    total = sum(v or 0.0 for v in shares.values())
    bar = hbar([(c, shares[c] or 0.0, CLASS_COLOURS[c]) for c in CLASS_ORDER], total, "share of step time by class")
    thresholds = ", ".join(f"{c} {THRESHOLDS[c] * 100:.0f}%" for c in ("io", "comm", "launch"))
    caption = (
        "Evidence: each class's share of the total time of the counted steps (all ranks). io, comm and "
        f"launch are removable; one names the verdict when its share reaches its threshold ({thresholds}), "
        "else the run is compute-bound." + (" Other is GPU idle time waiting on dependencies." if mode == "gpu" else "")
    )
    return figure(bar, caption) + legend([(f"{c} {pct(shares[c])}", CLASS_COLOURS[c]) for c in CLASS_ORDER])


def _steps_named(record: Record, verdict: str) -> str:
    """How many steps carry the verdict, of those counted (or classified, when provisional)."""
    overall = model.overall(record)
    step_share = overall.step_share
    share = getattr(step_share, verdict.replace("-", "_"), None) if step_share is not None else None
    counted = len(model.counted_steps(record)) if overall.provisional is True else overall.steps_counted
    return f"{round(share * counted)} of {counted}" if share is not None and counted is not None else "-"


def _headline(record: Record, mode: str) -> str:
    """The verdict, what it means, its class's share and the step time it rests on."""
    overall = model.overall(record)
    verdict = overall.verdict
    cls = verdict.removesuffix("-bound")
    meaning = MEANING.get((cls, mode), "")
    provisional = overall.provisional is True
    headline = telemetry.headline(record)
    return (
        f'<p class="verdict"><strong>{esc(verdict)}{", provisional" if provisional else ""}</strong>'
        f'{": " + esc(meaning) if meaning else ""}.'
        f"<small>{esc(cls)} costs {pct(_share(overall, cls))} of the step time (runner-up "
        f"{esc(overall.runner_up or 'none')}); {esc(_steps_named(record, verdict))} "
        f"{'classified' if provisional else 'counted'} steps are {esc(verdict)}. "
        f"Step time {ms(model.step_time(record))}{' without the waits for a core' if provisional else ''} "
        f"(the window over its steps; representative step "
        f"{esc(model.representative_step(record))})"
        f"{esc('; ' + headline) if headline else ''}{esc(_over_ranks(record))}.</small></p>"
    )


def _over_ranks(record: Record) -> str:
    ranks = record.run.ranks_analyzed if record.run else None
    return f" over {ranks} rank" + ("s" if ranks != 1 else "") if ranks is not None else ""


def _busy_host(overall: Overall) -> str:
    """For a provisional verdict: what it rests on, and how to get one without the label."""
    if overall.provisional is not True:
        return ""
    from perfscope.console import contention_line

    line = contention_line(overall)
    return (f'<p class="warn"><strong>Provisional</strong>: no step had clean evidence. {esc(line[0].upper() + line[1:])}'
            ' (docs/metrics.md, "Provisional verdict"). Profile on a quieter machine, or with fewer busy processes, '
            "for a verdict without the label.</p>")
