"""The tuning report (``report.html`` of ``perfscope tune``), rendered from hand-built tuning records
(docs/tune.md, ``tune.json``): the recommendation first, every trial in the table and on the chart
with one marker per outcome, failure reasons and exclusions shown, optional parts missing without
error, malformed values without a crash, every record string escaped, nothing loaded from outside,
and an atomic write."""

from __future__ import annotations

import copy
import re
from html.parser import HTMLParser

import pytest

import perfscope.atomic
from reports import render_tuning, write_tuning

EVIL = "</script><img src=x onerror=alert(1)>"
EVIL_ESCAPED = "&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;"
QUOTES = "it's \"quoted\" & <b>bold</b>"
QUOTES_ESCAPED = "it&#x27;s &quot;quoted&quot; &amp; &lt;b&gt;bold&lt;/b&gt;"


def trial(number, state, role, config, value, *, step_values=(), feasible=True, failure=None, numerics="ok",
          verdict=None, params=None):
    return {
        "number": number, "state": state, "role": role, "params": params if params is not None else dict(config),
        "config": config, "value": value, "step_values": list(step_values), "feasible": feasible, "failure": failure,
        "numerics": {"status": numerics, "detail": "" if numerics == "ok" else f"{numerics} loss"},
        "verdict": verdict, "duration_s": 41.5,
    }


BEST = {"num_workers": 4, "pin_memory": True, "prefetch_factor": 4}
OOM = "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 23.6 GiB total)"
TIMEOUT = "no step boundary within 600 s: the trial was stopped"
UNSAFE = "loss departure 35% exceeds 10% + 0.01"
INTERRUPTED = "stopped by Ctrl-C"


