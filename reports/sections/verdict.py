"""Verdict first: the run's bottleneck in words, the evidence, and what to change with what-if bounds."""

from __future__ import annotations

from perfscope.analysis.verdict import ADVICE, THRESHOLDS
from perfscope.analysis.waits import wait_shares
from perfscope.classes import MEANING, REMOVAL, TITLE
from perfscope.reports import model
from perfscope.reports.sections import telemetry
from perfscope.reports.html import esc, figure, legend, ms, num, pct, section
from perfscope.reports.palette import CLASS_COLOURS, CLASS_ORDER
from perfscope.reports.svg import hbar

MIN_SPEEDUP = 1.01  # below this a removable class is not worth a recommendation


def _mode(summary: dict) -> str:
    return "gpu" if summary.get("mode") == "gpu" else "cpu"


def what_if_sentence(cls: str, w: dict, mode: str) -> str:
    now, without = num(w.get("step_time_us")), num(w.get("step_time_without_us"))
    speedup = num(w.get("speedup")) or (now / without if now and without else None)
    x = f", about {speedup:.2f}x" if speedup else ""
    return (f"{REMOVAL[(cls, mode)]} would cut the step time from {ms(now)} to {ms(without)}{x} (removed step by "
            "step). This is an upper bound: it assumes nothing else takes the removed time's place.")


def _advice(summary: dict, cls: str, mode: str) -> str:
    """The analysis's own advice for a class (fitted to the trace: a run replaying CUDA graphs is
    not told to use them); the generic line for summaries written before it was recorded."""
    given = model.details(summary).get("advice")
    if isinstance(given, dict) and isinstance(given.get(cls), str):
        return given[cls]
    return ADVICE[(cls, mode)]


def _waits(summary: dict) -> str:
    """When ``other`` is the largest share: say so, and what the GPU waited on."""
    overall = summary.get("overall") or {}
    if not overall.get("other_largest"):
        return ""
    share = pct((overall.get("fractions") or {}).get("other"), 0)
    items = _wait_items(model.details(summary).get("other_waits") or {})
    listing = f"<p>What the GPU waited on (docs/metrics.md, Other):</p><ul>{''.join(items)}</ul>" if items else ""
    return (f'<p class="warn"><strong>The largest share is other, {esc(share)} of step time</strong>: the GPU sat idle '
            "with its next work already queued, waiting on a dependency, which no single knob removes. The verdict "
            "above names the largest cause a knob does remove.</p>" + listing)


def _wait_items(waits: dict) -> list[str]:
    """A list item per cause of the GPU's waits with time of its own: its share and top calls."""
    return [_wait_item(cause, share, calls) for cause, share, calls in wait_shares(waits)]


def _wait_item(cause: str, share: float, calls: list) -> str:
    names = ", ".join(f"{k} {ms(v)}" for k, v in calls[:3])
    return f"<li>{esc(cause)}: {pct(share, 0)}{esc(' (' + names + ')') if names else ''}</li>"


def _ranked(wif: dict, verdict: str) -> list[str]:
    """The causes worth recommending, the verdict's first, then by the step time left without them."""
    ranked = sorted(wif, key=lambda c: num(wif[c].get("step_time_without_us")) or 0.0)
    ranked = [c for c in ranked if (num(wif[c].get("speedup")) or 0.0) >= MIN_SPEEDUP or c == verdict]
    if verdict in ranked:
        ranked.remove(verdict)
        ranked.insert(0, verdict)
    return ranked


def _recommendations(summary: dict, mode: str) -> str:
    overall = summary.get("overall") or {}
    verdict = str(overall.get("verdict") or "").removesuffix("-bound")
    wif = model.what_if(summary)
    ranked = _ranked(wif, verdict)
    items = []
    if verdict == "compute":
        items.append((
            "compute", _advice(summary, "compute", mode),
            "No what-if estimate: compute is the time the measured breakdown cannot remove; only faster "
            "kernels (or fewer of them) shorten it.",
        ))
    for c in ranked[:3]:
        items.append((c, _advice(summary, c, mode), what_if_sentence(c, wif[c], mode)))
    if not items:
        return '<p class="muted">No removable cause costs enough to recommend a change.</p>'
    lis = "".join(
        f'<li><strong>{esc(TITLE[c])}</strong> ({esc(c)}, {pct((overall.get("fractions") or {}).get(c), 0)} of step time). '
        f'{esc(advice)}<span class="whatif">{esc(w)}</span></li>'
        for c, advice, w in items
    )
    return f'<h3>What to change</h3><ol class="recs">{lis}</ol>'


