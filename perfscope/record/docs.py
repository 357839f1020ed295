"""``docs/summary.md`` and ``docs/tune-record.md``, generated from the schemas
(:mod:`perfscope.record.schema`, :mod:`perfscope.record.tune_schema`): one table per object of
the record, from its struct's docstring and its fields' descriptions and types.

``python -m perfscope.record.docs > docs/summary.md`` and ``python -m perfscope.record.docs tune
> docs/tune-record.md`` write them; ``tests/test_record.py`` fails when a page and its schema differ.
"""

from __future__ import annotations

import types
import typing

import msgspec

from perfscope.record import tune_schema
from perfscope.record.schema import SCHEMA, SCHEMA_VERSION, SECTIONS

INTRO = f"""# `summary.json` schema (version {SCHEMA_VERSION})

<!-- Generated from perfscope/record/schema.py by `python -m perfscope.record.docs`; do not edit. -->

`summary.json` is the record of one analysis, written next to `report.html` and `timeline.json` (the
timeline's drawings, `docs/report.md`). Together they hold everything the report shows, so a report
re-renders from them without the traces. Programs should check `schema == "{SCHEMA}"` and
`schema_version`; within a version fields are only added. Version 2 added the evidence of each step
(`status`, `status_reason`, `counted`), runs without a verdict (`overall.verdict` null,
`overall.reason`), the data-quality record (`data_quality`, `traces[].data_quality`), skipped files
(`skipped`), the straggler, the waits behind `other`, and the advice fitted to the trace; a version 1
summary is migrated when it is read (its steps count when complete), so `perfscope report` still
renders it. Units: `*_us` microseconds, `*_frac` fraction of the step's `step_time_us`, `*_s`
seconds, `*_bytes` bytes. Metric definitions: `docs/metrics.md`.

Reading a summary (`perfscope report`, `perfscope diff`, `perfscope check`,
`perfscope.record.load_summary`) validates it once against the schema below
(`perfscope/record/schema.py`, the one definition of the record) before anything is rendered; a
hand-edited file that breaks it ends in one line, `perfscope: error: FILE: malformed summary: FIELD:
expected ...`, exit status 2. A field may be absent (older summaries lack some) or null, but where
present it has the type below: numbers are numbers, finite and below 2^63 (JSON has no
`Infinity`/`NaN`; `1e999` is refused as not valid JSON), *share* lies in 0..1, *name* is a class or
status name (`io-bound`), never free text, and lists of objects hold objects. Fields the schema does
not name are kept but not shown.
"""


_PLAIN = {str: "text", int: "whole number", float: "number", bool: "true/false", typing.Any: "any"}


def _meta_words(base, meta: list) -> str:
    """An ``Annotated`` type in words: its rule (``name``, ``share``, ``number ≥ 0``), else its base's."""
    m = next((x for x in meta if isinstance(x, msgspec.Meta)), None)
    if m is not None and m.pattern:
        return "name"
    if m is not None and m.le is not None:
        return "share"
    if m is not None and m.ge is not None:
        return "number ≥ 0"
    return _type_words(base)


def _union_words(kind) -> str:
    args = typing.get_args(kind)
    present = [a for a in args if a is not type(None)]
    return " or ".join(_type_words(a) for a in present) + (" or null" if len(present) < len(args) else "")


def _type_words(kind) -> str:
    """A field's type in words."""
    origin = typing.get_origin(kind)
    if origin is typing.Annotated:
        base, *meta = typing.get_args(kind)
        return _meta_words(base, meta)
    if isinstance(kind, types.UnionType) or origin is typing.Union:
        return _union_words(kind)
    if origin in (list, tuple, dict):
        inner = typing.get_args(kind)[-1]
        return {list: f"list of {_type_words(inner)}", tuple: "list", dict: f"object of {_type_words(inner)}"}[origin]
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
        return "object"
    return _PLAIN.get(kind, str(kind))


def _description(kind) -> str:
    if typing.get_origin(kind) is typing.Annotated:
        m = next((x for x in typing.get_args(kind)[1:] if isinstance(x, msgspec.Meta)), None)
        if m is not None and m.description:
            return m.description
    return ""


def section(path: str, struct) -> str:
    """The page's part for one object: heading, the struct's words, its fields' table."""
    doc = " ".join(line.strip() for line in (struct.__doc__ or "").strip().splitlines())
    heading = f"## `{path}`" if path else "## The record"
    rows = ["| field | type | meaning |", "| --- | --- | --- |"]
    hints = typing.get_type_hints(struct, include_extras=True)
    for f in msgspec.structs.fields(struct):
        kind = hints[f.name]
        rows.append(f"| `{f.encode_name}` | {_type_words(kind)} | {_description(kind).replace('|', '/')} |")
    return "\n".join([heading, "", doc, "", *rows, ""])


TUNE_INTRO = f"""# `tune.json` schema (version {tune_schema.SCHEMA_VERSION})

<!-- Generated from perfscope/record/tune_schema.py by `python -m perfscope.record.docs tune`; do not edit. -->

`tune.json` is the record of one `perfscope tune` run (`docs/tune.md`): the study, the baseline, the
search space, every trial, the confirmation and the answer. Programs should check
`schema == "{tune_schema.SCHEMA}"` and `schema_version`; within a version fields are only added.
The tuning report renders what it can of a hand-edited or partial record: a part missing or of the
wrong type shows as `-` or "not available", never as an error.
Units: `*_us` microseconds, `*_s` seconds; throughputs (`value`, `baseline[]`, `candidate[]`) in
`objective.unit`; speed-ups are ratios.
"""


def render() -> str:
    """The summary record's page (Markdown)."""
    return INTRO + "\n" + "\n".join(section(path, struct) for path, struct in SECTIONS)


def render_tune() -> str:
    """The tuning record's page (Markdown)."""
    return TUNE_INTRO + "\n" + "\n".join(section(path, struct) for path, struct in tune_schema.SECTIONS)


if __name__ == "__main__":
    import sys

    print(render_tune() if sys.argv[1:] == ["tune"] else render(), end="")
