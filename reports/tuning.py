"""The tuning report (``report.html`` of ``perfscope tune``): one self-contained file, rendered from
the tuning record (``tune.json``, schema ``perfscope.tune``, docs/tune.md).

Sections, verdict first: the recommendation (or "keep your current settings" and why) with the
knobs it changes and links to the files beside it, the verdict before and after, the trial
history, parameter importances, the confirmation's intervals, the search space, notes and study
facts. Every part of the record is optional: what is missing says "not available", a value of
the wrong type shows as ``-``. Every string from the record is escaped; the page runs no script
and loads nothing; its only links are relative ones to the output folder's own files.
"""

from __future__ import annotations

from pathlib import Path

from perfscope.atomic import write_text_atomic
from perfscope.reports.html import esc, page
from perfscope.reports.sections import (
    tuning_confirm,
    tuning_headline,
    tuning_importances,
    tuning_notes,
    tuning_space,
    tuning_trials,
    tuning_verdicts,
)
from perfscope.record.tune_schema import TuneRecord
from perfscope.reports.sections.tuning_record import read, trials, unit, word

NAV = (("recommendation", "Recommendation"), ("verdicts", "Verdict before and after"), ("trials", "Trials"),
       ("importances", "Importances"), ("confirmation", "Confirmation"), ("space", "Search space"),
       ("notes", "Notes"))


def header(record: TuneRecord) -> str:
    n = len(trials(record))
    bits = [word(record.script, "tuned script"), f"{n} trial" + ("s" if n != 1 else ""),
            f"objective {unit(record)}", f"tuned {word(record.generated_at)}"]
    return f'<h1>perfscope tuning report</h1>\n<p class="muted">{" · ".join(esc(b) for b in bits)}</p>'


def render_tuning(record: dict | TuneRecord) -> str:
    """The tuning report page for a tuning record (as written to ``tune.json``).

    Args:
        record: The record (docs/tune-record.md), as plain data or read already. It is read
            leniently (:func:`perfscope.reports.sections.tuning_record.read`): a part missing or
            of the wrong type renders as "not available" or ``-``.
            ``best_config`` (set by ``tuner.record.write_outputs``) names the recommended
            configuration's file relative to the report; without it the link goes to ``best.yaml``.

    Returns:
        One self-contained HTML document (str).
    """
    record = read(record)
    body = "".join([
        tuning_headline.render(record),
        tuning_verdicts.render(record),
        tuning_trials.render(record),
        tuning_importances.render(record),
        tuning_confirm.render(record),
        tuning_space.render(record),
        tuning_notes.render(record),
    ])
    return page(f"perfscope tune: {tuning_headline.title(record)}", header(record), list(NAV), body)


def write_tuning(record: dict | TuneRecord, out_path: str | Path) -> Path:
    """Render the tuning report and write it to ``out_path`` atomically (parent folders created)."""
    return write_text_atomic(out_path, render_tuning(record))