def realistic() -> dict:
    """An io-bound script where 4 workers + pinned memory win: 11 trials of every outcome."""
    return {
        "schema": "perfscope.tune", "schema_version": 1, "perfscope_version": "0.1.0",
        "generated_at": "2025-03-01T12:00:00Z", "script": "train.py", "args": ["--epochs", "1"], "nproc_per_node": 1,
        "study": {"name": "tune-train", "storage": "sqlite:///perfscope-out/tune-train/study.db", "trials_target": 12,
                  "direction": "maximize"},
        "objective": {"unit": "samples/s", "warmup_steps": 5, "measure_steps": 20, "statistic": "median"},
        "baseline": {"trial": 0, "value": 1000.0, "verdict": "io-bound",
                     "fractions": {"io": 0.62, "comm": 0.0, "launch": 0.05, "compute": 0.30, "other": 0.03},
                     "summary": "baseline/summary.json", "report": "baseline/report.html"},
        "space": {
            "verdict": "io-bound", "order": ["input", "precision", "launch"],
            "searched": [
                {"name": "num_workers", "group": "input", "choices": "0, 2, 4, 8", "baseline": 0},
                {"name": "pin_memory", "group": "input", "choices": "false, true", "baseline": False},
                {"name": "prefetch_factor", "group": "input", "choices": "2, 4", "baseline": None},
                {"name": "amp_level", "group": "precision", "choices": "O0, O1, O2", "baseline": "O0"},
                {"name": "grad_accum_steps", "group": "launch", "choices": "1, 2, 4", "baseline": 1},
            ],
            "excluded": {"bucket_cap_mb": "no process group: DDP knobs cannot apply",
                         "device_prefetch": "the script does not call perfscope.accelerate"},
        },
        # As tuner/record.py stores them: a failed run is a complete trial of value 0 with its failure,
        # pruned and running trials are never "feasible", a pruned trial's value is its last running median.
        "trials": [
            trial(0, "complete", "baseline", {}, 1000.0, step_values=[990, 1000], verdict="io-bound"),
            trial(1, "complete", "guess", {"num_workers": 4, "pin_memory": True}, 1790.0, verdict="compute-bound"),
            trial(2, "complete", "search", {"num_workers": 2}, 1500.0, verdict="io-bound"),
            trial(3, "pruned", "search", {"amp_level": "O1"}, 870.0, step_values=[900.0, 860.0, 850.0],
                  feasible=False, numerics="not-visible"),
            trial(4, "pruned", "search", {"grad_accum_steps": 4}, None, feasible=False,  # nothing reported: not drawn
                  numerics="not-visible"),
            trial(5, "complete", "search", {"num_workers": 8, "amp_level": "O2"}, 0.0, feasible=False,
                  failure={"kind": "oom", "reason": OOM}, numerics="not-visible"),
            trial(6, "complete", "search", {"num_workers": 8}, 0.0, feasible=False,
                  failure={"kind": "timeout", "reason": TIMEOUT}, numerics="not-visible"),
            trial(7, "complete", "search", {"amp_level": "O2"}, 2100.0, feasible=False, numerics="unsafe",
                  failure={"kind": "unsafe", "reason": UNSAFE}, verdict="compute-bound"),
            trial(8, "complete", "search", dict(BEST), 1820.0, verdict="compute-bound"),
            trial(9, "running", "search", {"num_workers": 2, "pin_memory": True}, None, feasible=False,  # not drawn
                  numerics="not-visible"),
            trial(10, "failed", "search", {"pin_memory": True}, None, feasible=False,
                  failure={"kind": "interrupted", "reason": INTERRUPTED}, numerics="not-visible"),
        ],
        "importances": {"num_workers": 0.71, "pin_memory": 0.18, "amp_level": 0.11},
        "confirmation": {"rounds": 5, "confidence": 0.95, "min_gain": 0.02, "candidates": [
            {"trial": 8, "config": dict(BEST), "baseline": [1000, 1010, 990, 1005, 995],
             "candidate": [1800, 1830, 1790, 1810, 1800], "speedup": 1.8, "ci_low": 1.6, "ci_high": 2.0, "faster": True},
            {"trial": 1, "config": {"num_workers": 4, "pin_memory": True}, "baseline": [1000, 1002, 998, 1001, 999],
             "candidate": [1760, 1770, 1750, 1765, 1755], "speedup": 1.76, "ci_low": 1.7, "ci_high": 1.82,
             "faster": True},
        ]},
        "recommendation": {"status": "faster", "trial": 8, "config": dict(BEST), "speedup": 1.8, "ci_low": 1.6,
                           "ci_high": 2.0, "line": "1.80x faster (95% interval 1.60x-2.00x, 5 rounds)"},
        "after": {"verdict": "compute-bound",
                  "fractions": {"io": 0.04, "comm": 0.0, "launch": 0.06, "compute": 0.86, "other": 0.04},
                  "summary": "best/summary.json", "report": "best/report.html", "diff": "diff.html"},
        "notes": ["The loss was seen: every trial's numerics were checked.", "tf32 left out: the model runs on the CPU."],
    }


HEADLINE = ("1.80x faster (95% interval 1.60x–2.00x, 5 rounds): num_workers 0 → 4, pin_memory false → true, "
            "prefetch_factor unset → 4")


def keep_current() -> dict:
    """Nothing beat the baseline: no confirmation ran, nothing was profiled after."""
    r = realistic()
    r["trials"] = [
        trial(0, "complete", "baseline", {}, 1000.0, verdict="compute-bound"),
        trial(1, "complete", "guess", {"amp_level": "O1"}, 980.0),
        trial(2, "pruned", "search", {"num_workers": 2}, None, step_values=[700.0]),
    ]
    r["baseline"].update(verdict="compute-bound",
                         fractions={"io": 0.03, "comm": 0.0, "launch": 0.04, "compute": 0.9, "other": 0.03})
    r["space"].update(verdict="compute-bound", order=["precision"])
    r["confirmation"] = None
    r["importances"] = None
    r["after"] = None
    r["recommendation"] = {"status": "keep-current", "trial": None, "config": {}, "speedup": None, "ci_low": None,
                           "ci_high": None, "line": "keep your current settings"}
    return r


def minimal() -> dict:
    return {"schema": "perfscope.tune", "schema_version": 1, "trials": []}


