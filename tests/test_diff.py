"""`perfscope diff A B`: the text comparison, the side-by-side page (ratio, verdict change, metric
changes), escaping of the labels, and one-line errors on bad input."""

from __future__ import annotations

import re
import shutil

import pytest

import perfscope
from perfscope.reports import render_diff, text_diff
from test_bad_input import assert_one_line_error, run_cli
from test_report import EVIL_FILE, assert_self_contained, cpu_trace, gpu_trace


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """A: io-bound (600 us DataLoader fetch per 1000 us step); B: compute-bound (a 900 us kernel).
    Analysed once for the module (tests only read them)."""
    tmp_path = tmp_path_factory.mktemp("two_runs")
    outs = []
    for name, dl, k in (("slow", 600, 300), ("fast", 5, 900)):
        out = tmp_path / name
        r = run_cli(tmp_path, "analyze", gpu_trace(tmp_path / f"{name}.json", dl_us=dl, kernel_us=k), "--out", out)
        assert r.returncode == 0, r.stderr
        outs.append(out)
    return outs


def test_diff_prints_verdict_change_and_ratio(tmp_path, two_runs):
    a, b = two_runs
    r = run_cli(tmp_path, "diff", a, b / "summary.json", "--out", tmp_path / "d.html")
    assert r.returncode == 0, r.stderr
    assert "verdict: io-bound -> compute-bound" in r.stdout
    assert re.search(r"step time \(window / steps\): 1\.00 ms -> 1\.00 ms \(B/A 1\.00x", r.stdout)
    html = (tmp_path / "d.html").read_text()
    assert_self_contained(html)
    assert "The verdict changed from <strong>io-bound</strong> to <strong>compute-bound</strong>" in html
    assert "io share of step time" in html and " pt<" in html
    assert html.count('class="verdict"') == 3  # the change, then A and B side by side


def test_diff_ratio_of_step_times():
    a = {"mode": "gpu", "overall": {"verdict": "comm-bound", "step_time_us": 81_000.0, "fractions": {}}, "steps": []}
    b = {"mode": "gpu", "overall": {"verdict": "comm-bound", "step_time_us": 62_000.0, "fractions": {}}, "steps": []}
    text = text_diff(a, b)
    assert "verdict: unchanged (comm-bound)" in text
    assert "81.0 ms -> 62.0 ms (B/A 0.77x: B is 1.31x faster)" in text
    assert "B/A 0.77x: B is 1.31x faster" in render_diff(a, b)
    assert "B/A 1.31x: B is 1.31x slower" in text_diff(b, a)


def test_diff_of_runs_of_different_modes(tmp_path):
    a = perfscope.analyze(gpu_trace(tmp_path / "g.json")).summary()
    b = perfscope.analyze(cpu_trace(tmp_path / "c.json")).summary()
    html = render_diff(a, b)
    assert "different modes" in html
    assert "their step times do not compare" in text_diff(a, b)
    assert_self_contained(html)


def test_diff_labels_are_escaped(tmp_path, two_runs):
    a, b = two_runs
    evil = tmp_path / EVIL_FILE
    shutil.copytree(a, evil)
    r = run_cli(tmp_path, "diff", evil, b, "--out", tmp_path / "d.html")
    assert r.returncode == 0, r.stderr
    html = (tmp_path / "d.html").read_text()
    assert_self_contained(html)
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_diff_default_output_is_under_perfscope_out(tmp_path, two_runs):
    r = run_cli(tmp_path, "diff", *two_runs)
    assert r.returncode == 0, r.stderr
    (written,) = (tmp_path / "perfscope-out").glob("diff-*.html")
    assert f"wrote {written}" in r.stdout


@pytest.mark.parametrize("which", ["a", "b"])
def test_diff_bad_input_is_one_line_error(tmp_path, two_runs, which):
    bad = tmp_path / "nope"
    args = (bad, two_runs[1]) if which == "a" else (two_runs[0], bad)
    r = run_cli(tmp_path, "diff", *args)
    assert_one_line_error(r)
    assert "nope: no such file or directory" in r.stderr


def test_diff_of_a_non_summary_is_one_line_error(tmp_path, two_runs):
    (tmp_path / "trace.json").write_text('{"traceEvents": []}')
    r = run_cli(tmp_path, "diff", two_runs[0], tmp_path / "trace.json")
    assert_one_line_error(r)
    assert "a trace, not a summary.json" in r.stderr and "perfscope analyze" in r.stderr


def test_diff_out_must_be_a_file(tmp_path, two_runs):
    r = run_cli(tmp_path, "diff", *two_runs, "--out", tmp_path)
    assert_one_line_error(r)
    assert "is a directory" in r.stderr


def test_diff_needs_two_runs(tmp_path, two_runs):
    r = run_cli(tmp_path, "diff", two_runs[0])
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_the_tuners_diff_is_headed_by_the_confirmed_speedup_not_the_median_step():
    a = {"mode": "gpu", "overall": {"verdict": "io-bound", "step_time_us": 81_000.0, "fractions": {}}, "steps": []}
    b = {"mode": "gpu", "overall": {"verdict": "compute-bound", "step_time_us": 62_000.0, "fractions": {}}, "steps": []}
    html = render_diff(a, b, "baseline", "best", speedup={"ratio": 4.31, "low": 3.9, "high": 4.8, "rounds": 6,
                                                          "unit": "samples/s"})
    head = html[html.index('<p class="verdict">'):]
    head = head[:head.index("</p>")]
    assert head.index("B is 4.31x faster (95% interval 3.90x–4.80x)") < head.index("Step time of the profiled steps")
    assert "over 6 interleaved rounds" in head and "not the speed-up figure" in head
    assert "B/A 0.77x" in head  # still shown, for what it is


def _bursty(times_ms):
    steps = [{"rank": 0, "step": i, "step_time_us": t * 1000, "counted": True} for i, t in enumerate(times_ms)]
    return {"mode": "cpu", "overall": {"verdict": "io-bound", "median_step_time_us": None}, "steps": steps}


def test_diff_headlines_throughput_not_the_median_of_bursty_steps():
    from perfscope.reports.diff import ratio, text_diff

    # A: a loader wait every fourth step; B: even steps. Medians say B is slower, throughput faster.
    a, b = _bursty([200, 10, 10, 10] * 3), _bursty([40] * 12)
    assert ratio(a, b) == pytest.approx(40 / 57.5)
    out = text_diff(a, b)
    assert "step time (window / steps): 57.5 ms -> 40.0 ms" in out
    assert "B is 1.44x faster" in out
