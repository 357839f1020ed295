"""The summary record has one definition (perfscope/record/schema.py): every field the analysis
writes is named by it, docs/summary.md is generated from it, the classes' fields derive from the
one table of classes, version 1 records are migrated, and bad records are one line naming the field."""

from __future__ import annotations

import copy
import typing
from pathlib import Path

import msgspec
import orjson
import pytest

import perfscope
from perfscope.classes import OTHER, TABLE
from perfscope.errors import PerfscopeError
from perfscope.record import Summary, decode, encode
from perfscope.record import docs as record_docs
from perfscope.record import schema
from perfscope.testing import ContractError
from perfscope.testing.record import check_record, struct_of
from test_report import cpu_trace, gpu_trace

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces" / "hta"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, dict]:
    """Summaries of a GPU and a CPU trace, and of the shared real traces where present, as plain
    data (each test takes copies)."""
    tmp_path = tmp_path_factory.mktemp("traces")
    out = {"gpu": perfscope.analyze(gpu_trace(tmp_path / "g.json", steps=4)).summary(),
           "cpu": perfscope.analyze(cpu_trace(tmp_path / "c.json", steps=4)).summary()}
    for name in ("two_ranks", "cpu_only_rank34.pt.trace.json.gz"):
        if (SHARED / name).exists():
            out[name] = perfscope.analyze(SHARED / name).summary()
    return {k: orjson.loads(encode(v)) for k, v in out.items()}


def test_every_field_the_analysis_writes_is_named_by_the_schema(built):
    for summary in copy.deepcopy(built).values():
        check_record(summary)


def test_the_record_suite_catches_an_unnamed_field_and_an_invalid_one(built):
    summary = copy.deepcopy(built["gpu"])
    summary["details"]["memcpy"][0]["new_figure"] = 1
    with pytest.raises(ContractError, match="details.memcpy\\[\\].new_figure"):
        check_record(summary)
    summary["details"]["memcpy"][0].pop("new_figure")
    summary["overall"]["verdict"] = "not a class name"
    with pytest.raises(AssertionError, match="overall.verdict"):
        check_record(summary)


def test_every_step_column_of_every_mode_is_named(built):
    from perfscope.analysis.telemetry import COLUMNS as TELEMETRY
    from perfscope.analysis.combine import HOST_COLUMNS

    fields = {f.encode_name for f in msgspec.structs.fields(schema.Step)}
    assert set(TELEMETRY) <= fields and set(HOST_COLUMNS.values()) <= fields
    for summary in built.values():
        for row in summary["steps"]:
            assert set(row) <= fields


def test_the_docs_page_is_generated_from_the_schema():
    page = (ROOT / "docs" / "summary.md").read_text(encoding="utf-8")
    assert page == record_docs.render(), "docs/summary.md differs: python -m perfscope.record.docs > docs/summary.md"


def test_the_tuning_records_docs_page_is_generated_from_its_schema():
    page = (ROOT / "docs" / "tune-record.md").read_text(encoding="utf-8")
    assert page == record_docs.render_tune(), ("docs/tune-record.md differs: "
                                               "python -m perfscope.record.docs tune > docs/tune-record.md")


def test_a_tuning_record_of_every_outcome_keeps_the_tuning_contract():
    from tunereportkit import realistic

    from perfscope.testing.record import check_tune_record

    check_tune_record(realistic())
    bad = realistic()
    bad["trials"][0]["numbr"] = 0
    with pytest.raises(AssertionError, match="trials\\[\\]\\.numbr"):
        check_tune_record(bad)
    bad = realistic()
    bad["confirmation"]["candidates"][0]["rounds"] = "five"
    with pytest.raises(AssertionError, match="candidates"):
        check_tune_record(bad)


def test_every_struct_of_the_record_has_a_documented_section():
    listed = {struct for _, struct in schema.SECTIONS}
    reachable, todo = set(), [Summary]
    while todo:
        struct = todo.pop()
        if struct in reachable:
            continue
        reachable.add(struct)
        hints = typing.get_type_hints(struct, include_extras=True)
        todo += [s for s in (struct_of(hints[f.name]) for f in msgspec.structs.fields(struct)) if s is not None]
    assert reachable == listed
    for struct in listed:
        hints = typing.get_type_hints(struct, include_extras=True)
        undocumented = [f.name for f in msgspec.structs.fields(struct) if not record_docs._description(hints[f.name])]
        assert undocumented == [], (struct.__name__, undocumented)


def test_the_class_fields_derive_from_the_one_table():
    names = [c.name for c in (*TABLE, OTHER)]
    assert [f.name for f in msgspec.structs.fields(schema.Fractions)] == names
    assert [f.encode_name for f in msgspec.structs.fields(schema.StepShare)] == [f"{c.name}-bound" for c in TABLE]
    assert [f.name for f in msgspec.structs.fields(schema.Advice)] == [c.name for c in TABLE]
    step = {f.name for f in msgspec.structs.fields(schema.Step)}
    assert {f"{n}_cost_frac" for n in names} <= step


def test_a_version_1_record_is_migrated_when_read(built):
    summary = built["gpu"]
    old = copy.deepcopy(summary)
    old["schema_version"] = 1
    for s in old["steps"]:
        for k in ("counted", "status", "status_reason"):
            s.pop(k, None)
    old["steps"][0]["complete"] = False
    read = decode(orjson.dumps(old))
    assert read["schema_version"] == 2
    assert [s["counted"] for s in read["steps"]] == [False] + [True] * (len(read["steps"]) - 1)
    assert read["steps"][0]["status"] == "incomplete" and read["steps"][1]["status"] == "ok"

    for s in old["steps"]:  # none complete: version 1 counted them all
        s["complete"] = False
    assert all(s["counted"] for s in decode(orjson.dumps(old))["steps"])


@pytest.mark.parametrize("where, value, named", [
    (("steps", 0, "step_time_us"), "abc", "steps[0].step_time_us"),
    (("overall", "step_share", "io-bound"), 2.0, "overall.step_share.io-bound"),
    (("overall", "verdict"), "io-bound\nforged", "overall.verdict"),
    (("details", "memory"), {"ranks": [{"peak_rss_bytes": -1}]}, "details.memory.ranks[0].peak_rss_bytes"),
    (("traces", 0, "rank"), 1.5, "traces[0].rank"),
])
def test_a_bad_field_is_one_line_naming_it(built, where, value, named):
    summary = copy.deepcopy(built["gpu"])
    target = summary
    for k in where[:-1]:
        target = target[k]
    target[where[-1]] = value
    with pytest.raises(PerfscopeError) as e:
        decode(orjson.dumps(summary), "s.json")
    text = str(e.value)
    assert text.startswith("s.json: malformed summary: ") and named in text and "\n" not in text, text


def test_other_versions_and_other_files_are_refused():
    with pytest.raises(PerfscopeError, match="version 3 is not supported"):
        decode(b'{"schema": "perfscope.summary", "schema_version": 3}')
    with pytest.raises(PerfscopeError, match="not a perfscope summary"):
        decode(b'{"schema": "other"}')
    with pytest.raises(PerfscopeError, match="a trace, not a summary"):
        decode(b'{"traceEvents": []}')