def all_null() -> dict:
    """Every schema field present, each empty or null."""
    return {"schema": "perfscope.tune", "schema_version": 1, "perfscope_version": None, "generated_at": None,
            "script": None, "args": [], "nproc_per_node": None, "study": {}, "objective": {}, "baseline": {},
            "space": {}, "trials": [], "importances": None, "confirmation": None, "recommendation": {},
            "after": None, "notes": []}


# ---------------------------------------------------------------------------------------------
# Checks every page must pass


class StrictParser(HTMLParser):
    """html.parser with the checks it does not make itself: every element closed, in order."""

    VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"})

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.doctype = False

    def handle_decl(self, decl):
        self.doctype = self.doctype or decl.lower() == "doctype html"

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in self.VOID:
            self.errors.append(f"end tag of void element </{tag}>")
        elif not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'} at {self.getpos()}")
        else:
            self.stack.pop()


def assert_well_formed(html: str):
    p = StrictParser()
    p.feed(html)
    p.close()
    assert p.doctype, "no <!DOCTYPE html>"
    assert p.errors == [], p.errors[:5]
    assert p.stack == [], f"unclosed elements: {p.stack}"


def assert_self_contained(html: str):
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    assert not re.search(r"<script", html, re.IGNORECASE)
    assert not re.search(r"<(img|iframe|object|embed|link rel=\"stylesheet\")", html, re.IGNORECASE)
    # Links go to the page's own anchors, data: URIs or files beside it: no scheme, no host.
    for ref in re.findall(r'(?:src|href)\s*=\s*["\']([^"\']*)', html, re.IGNORECASE):
        if not ref.startswith(("#", "data:")):
            assert not re.match(r"^(?:[a-z][a-z0-9+.\-]*:|/|\\)", ref, re.IGNORECASE), ref
        assert "http:" not in ref.lower() and "https:" not in ref.lower() and "//" not in ref, ref
    assert "url(" not in html and "@import" not in html


def check(html: str) -> str:
    assert_well_formed(html)
    assert_self_contained(html)
    return html


def section_of(html: str, anchor: str) -> str:
    return html.split(f'<section id="{anchor}">')[1].split("</section>")[0]


def markers(html: str) -> dict[str, int]:
    return {k: html.count(f'class="mk mk-{k}"') for k in ("complete", "pruned", "infeasible")}


# ---------------------------------------------------------------------------------------------
# The realistic record


def test_recommendation_comes_first():
    html = check(render_tuning(realistic()))
    sections = re.findall(r'<section id="([^"]+)">', html)
    assert sections == ["recommendation", "verdicts", "trials", "importances", "confirmation", "space", "notes"]
    head = section_of(html, "recommendation")
    assert f"<strong>{HEADLINE}</strong>" in head
    assert "1.80x faster (95% interval 1.60x-2.00x, 5 rounds)" in head  # the tuner's own line too
    assert "samples/s" in head and "1,000 samples/s" in head and "1,820 samples/s" in head
    # the changes table: knob, baseline, recommended
    for knob, base, new in (("num_workers", "0", "4"), ("pin_memory", "false", "true"), ("prefetch_factor", "unset", "4")):
        assert re.search(rf'<td class="name">{knob}</td><td class="l">{base}</td><td class="l">{new}</td>', head), knob
    for href in ("best.yaml", "baseline/report.html", "best/report.html", "diff.html"):
        assert f'href="{href}"' in head
    assert "<title>perfscope tune: 1.80x faster</title>" in html


def test_verdict_before_and_after():
    sec = section_of(check(render_tuning(realistic())), "verdicts")
    assert "The verdict changed from <strong>io-bound</strong> to <strong>compute-bound</strong>" in sec
    assert "#E69F00" in sec and "#009E73" in sec  # io and compute in the palette's colours
    assert "62.0%" in sec and "86.0%" in sec and "+56.0 pt" in sec


