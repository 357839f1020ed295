"""Notes and study facts: the tuner's notes, then what was tuned, how, and where the study lives."""

from __future__ import annotations

import shlex

from perfscope.reports.html import esc, note, num, section
from perfscope.reports.sections.tuning_record import obj, seq, word


def _args(value) -> str:
    if isinstance(value, list):
        return shlex.join(str(a) for a in value) or "(none)"
    return word(value, "(none)")


def facts(record: dict) -> list[tuple[str, str]]:
    study, objective = obj(record.get("study")), obj(record.get("objective"))
    items = [
        ("script", word(record.get("script"))),
        ("arguments", _args(record.get("args"))),
        ("processes per node", word(record.get("nproc_per_node"))),
        ("study", word(study.get("name"))),
        ("storage", word(study.get("storage"))),
        ("trials planned", word(study.get("trials_target"))),
        ("direction", word(study.get("direction"), "maximize")),
        ("objective", f"{word(objective.get('unit'), 'samples/s')} over the measured window"),
        ("warm-up steps", word(objective.get("warmup_steps"))),
        ("measured steps", word(objective.get("measure_steps"))),
        ("perfscope", word(record.get("perfscope_version"))),
        ("record", f"{word(record.get('schema'))} version {word(record.get('schema_version'))}"),
        ("written at", word(record.get("generated_at"))),
    ]
    conf = obj(record.get("confirmation"))
    if conf:
        gain = num(conf.get("min_gain"))
        items.append(("confirmation", f"{word(conf.get('rounds'))} rounds, confidence {word(conf.get('confidence'))}, "
                      f"min_gain {gain:g}" if gain is not None else f"{word(conf.get('rounds'))} rounds"))
    return items


def render(record: dict) -> str:
    notes = [n for n in seq(record.get("notes")) if n is not None]
    body = ("<ul>" + "".join(f"<li>{esc(word(n, str(n)))}</li>" for n in notes) + "</ul>") if notes else note(
        "No notes.")
    dl = '<dl class="facts">' + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in facts(record)) + "</dl>"
    return section("notes", "Notes and study facts", body + "<h3>Study</h3>" + dl)
