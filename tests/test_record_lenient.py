"""The lenient reading of a record (perfscope.record.lenient): what fits its declared type is
kept as it is, what does not is left out by the rules the module states, and nothing raises."""

from __future__ import annotations

import copy
import math

import msgspec
import pytest
from tunereportkit import keep_current, realistic

from perfscope.record.lenient import lenient
from perfscope.record.tune_schema import Trial, TuneRecord


@pytest.mark.parametrize("make", [realistic, keep_current], ids=["realistic", "keep-current"])
def test_a_well_formed_record_reads_as_the_strict_conversion_does(make):
    record = make()
    assert lenient(record, TuneRecord) == msgspec.convert(record, TuneRecord)


def test_each_part_that_does_not_fit_is_left_out_by_its_rule():
    r = realistic()
    r["trials"][2]["number"] = "two"  # a struct field: None
    r["trials"].append("not a trial")  # a list item: dropped
    r["confirmation"]["candidates"][0]["candidate"] = [1, "x", None, 2.5]  # list items: dropped
    r["baseline"]["fractions"]["io"] = "most"  # a mapping's value that admits None: None
    r["importances"] = {"num_workers": "high", "pin_memory": 0.5}  # one that does not: the key dropped
    r["space"]["excluded"] = ["bucket_cap_mb"]  # a mapping given as a list: None
    r["recommendation"] = {}  # an empty object where a struct is declared: absent
    read = lenient(r, TuneRecord)
    assert read.trials[2].number is None and read.trials[2].state == r["trials"][2]["state"]
    assert len(read.trials) == len(r["trials"]) - 1 and all(isinstance(t, Trial) for t in read.trials)
    assert read.confirmation.candidates[0].candidate == [1.0, 2.5]
    assert read.baseline.fractions["io"] is None and read.baseline.fractions["compute"] == 0.30
    assert read.importances == {"pin_memory": 0.5}
    assert read.space.excluded is None and read.space.searched  # the rest of the part kept
    assert read.recommendation is None


def test_a_field_the_record_does_not_hold_is_none_not_the_writers_default():
    # the writer's defaults (schema name and version) are not facts about a record that lacks them
    read = lenient({"trials": []}, TuneRecord)
    assert read.schema is None and read.schema_version is None and read.trials == []


@pytest.mark.parametrize("value", [None, [], "x", 7, ["not", "a", "record"]])
def test_anything_but_a_mapping_reads_as_an_empty_record(value):
    assert lenient(value, TuneRecord) == TuneRecord(**{f: None for f in TuneRecord.__struct_fields__})


def test_a_non_finite_number_is_kept_for_the_renderer_to_judge():
    r = realistic()
    r["baseline"]["value"] = float("nan")
    assert math.isnan(lenient(r, TuneRecord).baseline.value)


def test_no_mutation_of_any_field_raises():
    base = realistic()

    def paths(o, path=()):
        yield path
        items = o.items() if isinstance(o, dict) else enumerate(o) if isinstance(o, list) else ()
        for k, v in items:
            yield from paths(v, (*path, k))

    for path in [p for p in paths(base) if p]:
        for bad in ("x", None, {"a": [1]}, [1, "x"], 7, True, {}):
            r = copy.deepcopy(base)
            parent = r
            for k in path[:-1]:
                parent = parent[k]
            parent[path[-1]] = bad
            assert isinstance(lenient(r, TuneRecord), TuneRecord), path
    assert lenient(base, TuneRecord) == msgspec.convert(base, TuneRecord)  # the input is not changed
