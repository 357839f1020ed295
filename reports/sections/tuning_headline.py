"""Verdict first: the recommendation in one line, why, the objective's numbers, the knobs it changes
and links to the files next to the report."""

from __future__ import annotations

from perfscope.reports.html import esc, note, num, section, table
from perfscope.reports.sections.tuning_record import (
    amount,
    baseline_values,
    best_trial,
    candidates,
    find_trial,
    interval_text,
    local_href,
    min_gain,
    obj,
    ratio,
    rounds,
    same_trial,
    unit,
    value_text,
    word,
)

FASTER, KEEP = "faster", "keep-current"


def _candidate_of(record: dict, trial) -> dict | None:
    return next((c for c in candidates(record) if same_trial(c.get("trial"), trial)), None)


def changes(record: dict) -> list[tuple[str, str, str]]:
    """(knob, baseline value, recommended value) for each key the recommendation changes."""
    base = baseline_values(record)
    config = obj(obj(record.get("recommendation")).get("config"))
    return [(str(k), value_text(base.get(k)), value_text(v)) for k, v in config.items()]


def why_keep(record: dict) -> str:
    """Why nothing is recommended, from what the record holds."""
    cands = candidates(record)
    threshold = 1 + min_gain(record)
    if cands:
        best = max(cands, key=lambda c: num(c.get("speedup")) or 0.0)
        interval = interval_text(record, best.get("ci_low"), best.get("ci_high"), rounds(record, best))
        return (f"no candidate was confirmed faster beyond the noise: the best, trial {word(best.get('trial'))}, "
                f"measured {ratio(best.get('speedup'))}" + (f" ({interval})" if interval else "")
                + f", and a recommendation needs the whole interval above {threshold:.2f}x")
    if obj(record.get("confirmation")):
        return "the confirmation measured no candidate"
    best = best_trial(record)
    base = obj(record.get("baseline"))
    bv = num(base.get("value"))
    if best is None or same_trial(best.get("number"), base.get("trial")) or (bv and num(best.get("value")) <= bv):
        return "no trial of the search beat the baseline"
    gain = f", {ratio(num(best.get('value')) / bv)} the baseline" if bv else ""
    return f"nothing was confirmed faster (the best trial of the search, {word(best.get('number'))}, measured once{gain})"


def headline(record: dict) -> str:
    """The recommendation as one plain-text line (escaped by the caller)."""
    rec = obj(record.get("recommendation"))
    status = rec.get("status")
    if status == FASTER:
        cand = _candidate_of(record, rec.get("trial"))
        interval = interval_text(record, rec.get("ci_low"), rec.get("ci_high"), rounds(record, cand))
        speed = f"{ratio(rec.get('speedup'))} faster" if num(rec.get("speedup")) is not None else "Faster"
        knobs = ", ".join(f"{k} {b} → {v}" for k, b, v in changes(record)) or "no knob changes recorded"
        return speed + (f" ({interval})" if interval else "") + f": {knobs}"
    if status == KEEP:
        return f"Keep your current settings: {why_keep(record)}"
    return "No recommendation in this record"


def _numbers(record: dict) -> str:
    u = unit(record)
    objective = obj(record.get("objective"))
    base = obj(record.get("baseline"))
    rec = obj(record.get("recommendation"))
    measure, warmup = num(objective.get("measure_steps")), num(objective.get("warmup_steps"))
    sentences = [f"Objective: {u} over "
                 + (f"{measure:.0f} measured steps" if measure is not None else "the measured steps")
                 + (f" after {warmup:.0f} warm-up steps" if warmup is not None else "") + ", higher is better."]
    sentences.append(f"Baseline (trial {word(base.get('trial'))}, your settings): {amount(base.get('value'))} {u}.")
    sentences += _best_sentence(record, rec, base, u)
    if rec.get("status") == FASTER:
        sentences.append("The speed-up is the confirmation's: candidate and baseline measured again, interleaved, "
                         f"and the interval lies above {1 + min_gain(record):.2f}x.")
        sentences += _why_not_higher(record, rec)
    return " ".join(sentences)


