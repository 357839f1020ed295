"""Notes and study facts: the tuner's notes, then what was tuned, how, and where the study lives."""

from __future__ import annotations

import shlex

from perfscope.record.tune_schema import Objective, Study, TuneRecord
from perfscope.reports.html import esc, note, num, section
from perfscope.reports.sections.tuning_record import word


def _args(value: list[str] | None) -> str:
    return (shlex.join(value) or "(none)") if value is not None else "(none)"


def facts(record: TuneRecord) -> list[tuple[str, str]]:
    study, objective = record.study or Study(), record.objective or Objective()
    items = [
        ("script", word(record.script)),
        ("arguments", _args(record.args)),
        ("processes per node", word(record.nproc_per_node)),
        ("study", word(study.name)),
        ("storage", word(study.storage)),
        ("trials planned", word(study.trials_target)),
        ("direction", word(study.direction, "maximize")),
        ("objective", f"{word(objective.unit, 'samples/s')} over the measured window"),
        ("warm-up steps", word(objective.warmup_steps)),
        ("measured steps", word(objective.measure_steps)),
        ("perfscope", word(record.perfscope_version)),
        ("record", f"{word(record.schema)} version {word(record.schema_version)}"),
        ("written at", word(record.generated_at)),
    ]
    conf = record.confirmation
    if conf is not None:
        gain = num(conf.min_gain)
        items.append(("confirmation", f"{word(conf.rounds)} rounds, confidence {word(conf.confidence)}, "
                      f"min_gain {gain:g}" if gain is not None else f"{word(conf.rounds)} rounds"))
    return items


def render(record: TuneRecord) -> str:
    notes = record.notes or []
    body = ("<ul>" + "".join(f"<li>{esc(word(n, n))}</li>" for n in notes) + "</ul>") if notes else note(
        "No notes.")
    dl = '<dl class="facts">' + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in facts(record)) + "</dl>"
    return section("notes", "Notes and study facts", body + "<h3>Study</h3>" + dl)