def test_every_trial_in_table_and_drawn_markers():
    html = check(render_tuning(realistic()))
    sec = section_of(html, "trials")
    rows = re.findall(r'<tr class="[^"]*"><td class="">(\d+)</td>', sec)
    assert rows == [str(n) for n in range(11)]
    # trials 4 (pruned before reporting) and 9 (running) have nothing to draw
    assert markers(html) == {"complete": 4, "pruned": 1, "infeasible": 4}
    assert html.count('class="mk ') == 9
    assert "Not drawn (no value reported): trial 4 (pruned), 9 (running)." in sec
    assert ("11 trials; 9 of the 12 planned have finished (failed and running trials do not count): "
            "4 complete, 2 pruned, 4 infeasible, 1 running.") in sec
    # the infeasible reasons: in the table and in the markers' tooltips
    for reason in (OOM, TIMEOUT, UNSAFE, INTERRUPTED):
        assert sec.count(reason) >= 2, reason
    tips = re.findall(r'<g class="mk mk-infeasible"><title>([^<]*)</title>', sec)
    assert [t.split(":")[0] for t in tips] == [f"trial {n} (search)" for n in (5, 6, 7, 10)]
    assert "oom: CUDA out of memory" in tips[0] and "timeout: no step boundary" in tips[1]
    # infeasible markers sit on the x axis (y = 0), all at the same height
    ys = re.findall(r'<g class="mk mk-infeasible"><title>[^<]*</title><rect x="[^"]*" y="([^"]*)"', sec)
    assert len(set(ys)) == 1
    assert "pruned at 870 samples/s" in sec  # the pruned trial sits at its last running median
    assert 'class="ref"' in sec and 'class="bestline"' in sec  # baseline line, best so far
    assert '<tr class="hl"><td class="">8</td>' in sec  # the recommended trial is highlighted
    assert "unsafe: " + UNSAFE in sec
    # a failed run's stored 0 is not shown as a throughput; an unsafe run's real value is
    row5 = re.search(r'<tr class=""><td class="">5</td>.*?</tr>', sec).group(0)
    assert '<td class="">-</td>' in row5 and "0.00" not in row5
    assert '<span class="muted">2,100</span>' in sec
    assert '<span class="muted">870 (last)</span>' in sec


def test_pruned_trial_without_value_uses_its_step_values():
    r = realistic()
    r["trials"][3]["value"] = None
    sec = section_of(render_tuning(r), "trials")
    assert "pruned at 850 samples/s" in sec and markers(sec)["pruned"] == 1


def test_importances_confirmation_space_notes():
    html = check(render_tuning(realistic()))
    imp = section_of(html, "importances")
    assert imp.index("num_workers") < imp.index("pin_memory") < imp.index("amp_level")
    assert "71.0%" in imp
    conf = section_of(html, "confirmation")
    assert "1.60x–2.00x" in conf and "1.70x–1.82x" in conf and "1.02x" in conf
    assert conf.count("<h3>Rounds</h3>") == 1 and "<td class=\"\">1,010</td><td class=\"\">1,830</td><td class=\"\">1.81x</td>" in conf
    space = section_of(html, "space")
    assert "no process group: DDP knobs cannot apply" in space
    assert "the script does not call perfscope.accelerate" in space
    assert "input → precision → launch" in space and "<strong>io-bound</strong>" in space
    notes = section_of(html, "notes")
    assert "tf32 left out: the model runs on the CPU." in notes and "--epochs 1" in notes


# ---------------------------------------------------------------------------------------------
# Optional parts missing


def test_keep_current_without_confirmation():
    html = check(render_tuning(keep_current()))
    head = section_of(html, "recommendation")
    assert "<strong>Keep your current settings: no trial of the search beat the baseline</strong>" in head
    assert "best.yaml is an empty mapping" in head
    assert 'href="diff.html"' not in head and 'href="best/report.html"' not in head
    assert 'href="baseline/report.html"' in head
    assert "After: not available" in section_of(html, "verdicts")
    assert "Not available: no confirmation ran" in section_of(html, "confirmation")
    assert "Not available: no importances" in section_of(html, "importances")
    assert markers(html) == {"complete": 2, "pruned": 1, "infeasible": 0}
    assert "<title>perfscope tune: keep current settings</title>" in html
    r = keep_current()
    r["trials"][1]["value"] = 1010.0  # beat the baseline in the search, by too little to confirm
    assert ("Keep your current settings: nothing was confirmed faster (the best trial of the search, 1, measured "
            "once, 1.01x the baseline)") in render_tuning(r)


