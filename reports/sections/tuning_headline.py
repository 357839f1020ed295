"""Verdict first: the recommendation in one line, why, the objective's numbers, the knobs it changes
and links to the files next to the report."""

from __future__ import annotations

from perfscope.record.tune_schema import After, Baseline, Candidate, Recommendation, TuneRecord
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
    ratio,
    rounds,
    same_trial,
    unit,
    value_text,
    word,
)

FASTER, KEEP, UNDECIDED = "faster", "keep-current", "undecided"


def _status(record: TuneRecord) -> str | None:
    return record.recommendation.status if record.recommendation is not None else None


def _candidate_of(record: TuneRecord, trial) -> Candidate | None:
    return next((c for c in candidates(record) if same_trial(c.trial, trial)), None)


def changes(record: TuneRecord) -> list[tuple[str, str, str]]:
    """(knob, baseline value, recommended value) for each key the recommendation changes."""
    base = baseline_values(record)
    config = (record.recommendation.config if record.recommendation is not None else None) or {}
    return [(str(k), value_text(base.get(k)), value_text(v)) for k, v in config.items()]


def _unconfirmed(record: TuneRecord, cands: list[Candidate]) -> str:
    """Why the confirmation's best candidate is not a recommendation."""
    best = max(cands, key=lambda c: num(c.speedup) or 0.0)
    interval = interval_text(record, best.ci_low, best.ci_high, rounds(record, best))
    return (f"no candidate was confirmed faster beyond the noise: the best, trial {word(best.trial)}, "
            f"measured {ratio(best.speedup)}" + (f" ({interval})" if interval else "")
            + f", and a recommendation needs the whole interval above {1 + min_gain(record):.2f}x")


def why_keep(record: TuneRecord) -> str:
    """Why nothing is recommended, from what the record holds."""
    cands = candidates(record)
    if cands:
        return _unconfirmed(record, cands)
    if record.confirmation is not None:
        return "the confirmation measured no candidate"
    best = best_trial(record)
    base = record.baseline or Baseline()
    bv = num(base.value)
    if best is None or same_trial(best.number, base.trial) or (bv and num(best.value) <= bv):
        return "no trial of the search beat the baseline"
    gain = f", {ratio(num(best.value) / bv)} the baseline" if bv else ""
    return f"nothing was confirmed faster (the best trial of the search, {word(best.number)}, measured once{gain})"


def headline(record: TuneRecord) -> str:
    """The recommendation as one plain-text line (escaped by the caller)."""
    rec = record.recommendation or Recommendation()
    status = rec.status
    if status == FASTER:
        cand = _candidate_of(record, rec.trial)
        interval = interval_text(record, rec.ci_low, rec.ci_high, rounds(record, cand))
        speed = f"{ratio(rec.speedup)} faster" if num(rec.speedup) is not None else "Faster"
        knobs = ", ".join(f"{k} {b} → {v}" for k, b, v in changes(record)) or "no knob changes recorded"
        return speed + (f" ({interval})" if interval else "") + f": {knobs}"
    if status == KEEP:
        return f"Keep your current settings: {why_keep(record)}"
    if status == UNDECIDED:
        given = (rec.line or "").strip().removeprefix("undecided: ")
        return "Undecided, keep your current settings for now" + (f": {given}" if given else "")
    if record.decided_by == "interrupted":
        return "Interrupted before the answer: no best.yaml; the finished trials are kept" + (
            f"; to resume: {record.resume}" if record.resume else "")
    return "No recommendation in this record"


def _numbers(record: TuneRecord) -> str:
    u = unit(record)
    base = record.baseline or Baseline()
    rec = record.recommendation or Recommendation()
    objective = record.objective
    measure = num(objective.measure_steps) if objective is not None else None
    warmup = num(objective.warmup_steps) if objective is not None else None
    sentences = [f"Objective: {u} over "
                 + (f"{measure:.0f} measured steps" if measure is not None else "the measured steps")
                 + (f" after {warmup:.0f} warm-up steps" if warmup is not None else "") + ", higher is better."]
    sentences.append(f"Baseline (trial {word(base.trial)}, your settings): {amount(base.value)} {u}.")
    sentences += _best_sentence(record, rec, base, u)
    if rec.status == FASTER:
        sentences.append("The speed-up is the confirmation's: candidate and baseline measured again, interleaved, "
                         f"and the interval lies above {1 + min_gain(record):.2f}x.")
        sentences += _why_not_higher(record, rec)
    return " ".join(sentences)


