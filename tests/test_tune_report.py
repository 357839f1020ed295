"""The tuning report (``report.html`` of ``perfscope tune``) of complete records: the
recommendation first, the verdict before and after, every trial in the table and on the chart
with one marker per outcome, failure reasons, importances, confirmation rounds, the search space
and its exclusions; and a record that keeps the current settings, with or without a
confirmation."""

from __future__ import annotations

import re

from tunereportkit import (
    HEADLINE,
    INTERRUPTED,
    OOM,
    TIMEOUT,
    UNSAFE,
    check,
    keep_current,
    markers,
    realistic,
    section_of,
)

from perfscope.reports import render_tuning
from perfscope.reports.sections import tuning_history

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


def test_recommendation_says_what_to_try_next_and_why_a_higher_point_estimate_lost():
    plain = section_of(check(render_tuning(realistic())), "recommendation")
    assert "Next:" not in plain and "measured a higher speed-up" not in plain
    r = realistic()
    r["recommendation"]["hint"] = "the recommendation takes the largest value searched (num_workers=4 of 0..4)"
    # trial 1: a higher point estimate than the recommended trial 8 (1.80x), but a lower interval low end
    r["confirmation"]["candidates"][1].update(speedup=1.9, ci_low=1.55, ci_high=2.3)
    sec = section_of(check(render_tuning(r)), "recommendation")
    assert "Next: the recommendation takes the largest value searched (num_workers=4 of 0..4)" in sec
    assert ("Trial 1 measured a higher speed-up (1.90x) but its interval starts lower (1.55x against 1.60x): "
            "the recommendation is the largest gain proven, the interval&#x27;s low end.") in sec
    r["recommendation"] = {"status": "keep-current", "trial": None, "config": {}, "line": "keep", "hint": "x"}
    assert "Next:" not in section_of(check(render_tuning(r)), "recommendation")  # only with a recommendation


def test_verdict_before_and_after():
    sec = section_of(check(render_tuning(realistic())), "verdicts")
    assert "The verdict changed from <strong>io-bound</strong> to <strong>compute-bound</strong>" in sec
    assert "#E69F00" in sec and "#009E73" in sec  # io and compute in the palette's colours
    assert "62.0%" in sec and "86.0%" in sec and "+56.0 pt" in sec
    # milliseconds beside the shares: io fell from 62 to 1.6 ms although compute's share rose
    assert "<td>100.00</td>" in sec.replace(' class=""', "") and "<td>40.00</td>" in sec.replace(' class=""', "")
    assert "62.00" in sec and "1.60" in sec and "-60.40 ms (-58.0 pt)" in sec


def test_verdicts_without_step_times_show_shares_only():
    r = realistic()
    del r["baseline"]["step_time_us"], r["after"]["step_time_us"]
    sec = section_of(check(render_tuning(r)), "verdicts")
    assert "62.0%" in sec and "- (+56.0 pt)" in sec


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
    # infeasible markers sit on the x axis (y = 0: the plot's bottom edge), the others above it
    axis_y = tuning_history.HEIGHT - tuning_history.BOTTOM
    at = {kind: [float(y) for y in re.findall(rf'<g class="mk mk-{kind}"><title>[^<]*</title><use [^>]*\by="([^"]*)"', sec)]
          for kind in ("infeasible", "complete", "pruned")}
    assert at["infeasible"] == [axis_y] * 4
    assert at["complete"] and all(y < axis_y for y in at["complete"] + at["pruned"])
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
    assert "io → compute → launch" in space and "<strong>io-bound</strong>" in space
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


def test_trial_table_shows_peak_memory_and_flags_the_limit():
    r = realistic()
    r["trials"][1]["memory"] = {"kind": "device", "peak_bytes": 76 * 2**30, "capacity_bytes": 80 * 2**30,
                                "headroom_share": 0.05, "near_limit": True}
    r["trials"][2]["memory"] = {"kind": "device", "peak_bytes": 40 * 2**30, "capacity_bytes": 80 * 2**30,
                                "headroom_share": 0.5, "near_limit": False}
    sec = section_of(check(render_tuning(r)), "trials")
    assert '<span class="warn">76.00 GiB (5% free): near the limit</span>' in sec
    assert "40.00 GiB (50% free)" in sec and "peak memory" in sec