def test_keep_current_after_a_failed_confirmation_says_why():
    r = realistic()
    r["confirmation"]["candidates"] = [dict(r["confirmation"]["candidates"][0], speedup=1.01, ci_low=0.97,
                                            ci_high=1.05, faster=False)]
    r["recommendation"] = {"status": "keep-current", "trial": None, "config": {}, "speedup": None, "ci_low": None,
                           "ci_high": None, "line": ""}
    r["after"] = None
    head = section_of(check(render_tuning(r)), "recommendation")
    assert ("Keep your current settings: no candidate was confirmed faster beyond the noise: the best, trial 8, "
            "measured 1.01x (95% interval 0.97x–1.05x, 5 rounds), and a recommendation needs the whole interval "
            "above 1.02x") in head


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


def hostile() -> dict:
    r = realistic()
    r["script"] = EVIL
    r["args"] = [EVIL, QUOTES]
    r["trials"][1]["config"] = {EVIL: QUOTES, "num_workers": EVIL}
    r["trials"][1]["params"] = {EVIL: QUOTES}
    r["trials"][1]["verdict"] = EVIL
    r["trials"][5]["failure"] = {"kind": QUOTES, "reason": EVIL}
    r["trials"][7]["numerics"] = {"status": "unsafe", "detail": EVIL}
    r["space"]["searched"][0].update(name=EVIL, choices=QUOTES, baseline=EVIL)
    r["space"]["excluded"] = {EVIL: QUOTES, "tf32": EVIL}
    r["space"]["verdict"] = EVIL
    r["space"]["order"] = [EVIL]
    r["importances"] = {EVIL: 0.5, QUOTES: 0.5}
    r["recommendation"]["config"] = {EVIL: EVIL, "pin_memory": QUOTES}
    r["recommendation"]["line"] = EVIL
    r["confirmation"]["candidates"][0]["config"] = {EVIL: QUOTES}
    r["confirmation"]["candidates"][0]["trial"] = EVIL
    r["baseline"]["verdict"] = EVIL
    r["baseline"]["report"] = f'{EVIL}"/report.html'
    r["after"]["report"] = "javascript:alert(1)"
    r["after"]["diff"] = "//evil.example/diff.html"
    r["after"]["summary"] = EVIL
    r["study"]["name"] = QUOTES
    r["generated_at"] = EVIL
    r["notes"] = [EVIL, QUOTES]
    return r


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


# ---------------------------------------------------------------------------------------------
# Writing


def test_write_tuning_writes_atomically(tmp_path, monkeypatch):
    path = tmp_path / "out" / "report.html"
    assert write_tuning(realistic(), path) == path
    assert path.read_text(encoding="utf-8") == render_tuning(realistic())
    assert sorted(p.name for p in path.parent.iterdir()) == ["report.html"]  # no temporary file left

    # a failure at the rename keeps the previous page whole and leaves no temporary file behind
    def broken_replace(src, dst):
        raise OSError("disk full")

    before = path.read_bytes()
    monkeypatch.setattr(perfscope.atomic.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_tuning(keep_current(), path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["report.html"]


def test_best_config_link(tmp_path):
    r = realistic()
    r["best_config"] = "tuned.yaml"  # perfscope tune --out tuned.yaml
    html = write_tuning(r, tmp_path / "report.html").read_text()
    assert 'href="tuned.yaml"' in html and 'href="best.yaml"' not in html
    r["best_config"] = "/elsewhere/tuned.yaml"  # outside the output folder: named, not linked
    html = render_tuning(r)
    assert 'href="/elsewhere' not in html and "/elsewhere/tuned.yaml" in html


def test_record_is_not_modified():
    r = realistic()
    before = copy.deepcopy(r)
    render_tuning(r)
    assert r == before
