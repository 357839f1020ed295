"""The report-section contract (:class:`perfscope.reports.bottleneck.Section`): a section that a
summary shows renders one ``<section>`` carrying its anchor, with a nav label, so that the page's
nav and body, both built from ``SECTIONS``, agree."""

from __future__ import annotations

import re

from perfscope.record.view import Record, record_of
from perfscope.reports.bottleneck import Section, Traces
from perfscope.reports.sections.timeline import no_timeline
from perfscope.testing import expect

_SECTION = re.compile(r'<section id="([^"]*)">')


def check_section(section: Section, summary: dict | Record, drawn: Traces | None = None) -> None:
    """``section`` keeps its contract on ``summary`` (a record as plain data, or the
    :class:`~perfscope.record.view.Record` the sections are given): a plain anchor, a label, and
    where it shows, exactly one ``<section id="ANCHOR">`` in what it renders (``drawn``: the
    timeline's content; default: the note that there are no traces)."""
    record = record_of(summary)
    expect(re.fullmatch(r"[a-z][a-z0-9-]*", section.anchor or ""), f"{section.anchor!r}: not a plain anchor")
    label = section.label(record)
    expect(isinstance(label, str) and label.strip(), f"{section.anchor}: no nav label")
    if not section.shows(record):
        return
    html = section.render(record, drawn or Traces(no_timeline(None)))
    expect(isinstance(html, str), f"{section.anchor}: render returned {type(html).__name__}, not HTML text")
    ids = _SECTION.findall(html)
    expect(ids == [section.anchor], f"{section.anchor}: renders sections {ids}, not one of its anchor")


def check_sections(sections: tuple[Section, ...], summary: dict | Record) -> None:
    """Every section of ``sections`` keeps the contract, and no two share an anchor."""
    anchors = [s.anchor for s in sections]
    expect(len(anchors) == len(set(anchors)), f"two sections share an anchor: {anchors}")
    for section in sections:
        check_section(section, summary)
