"""Search space: the knobs searched (group, choices, the baseline's value), the knobs left out and why,
and the verdict and bottleneck order the space was shaped by; the groups' legend comes from the
record (``space.groups``), so an old record renders with what it was made with."""

from __future__ import annotations

from perfscope.record.tune_schema import Space, TuneRecord
from perfscope.reports.html import esc, note, section, table
from perfscope.reports.sections.tuning_record import value_text, word

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


def render(record: TuneRecord) -> str:
    title = "Search space"
    space = record.space
    if space is None:
        return section("space", title, note("Not available: the record holds no search space."))
    return section("space", title, _lead(space) + _body(space))


def _lead(space: Space) -> str:
    """What shaped the space: the baseline's verdict, the share a bottleneck needs, their order."""
    order = [_LEGACY_ORDER.get(word(g), word(g)) for g in space.order or []]
    return (f'<p>Shaped by the baseline\'s verdict, <strong>{esc(word(space.verdict, "unknown"))}</strong>: '
            "a knob is searched when it can apply to this script and the bottleneck it removes takes "
            + esc(_share(space.min_share)) + " of the step time. Bottlenecks in order of their share of step time: "
            + (esc(" → ".join(order)) if order else "not recorded") + ".</p>")


def _body(space: Space) -> str:
    """The knobs searched, those left out and why, and the groups' legend."""
    searched = space.searched
    if searched:
        rows = [("", [esc(word(k.name)), esc(word(k.group)), esc(_choices(k.choices)),
                      esc(value_text(k.baseline))]) for k in searched]
        body = table([("knob", "name"), ("group", "l"), ("choices", "l"), ("baseline", "l")], rows,
                     "The knobs the search varied (meanings in docs/runtime.md); baseline: the script's own "
                     "setting, unset where the runtime leaves it to the script.")
    else:
        body = note("No knob was searched.")
    excluded = space.excluded
    if excluded:
        rows = [("", [esc(k), esc(word(v, "no reason recorded"))]) for k, v in excluded.items()]
        body += table([("knob", "name"), ("why it was left out", "l")], rows, "Knobs left out of the search.")
    else:
        body += note("No knob was left out.")
    legend = space.groups
    if legend:
        body += '<p class="muted">' + esc("; ".join(f"{word(g)}: {word(t)}" for g, t in legend.items())) + ".</p>"
    return body
