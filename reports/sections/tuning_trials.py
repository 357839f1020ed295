"""Trial history: the chart of every trial's value (``tuning_history``) and the table of all trials."""

from __future__ import annotations

from perfscope.analysis.memory import NEAR_LIMIT_SHARE
from perfscope.record.tune_schema import Trial, TuneRecord
from perfscope.reports.html import esc, figure, note, num, section, table, truncate
from perfscope.reports.sections import tuning_history
from perfscope.reports.sections.tuning_record import (
    INFEASIBLE,
    amount,
    changes_text,
    failure_text,
    last_value,
    outcome,
    same_trial,
    seconds,
    trials,
    unit,
    word,
)


def _recommended(record: TuneRecord):
    rec = record.recommendation
    return rec.trial if rec is not None and rec.status == "faster" else None


def _value_cell(t: Trial) -> str:
    kind = outcome(t)
    v = num(t.value)
    if kind == "pruned":
        last = last_value(t)
        return f'<span class="muted">{amount(last)} (last)</span>' if last is not None else "-"
    if kind == INFEASIBLE:  # a failed run's value is the 0 the sampler was given; an unsafe one's is real
        return f'<span class="muted">{amount(v)}</span>' if v else "-"
    return amount(v)


def _problem_cell(t: Trial) -> str:
    text = failure_text(t)
    numerics = t.numerics
    if not text and numerics is not None and numerics.status == "not-visible" and outcome(t) == "complete":
        return '<span class="muted">loss not seen: numerics unchecked</span>'
    if not text:
        return ""
    cls = "warn" if outcome(t) == INFEASIBLE else "muted"
    return f'<span class="{cls}">{esc(truncate(text, 300))}</span>'


def _memory_cell(t: Trial) -> str:
    """The trial's peak memory (GiB) and headroom; flagged near the limit."""
    m = t.memory
    peak = num(m.peak_bytes) if m is not None else None
    if m is None or peak is None:
        return "-"
    share = num(m.headroom_share)
    text = f"{peak / 2**30:.2f} GiB" + (f" ({share:.0%} free)" if share is not None else "")
    if m.near_limit is True:
        return f'<span class="warn">{esc(text)}: near the limit</span>'
    return esc(text)


def trial_table(record: TuneRecord) -> str:
    recommended = _recommended(record)
    rows = []
    for t in trials(record):
        kind = outcome(t)
        role = word(t.role, "")
        config = changes_text(t.config, "your settings" if role == "baseline" else "no change")
        rc = "hl" if recommended is not None and same_trial(t.number, recommended) else (
            "cut" if kind in ("pruned", "running") else "")
        state = word(t.state)
        if kind == INFEASIBLE and state != "failed":
            state += " (infeasible)"
        rows.append((rc, [
            esc(word(t.number)), esc(role or "-"), esc(state), _value_cell(t), esc(truncate(config, 300)),
            esc(word(t.verdict)), _memory_cell(t), _problem_cell(t), seconds(t.duration_s),
        ]))
    return table(
        [("#", ""), ("role", "l"), ("state", "l"), (f"value ({unit(record)})", ""), ("configuration (changes)", "name"),
         ("verdict", "l"), ("peak memory", ""), ("failure / numerics", "l"), ("time", "")],
        rows,
        "Every trial in the study. Value: the throughput over the measured steps (all samples over the whole window); pruned trials show "
        "the last throughput so far they reported. Peak memory: of the profiled steps (device memory reserved on CUDA, "
        f"the resident set on the host), flagged below {NEAR_LIMIT_SHARE:.0%} headroom; a run out of memory fails as "
        "infeasible. The "
        "highlighted row is the recommendation.",
    )


def render(record: TuneRecord) -> str:
    title = "Trial history"
    rows = trials(record)
    if not rows:
        return section("trials", title, note("Not available: the record holds no trials."))
    svg, keys = tuning_history.chart(record, _recommended(record))
    u = unit(record)
    fig = ""
    if svg:
        fig = figure(svg, f"Each trial's value ({u} over its measured steps) by trial number. Pruned trials "
                     "are drawn at the last throughput so far they reported, infeasible ones (out of memory, crash, "
                     "timeout, unsafe loss) on the x axis; hover a marker for the trial's configuration and, for "
                     "a failure, its reason.") + keys
    else:
        fig = note("No trial has a value to draw yet.")
    _, skipped = tuning_history.points(record)
    if skipped and svg:
        names = ", ".join(f"{word(t.number)} ({word(t.state)})" for t in skipped)
        fig += note(f"Not drawn (no value reported): trial {names}.")
    return section("trials", title, f'<p class="muted">{esc(_counts_line(record, rows))}</p>' + fig + trial_table(record))


def _counts_line(record: TuneRecord, rows: list[Trial]) -> str:
    """``"6 trials; 5 of the 6 planned have finished (...): 4 complete, 1 pruned, 1 infeasible."``"""
    counts = {}
    for t in rows:
        counts[outcome(t)] = counts.get(outcome(t), 0) + 1
    target = num(record.study.trials_target) if record.study is not None else None
    # --trials counts finished trials (complete or pruned, as Optuna's MaxTrialsCallback does):
    # skipped duplicates, interrupted and running trials are listed but do not count.
    finished = sum(t.state in ("complete", "pruned") for t in rows)
    return (f"{len(rows)} trial" + ("s" if len(rows) != 1 else "")
            + (f"; {finished} of the {target:.0f} planned have finished (failed and running trials do not count)"
               if target is not None else "") + ": "
            + ", ".join(f"{n} {k}" for k, n in counts.items()) + ".")