def _best_sentence(record: TuneRecord, rec: Recommendation, base: Baseline, u: str) -> list[str]:
    """The recommended trial (or the search's best) against the baseline, unless it is the baseline."""
    chosen = find_trial(record, rec.trial) if rec.status == FASTER else None
    best = chosen or best_trial(record)
    if best is None or same_trial(best.number, base.trial):
        return []
    label = "Recommended" if chosen else "Best in the search"
    value, baseline = num(best.value), num(base.value)
    against = f" ({ratio(value / baseline)} the baseline)" if value is not None and baseline else ""
    return [f"{label}: trial {word(best.number)}, {amount(best.value)} {u} in the search{against}."]


def _why_not_higher(record: TuneRecord, rec: Recommendation) -> list[str]:
    """Why a candidate proven faster with a higher speed-up than the recommended one was passed
    over: the tuner recommends the largest gain *proven* (the interval's low end)."""
    chosen = _candidate_of(record, rec.trial) or Candidate()
    low, speed = num(chosen.ci_low), num(chosen.speedup)
    if low is None or speed is None:
        return []
    out = []
    for c in candidates(record):
        c_low, c_speed = num(c.ci_low), num(c.speedup)
        if c is not chosen and c.faster is True and _higher_but_lower_bound(c_low, c_speed, low, speed):
            out.append(f"Trial {word(c.trial)} measured a higher speed-up ({ratio(c_speed)}) but its interval "
                       f"starts lower ({ratio(c_low)} against {ratio(low)}): the recommendation is the largest gain "
                       "proven, the interval's low end.")
    return out


def _higher_but_lower_bound(c_low: float | None, c_speed: float | None, low: float, speed: float) -> bool:
    return c_low is not None and c_speed is not None and c_speed > speed and c_low <= low


def _best_config(record: TuneRecord) -> str | None:
    """The recommended configuration's file: its ``best_config`` name, else ``best.yaml`` once
    there is a recommendation."""
    if record.best_config is not None:
        return record.best_config
    return "best.yaml" if record.recommendation is not None else None


def links(record: TuneRecord) -> str:
    """Relative links to the files beside the report that the record names (best.yaml by its
    ``best_config`` name, else ``best.yaml`` once there is a recommendation)."""
    after = record.after or After()
    items = [
        (_best_config(record), "recommended configuration" if _status(record) == FASTER else "empty: keep your settings"),
        ((record.baseline or Baseline()).report, "the baseline's profile"),
        (after.report, "the recommendation's profile"),
        (after.diff, "baseline and recommendation side by side"),
    ]
    out = []
    for path, what in items:
        href = local_href(path)
        if href:
            out.append(f'<a href="{esc(href)}">{esc(path.strip())}</a> <span class="muted">({esc(what)})</span>')
        elif path and path.strip():  # outside the folder (an absolute path): named, not linked
            out.append(f'{esc(path.strip())} <span class="muted">({esc(what)})</span>')
    return '<p class="links">Files: ' + " · ".join(out) + "</p>" if out else ""


def render(record: TuneRecord) -> str:
    rec = record.recommendation
    line = headline(record)
    cls = "verdict" + (" keep" if _status(record) != FASTER else "")
    given = (rec or Recommendation()).line
    extra = ""
    if given and given.strip() and given.strip() != line:
        extra = f" The tuner's summary: {given.strip()}"
    head = (f'<p class="{cls}"><strong>{esc(line)}</strong>'
            f"<small>{esc(_numbers(record) + extra)}</small></p>")
    return section("recommendation", "Recommendation", head + _changes_body(record, rec) + links(record))


def _changes_body(record: TuneRecord, rec: Recommendation | None) -> str:
    """The recommendation's changed keys as a table (or why there is none), and its hint."""
    if rec is None:
        return note("Not available: the record holds no recommendation (the tuning may not have finished).")
    status = rec.status
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
    hint = rec.hint
    if status == FASTER and hint is not None and hint.strip():
        body += note("Next: " + hint.strip())
    return body


def title(record: TuneRecord) -> str:
    """A short page title: ``1.80x faster`` or ``keep current settings``."""
    rec = record.recommendation or Recommendation()
    if rec.status == FASTER:
        return f"{ratio(rec.speedup)} faster" if num(rec.speedup) is not None else "faster"
    if rec.status == UNDECIDED:
        return "undecided"
    return "keep current settings" if rec.status == KEEP else "tuning report"
