"""Helpers of the tuning-report tests (``test_tune_report*.py``, ``test_browser_tuning.py``):
hand-built tuning records (docs/tune.md, ``tune.json``) of every outcome, hostile strings, and the
checks every rendered page must pass (well-formed, self-contained)."""

from __future__ import annotations

import re
from html.parser import HTMLParser

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
                     "step_time_us": 100_000.0, "summary": "baseline/summary.json", "report": "baseline/report.html"},
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
                  "step_time_us": 40_000.0, "summary": "best/summary.json", "report": "best/report.html", "diff": "diff.html"},
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
    # the only url() allowed is a reference to an element of the page itself (a chart's clip path)
    all_ids = re.findall(r'\bid="([^"]+)"', html)
    assert len(all_ids) == len(set(all_ids)), sorted(i for i in set(all_ids) if all_ids.count(i) > 1)
    ids = set(all_ids)
    for ref in re.findall(r"url\(([^)]*)\)", html):
        assert ref.startswith("#") and ref[1:] in ids, ref
    assert "@import" not in html


def check(html: str) -> str:
    assert_well_formed(html)
    assert_self_contained(html)
    return html


def section_of(html: str, anchor: str) -> str:
    return html.split(f'<section id="{anchor}">')[1].split("</section>")[0]


def markers(html: str) -> dict[str, int]:
    return {k: html.count(f'class="mk mk-{k}"') for k in ("complete", "pruned", "infeasible")}


# ---------------------------------------------------------------------------------------------
# A record full of strings that must be escaped


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
    r["recommendation"]["hint"] = EVIL
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
