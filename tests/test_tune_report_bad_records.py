"""The tuning report of records it cannot trust: parts missing or null, values malformed or of the
wrong type in any field (the page still renders, whole), and record strings that must be escaped
(no markup, no link that leaves the folder)."""

from __future__ import annotations

import copy
import re

import pytest
from tunereportkit import (
    EVIL_ESCAPED,
    QUOTES_ESCAPED,
    check,
    hostile,
    markers,
    realistic,
    section_of,
)

from perfscope.reports import render_tuning

# ---------------------------------------------------------------------------------------------
# Parts missing or malformed


def minimal() -> dict:
    return {"schema": "perfscope.tune", "schema_version": 1, "trials": []}


def all_null() -> dict:
    """Every schema field present, each empty or null."""
    return {"schema": "perfscope.tune", "schema_version": 1, "perfscope_version": None, "generated_at": None,
            "script": None, "args": [], "nproc_per_node": None, "study": {}, "objective": {}, "baseline": {},
            "space": {}, "trials": [], "importances": None, "confirmation": None, "recommendation": {},
            "after": None, "notes": []}


@pytest.mark.parametrize("record", [minimal(), all_null(), {}, {"trials": None}], ids=["minimal", "all-null", "empty", "trials-null"])
def test_missing_parts_render(record):
    html = check(render_tuning(record))
    assert "No recommendation in this record" in html
    assert "Not available: the record holds no trials." in html
    assert "Not available: no confirmation ran" in html
    assert markers(html) == {"complete": 0, "pruned": 0, "infeasible": 0}


def test_malformed_values_do_not_crash():
    r = realistic()
    r["baseline"]["value"] = "fast"
    r["baseline"]["fractions"] = {"io": "most", "compute": None, "comm": float("nan")}
    r["trials"][1]["value"] = "1790"
    r["trials"][2]["number"] = "two"
    r["trials"][3]["step_values"] = "900"
    r["trials"][5]["failure"] = "oom"
    r["trials"][6]["config"] = ["num_workers", 8]
    r["trials"][8]["duration_s"] = "long"
    r["trials"].append("not a trial")
    r["importances"] = {"num_workers": "high", "pin_memory": 0.5}
    r["confirmation"]["rounds"] = "five"
    r["confirmation"]["candidates"][0].update(speedup="2x", ci_low=None, ci_high="?", baseline="1000",
                                              candidate=[1, "x", None])
    r["confirmation"]["min_gain"] = "2%"
    r["recommendation"]["speedup"] = "lots"
    r["objective"] = "samples"
    r["study"] = ["x"]
    r["space"]["searched"] = [{"name": "num_workers", "choices": [0, 2, 4]}, "junk"]
    r["space"]["excluded"] = ["bucket_cap_mb"]
    r["space"]["order"] = "input"
    r["after"]["fractions"] = None
    r["notes"] = "a note"
    html = check(render_tuning(r))
    assert "Faster (95% interval" in html or "Faster:" in html
    assert "0, 2, 4" in section_of(html, "space")
    check(render_tuning({"trials": [{"number": 1, "state": "complete", "value": float("inf")}]}))
    check(render_tuning(["not", "a", "record"]))  # type: ignore[arg-type]


def _paths(o, path=()):
    yield path
    if isinstance(o, dict):
        for k, v in o.items():
            yield from _paths(v, (*path, k))
    elif isinstance(o, list):
        for i, v in enumerate(o):
            yield from _paths(v, (*path, i))


def test_any_field_of_the_wrong_type_renders():
    """Each field down to a trial's or candidate's own fields replaced, one at a time, by text, null
    and a mapping: the page still renders, whole."""
    base = realistic()
    paths = [p for p in _paths(base) if 0 < len(p) <= 4]
    assert len(paths) > 150
    for path in paths:
        for bad in ("x", None, {"a": [1]}):
            r = copy.deepcopy(base)
            parent = r
            for k in path[:-1]:
                parent = parent[k]
            parent[path[-1]] = bad
            try:
                html = render_tuning(r)
                assert html.endswith("</html>\n") and html.count("<section ") == 7
            except Exception as e:  # name the field in the failure
                raise AssertionError(f"{'.'.join(map(str, path))} = {bad!r}: {e!r}") from e


# ---------------------------------------------------------------------------------------------
# Escaping


def test_record_strings_are_escaped():
    html = check(render_tuning(hostile()))
    assert "<img" not in html.lower()
    assert "onerror=alert(1)>" not in html
    assert html.count(EVIL_ESCAPED) >= 15
    assert QUOTES_ESCAPED in html
    # links that would leave the folder are named as text, never linked
    assert not re.search(r'href="[^"]*(javascript|evil\.example)', html)
    assert "javascript:alert(1) <span" in html
    # the relative link with hostile characters is percent-encoded inside a quoted attribute
    assert 'href="%3C/script%3E%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E%22/report.html"' in html


def test_hostile_args_in_facts():
    notes = section_of(render_tuning(hostile()), "notes")
    assert "&#x27;&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;&#x27;" in notes  # shlex-quoted, then escaped


def test_an_interrupted_record_says_so_and_how_to_resume():
    r = realistic()
    r.update(recommendation=None, confirmation=None, decided_by="interrupted",
             resume="perfscope tune train.py --out 'my runs' -- --steps 100")
    html = check(render_tuning(r))
    assert "Interrupted before the answer: no best.yaml" in html
    assert "to resume: perfscope tune train.py --out &#x27;my runs&#x27; -- --steps 100" in html or \
        "to resume: perfscope tune train.py --out &#39;my runs&#39; -- --steps 100" in html