def _best_sentence(record: dict, rec: dict, base: dict, u: str) -> list[str]:
    """The recommended trial (or the search's best) against the baseline, unless it is the baseline."""
    chosen = find_trial(record, rec.get("trial")) if rec.get("status") == FASTER else None
    best = chosen or best_trial(record)
    if best is None or same_trial(best.get("number"), base.get("trial")):
        return []
    label = "Recommended" if chosen else "Best in the search"
    value, baseline = num(best.get("value")), num(base.get("value"))
    against = f" ({ratio(value / baseline)} the baseline)" if value is not None and baseline else ""
    return [f"{label}: trial {word(best.get('number'))}, {amount(best.get('value'))} {u} in the search{against}."]


def _why_not_higher(record: dict, rec: dict) -> list[str]:
    """Why a candidate proven faster with a higher speed-up than the recommended one was passed
    over: the tuner recommends the largest gain *proven* (the interval's low end)."""
    chosen = _candidate_of(record, rec.get("trial"))
    low, speed = num(obj(chosen).get("ci_low")), num(obj(chosen).get("speedup"))
    if low is None or speed is None:
        return []
    out = []
    for c in candidates(record):
        c_low, c_speed = num(c.get("ci_low")), num(c.get("speedup"))
        if c is chosen or c.get("faster") is not True or c_low is None or c_speed is None:
            continue
        if c_speed > speed and c_low <= low:
            out.append(f"Trial {word(c.get('trial'))} measured a higher speed-up ({ratio(c_speed)}) but its interval "
                       f"starts lower ({ratio(c_low)} against {ratio(low)}): the recommendation is the largest gain "
                       "proven, the interval's low end.")
    return out


def links(record: dict) -> str:
    """Relative links to the files beside the report that the record names (best.yaml by its
    ``best_config`` name, else ``best.yaml`` once there is a recommendation)."""
    after, rec = obj(record.get("after")), obj(record.get("recommendation"))
    best = record.get("best_config") if isinstance(record.get("best_config"), str) else "best.yaml" if rec else None
    items = [
        (best, "recommended configuration" if rec.get("status") == FASTER else "empty: keep your settings"),
        (obj(record.get("baseline")).get("report"), "the baseline's profile"),
        (after.get("report"), "the recommendation's profile"),
        (after.get("diff"), "baseline and recommendation side by side"),
    ]
    out = []
    for path, what in items:
        href = local_href(path)
        if href:
            out.append(f'<a href="{esc(href)}">{esc(path.strip())}</a> <span class="muted">({esc(what)})</span>')
        elif isinstance(path, str) and path.strip():  # outside the folder (an absolute path): named, not linked
            out.append(f'{esc(path.strip())} <span class="muted">({esc(what)})</span>')
    return '<p class="links">Files: ' + " · ".join(out) + "</p>" if out else ""


def render(record: dict) -> str:
    rec = obj(record.get("recommendation"))
    line = headline(record)
    status = rec.get("status")
    cls = "verdict" + (" keep" if status != FASTER else "")
    given = rec.get("line")
    extra = ""
    if isinstance(given, str) and given.strip() and given.strip() != line:
        extra = f" The tuner's summary: {given.strip()}"
    head = (f'<p class="{cls}"><strong>{esc(line)}</strong>'
            f"<small>{esc(_numbers(record) + extra)}</small></p>")
    return section("recommendation", "Recommendation", head + _changes_body(record, rec) + links(record))


def _changes_body(record: dict, rec: dict) -> str:
    """The recommendation's changed keys as a table (or why there is none), and its hint."""
    if not rec:
        return note("Not available: the record holds no recommendation (the tuning may not have finished).")
    status = rec.get("status")
    rows = changes(record)
    if rows:
        body = table([("knob", "name"), ("baseline", "l"), ("recommended", "l")],
                     [("", [esc(k), esc(b), esc(v)]) for k, b, v in rows],
                     "The configuration keys the recommendation changes (best.yaml holds exactly these; "
                     "meanings in docs/runtime.md).")
    elif status == FASTER:
        body = note("The record lists no changed key for the recommendation.")
    else:
        body = note("Nothing to change: best.yaml is an empty mapping.")
    hint = rec.get("hint")
    if status == FASTER and isinstance(hint, str) and hint.strip():
        body += note("Next: " + hint.strip())
    return body


def title(record: dict) -> str:
    """A short page title: ``1.80x faster`` or ``keep current settings``."""
    rec = obj(record.get("recommendation"))
    if rec.get("status") == FASTER:
        return f"{ratio(rec.get('speedup'))} faster" if num(rec.get("speedup")) is not None else "faster"
    return "keep current settings" if rec.get("status") == KEEP else "tuning report"
