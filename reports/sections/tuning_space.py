"""Search space: the knobs searched (group, choices, the baseline's value), the knobs left out and why,
and the verdict and bottleneck order the space was shaped by; the groups' legend comes from the
record (``space.groups``), so an old record renders with what it was made with."""

from __future__ import annotations

from perfscope.reports.html import esc, note, section, table
from perfscope.reports.sections.tuning_record import dicts, obj, seq, value_text, word

# The bottleneck names of tuning records written before the knob groups (``order`` held group names).
_LEGACY_ORDER = {"input": "io", "precision": "compute", "communication": "comm"}


def _share(value) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1:
        return f"at least {value:.0%}"
    return "a visible share"  # a record from before the threshold was recorded


def _choices(value) -> str:
    if isinstance(value, list):
        return ", ".join(value_text(v) for v in value)
    return word(value)


def render(record: dict) -> str:
    title = "Search space"
    space = obj(record.get("space"))
    if not space:
        return section("space", title, note("Not available: the record holds no search space."))
    order = [_LEGACY_ORDER.get(word(g), word(g)) for g in seq(space.get("order"))]
    lead = (f'<p>Shaped by the baseline\'s verdict, <strong>{esc(word(space.get("verdict"), "unknown"))}</strong>: '
            "a knob is searched when it can apply to this script and the bottleneck it removes takes "
            + esc(_share(space.get("min_share"))) + " of the step time. Bottlenecks in order of their share of step time: "
            + (esc(" → ".join(order)) if order else "not recorded") + ".</p>")
    searched = dicts(space.get("searched"))
    if searched:
        rows = [("", [esc(word(k.get("name"))), esc(word(k.get("group"))), esc(_choices(k.get("choices"))),
                      esc(value_text(k.get("baseline")))]) for k in searched]
        body = table([("knob", "name"), ("group", "l"), ("choices", "l"), ("baseline", "l")], rows,
                     "The knobs the search varied (meanings in docs/runtime.md); baseline: the script's own "
                     "setting, unset where the runtime leaves it to the script.")
    else:
        body = note("No knob was searched.")
    excluded = obj(space.get("excluded"))
    if excluded:
        rows = [("", [esc(k), esc(word(v, "no reason recorded"))]) for k, v in excluded.items()]
        body += table([("knob", "name"), ("why it was left out", "l")], rows, "Knobs left out of the search.")
    else:
        body += note("No knob was left out.")
    legend = obj(space.get("groups"))
    if legend:
        body += '<p class="muted">' + esc("; ".join(f"{word(g)}: {word(t)}" for g, t in legend.items())) + ".</p>"
    return section("space", title, lead + body)