def _no_verdict(summary: dict) -> str:
    overall = summary.get("overall") or {}
    counts = overall.get("steps_by_status") or {}
    by = ", ".join(f"{n} {s}" for s, n in counts.items()) if isinstance(counts, dict) else ""
    head = (f'<p class="verdict keep"><strong>No verdict</strong>: {esc(overall.get("reason") or "no step could be classified")}.'
            f"<small>perfscope classifies only steps whose evidence is whole: not incomplete, not start-up, not on a "
            f"starved host{esc(' (steps here: ' + by + ')') if by else ''}; "
            'see <a href="#quality">Data quality</a> for each step.</small></p>')
    return section("verdict", "Verdict", head + f"<h3>What to do</h3><p>{esc(overall.get('advice', ''))}</p>")


def render(summary: dict) -> str:
    mode = _mode(summary)
    overall = summary.get("overall") or {}
    if "verdict" in overall and not overall.get("verdict"):
        return _no_verdict(summary)
    return section("verdict", "Verdict", _headline(summary, mode) + _busy_host(overall) + _waits(summary)
                   + _evidence(overall.get("fractions") or {}, mode) + _recommendations(summary, mode))


def _evidence(fractions: dict, mode: str) -> str:
    """The bar of each class's share of the step time, its caption and legend."""
    total = sum(num(fractions.get(c)) or 0.0 for c in CLASS_ORDER)
    bar = hbar([(c, num(fractions.get(c)) or 0.0, CLASS_COLOURS[c]) for c in CLASS_ORDER], total,
               "share of step time by class")
    thresholds = ", ".join(f"{c} {THRESHOLDS[c] * 100:.0f}%" for c in ("io", "comm", "launch"))
    caption = (
        "Evidence: each class's share of the total time of the counted steps (all ranks). io, comm and "
        f"launch are removable; one names the verdict when its share reaches its threshold ({thresholds}), "
        "else the run is compute-bound." + (" Other is GPU idle time waiting on dependencies." if mode == "gpu" else "")
    )
    return figure(bar, caption) + legend([(f"{c} {pct(fractions.get(c))}", CLASS_COLOURS[c]) for c in CLASS_ORDER])


def _steps_named(summary: dict, verdict: str) -> str:
    """How many steps carry the verdict, of those counted (or classified, when provisional)."""
    overall = summary.get("overall") or {}
    share = num((overall.get("step_share") or {}).get(verdict))
    if overall.get("provisional") is True:
        counted = len(model.counted_steps(summary))
    else:
        counted = overall.get("steps_counted")
    return f"{round(share * counted)} of {counted}" if share is not None and isinstance(counted, int) else "-"


def _headline(summary: dict, mode: str) -> str:
    """The verdict, what it means, its class's share and the step time it rests on."""
    overall = summary.get("overall") or {}
    verdict = str(overall.get("verdict", "unknown"))
    cls = verdict.removesuffix("-bound")
    meaning = MEANING.get((cls, mode), "")
    provisional = overall.get("provisional") is True
    headline = telemetry.headline(summary)
    return (
        f'<p class="verdict"><strong>{esc(verdict)}{", provisional" if provisional else ""}</strong>'
        f'{": " + esc(meaning) if meaning else ""}.'
        f"<small>{esc(cls)} costs {pct((overall.get('fractions') or {}).get(cls))} of the step time (runner-up "
        f"{esc(overall.get('runner_up', '-'))}); {esc(_steps_named(summary, verdict))} "
        f"{'classified' if provisional else 'counted'} steps are {esc(verdict)}. "
        f"Step time {ms(model.step_time(summary))}{' without the waits for a core' if provisional else ''} "
        f"(the window over its steps; representative step "
        f"{esc(model.representative_step(summary))})"
        f"{esc('; ' + headline) if headline else ''}{esc(_over_ranks(summary))}.</small></p>"
    )


def _over_ranks(summary: dict) -> str:
    ranks = (summary.get("run") or {}).get("ranks_analyzed")
    return f" over {ranks} rank" + ("s" if ranks != 1 else "") if isinstance(ranks, int) else ""


def _busy_host(overall: dict) -> str:
    """For a provisional verdict: what it rests on, and how to get one without the label."""
    if overall.get("provisional") is not True:
        return ""
    from perfscope.console import contention_line

    line = contention_line(overall)
    return (f'<p class="warn"><strong>Provisional</strong>: no step had clean evidence. {esc(line[0].upper() + line[1:])}'
            ' (docs/metrics.md, "Provisional verdict"). Profile on a quieter machine, or with fewer busy processes, '
            "for a verdict without the label.</p>")
