"""The charts drawn by matplotlib (reports/charts.py, reports/plots.py): what each becomes in the page.

Every chart kind is checked against one contract: well-formed SVG, the same bytes for the same
input, nothing that would leak into the rest of the page (a ``<style>``, repeated ids, matplotlib's
fonts or metadata), one tooltip per mark in drawing order, and labels that stay text whatever they
hold (markup, mathtext, control characters).
"""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from perfscope.reports import plots
from perfscope.reports import charts
from perfscope.reports.charts import Chart

EVIL = '<img src=x onerror=alert(1)> $x^2$ & "q" \x00\u202e'

BARS = [
    {"values": [3.0, 1.0, 0.0], "label": "1", "sub": "io", "title": "step 1"},
    {"values": [2.0, 0.5, 0.25], "label": "2", "sub": "compute", "title": "step 2", "faded": True},
    {"values": [4.0, 0.0, 1.0], "label": EVIL, "sub": "", "title": EVIL},
]
PARTS = [("compute", "#009E73"), ("input wait", "#E69F00"), ("other idle", "#999999")]


def _stacked(key="t"):
    return plots.stacked_columns(key, BARS, PARTS, "step time (ms)", EVIL, groups=[(0, 1, "rank 0"), (2, 2, "rank 1")])


def _columns(key="t", log=False):
    return plots.columns(key, [1.0, 30.0, 4000.0, 0.0], ["a", "b", EVIL, "d"], "#999999", "gaps", EVIL,
                         titles=["a: 1", "b: 30", EVIL, "d: 0"], log=log)


def _hbars(key="t", x_label="ms"):
    rows = [{"label": EVIL, "end": "5 ms", "segments": [(3.0, "#009E73", EVIL, "compute 60%"), (2.0, "#999999", "b", "")],
             "inner": [(1.0, "#0072B2", "inner")]},
            {"label": "second", "segments": [(1.0, "#009E73", "c", "")]}]
    return plots.hbars(key, rows, EVIL, x_label)


KINDS = {"stacked": _stacked, "columns": _columns, "log columns": lambda key="t": _columns(key, log=True),
         "hbars": _hbars, "hbars without axis": lambda key="t": _hbars(key, None)}


@pytest.fixture(autouse=True)
def _drawn_afresh():
    """Each test draws its charts itself, not from an earlier test's cache."""
    charts.clear_cache()
    yield
    charts.clear_cache()


def _parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


@pytest.fixture(params=sorted(KINDS))
def kind(request):
    return KINDS[request.param]


def test_a_chart_is_one_well_formed_svg_element_with_an_accessible_name(kind):
    svg = kind()
    root = _parse(svg)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert root.get("role") == "img" and root.get("aria-label") == EVIL.replace("\x00", "\ufffd").replace("\u202e", "\ufffd")
    width, height = (float(v) for v in root.get("viewBox").split()[2:])
    assert float(root.get("width")) == width and height > 0


def test_the_same_input_gives_the_same_bytes(kind):
    first = kind()
    charts.clear_cache()  # drawn again, not looked up
    assert kind() == first


def _count_drawings(monkeypatch) -> list[str]:
    drawn: list[str] = []
    enter = Chart.__enter__
    monkeypatch.setattr(Chart, "__enter__", lambda self: (drawn.append(self.key), enter(self))[1])
    return drawn


def test_a_chart_asked_for_again_is_not_drawn_again_and_a_changed_input_is(monkeypatch):
    charts.clear_cache()
    drawn = _count_drawings(monkeypatch)
    bars = [dict(b, values=list(b["values"])) for b in BARS]
    first = plots.stacked_columns("c", bars, PARTS, "ms", "label")
    assert plots.stacked_columns("c", bars, PARTS, "ms", "label") == first and drawn == ["c"]
    bars[0]["values"][0] = 30.0  # the caller's list changed in place after the first call
    changed = plots.stacked_columns("c", bars, PARTS, "ms", "label")
    assert drawn == ["c", "c"] and changed != first and "step 1 · compute: 30.00" in changed
    assert plots.stacked_columns("c", bars, PARTS, "ms", "other label") != changed and len(drawn) == 3


def test_the_cache_is_bounded_and_unpicklable_arguments_are_drawn_every_time():
    calls = []

    @charts.cached
    def draw(x, extra=None):
        calls.append(x)
        return f"<svg>{x}</svg>"

    for i in range(charts.CACHED_CHARTS + 1):
        draw(i)
    draw(charts.CACHED_CHARTS)  # the newest is kept
    assert len(calls) == charts.CACHED_CHARTS + 1
    draw(0)  # the oldest was let go
    assert len(calls) == charts.CACHED_CHARTS + 2
    draw(1, extra=lambda: None)
    draw(1, extra=lambda: None)
    assert calls[-2:] == [1, 1]

    class Unpicklable:
        def __reduce__(self):
            raise ValueError("not this one")  # as a ctypes pointer does

    draw(2, extra=Unpicklable())
    draw(2, extra=Unpicklable())
    assert calls[-2:] == [2, 2]


def test_the_cache_keeps_a_byte_budget_and_never_a_failed_drawing(monkeypatch):
    monkeypatch.setattr(charts, "CACHED_BYTES", 3000)
    calls = []

    @charts.cached
    def draw(x):
        calls.append(x)
        if x < 0:
            raise ValueError("cannot draw")
        return "x" * 1000

    for i in range(4):
        draw(i)
    draw(3)
    draw(2)
    assert calls == [0, 1, 2, 3]  # the last three fit in 3000 bytes
    draw(0)
    assert calls[-1] == 0  # the oldest went over the budget
    for _ in range(2):
        with pytest.raises(ValueError):
            draw(-1)
    assert calls[-2:] == [-1, -1]
    assert "Chart not drawn" in charts.or_note(draw)(-1)


def test_nothing_leaks_into_the_page(kind):
    svg = kind()
    for banned in ("<?xml", "<!DOCTYPE", "<metadata", "<style", "font-family", "<script", "DejaVu", "Date"):
        assert banned not in svg, banned
    # matplotlib's own group ids (figure_1, axes_1, ...) would repeat between charts: only the
    # defs' ids (clip paths, marker shapes) stay, and every reference points at one of them
    ids = re.findall(r'\bid="([^"]+)"', svg)
    assert len(ids) == len(set(ids))
    assert not [i for i in ids if re.match(r"(figure|axes|patch|text|line2d|xtick|ytick|matplotlib)", i)]
    for ref in re.findall(r'url\(#([^)]+)\)|href="#([^"]+)"', svg):
        assert (ref[0] or ref[1]) in ids


def test_two_charts_on_one_page_share_no_id(kind):
    a, b = kind("one"), kind("two")
    assert not set(re.findall(r'\bid="([^"]+)"', a)) & set(re.findall(r'\bid="([^"]+)"', b))


def test_labels_stay_text_markup_mathtext_and_controls_included(kind):
    svg = kind()
    assert "<img" not in svg and "&lt;img src=x onerror=alert(1)&gt;" in svg
    texts = [t.text or "" for t in _parse(svg).iter("{http://www.w3.org/2000/svg}text")]
    titles = [t.text or "" for t in _parse(svg).iter("{http://www.w3.org/2000/svg}title")]
    shown = texts + titles
    assert any("$x^2$" in t for t in shown)  # never typeset as mathtext
    assert not any("\x00" in t or "\u202e" in t for t in shown)


def test_stacked_columns_give_one_tooltip_per_segment_in_order():
    svg = _stacked()
    tips = re.findall(r'<g class="tip"><title>([^<]*)</title><path ', svg)
    assert tips == ["step 1 · compute: 3.00", "step 2 · compute: 2.00", "&lt;img src=x onerror=alert(1)&gt; $x^2$ &amp; "
                    "&quot;q&quot; \ufffd\ufffd · compute: 4.00", "step 1 · input wait: 1.00", "step 2 · input wait: 0.50",
                    "step 2 · other idle: 0.25",
                    "&lt;img src=x onerror=alert(1)&gt; $x^2$ &amp; &quot;q&quot; \ufffd\ufffd · other idle: 1.00"]
    # the faded step (left out of the verdict) is drawn at 45% opacity, the others opaque
    opacities = re.findall(r'<g class="tip"><title>step 2[^<]*</title><path [^>]*fill-opacity: ([0-9.]+)', svg)
    assert opacities and {float(o) for o in opacities} == {0.45}
    assert "rank 0" in svg and "rank 1" in svg


def test_columns_skip_empty_bins_and_a_log_axis_labels_its_decades_in_plain_numbers():
    linear, log = _columns(), _columns(log=True)
    assert linear.count('<g class="tip">') == log.count('<g class="tip">') == 3  # the empty bin is not drawn
    labels = {t.text for t in _parse(log).iter("{http://www.w3.org/2000/svg}text")}
    assert {"1", "10", "100", "1,000", "10,000"} <= labels
    assert not any("10^" in (t or "") or "mathdefault" in (t or "") for t in labels)


def test_a_bar_of_shares_has_no_axis_and_captions_segments_that_fit():
    svg = _hbars(x_label=None)
    labels = [t.text for t in _parse(svg).iter("{http://www.w3.org/2000/svg}text")]
    assert "compute 60%" in labels
    assert not any(re.fullmatch(r"[\d.,]+", t or "") for t in labels)  # no tick numbers
    assert svg.count('<g class="tip">') == 4  # three outer segments and the inner one


def test_more_columns_than_fit_thin_their_labels():
    bars = [{"values": [1.0], "label": str(i), "sub": "io", "title": f"step {i}"} for i in range(200)]
    svg = plots.stacked_columns("many", bars, [("compute", "#009E73")], "ms", "many")
    labels = [t.text for t in _parse(svg).iter("{http://www.w3.org/2000/svg}text")]
    steps = [t for t in labels if t and t.isdigit() and int(t) < 200]
    assert 5 <= len(steps) <= 25 and "io" not in labels
    assert svg.count('<g class="tip">') == 200  # every bar keeps its tooltip


def test_a_chart_key_must_be_a_plain_name():
    with pytest.raises(ValueError, match="chart key"):
        Chart('x" onload="a', 100, 100, (10, 10, 10, 10))


def test_the_commands_that_draw_nothing_do_not_load_matplotlib():
    code = ("import sys, reports.charts, reports.plots, perfscope.cli.check, perfscope.cli.merge; "
            "assert 'matplotlib' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_values_no_axis_can_show_give_a_visible_note_not_a_failed_report():
    import warnings

    bars = [{"values": [1.7e308, 1.7e308], "label": "1", "title": "step 1"}]  # they add up to inf
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = plots.stacked_columns("huge", bars, PARTS[:2], "ms", "huge")
    assert out.startswith('<p class="warn">Chart not drawn') and "<svg" not in out
    assert not [w for w in seen if issubclass(w.category, RuntimeWarning)]


def test_a_label_that_looks_like_markup_matplotlib_writes_is_left_as_it_is():
    label = 'x="1.23456" font-family: serif; transform="rotate(-0 1 2)" <g id="axes_1"> d="M 1.23456 2"'
    svg = plots.columns("lookalike", [2.0], [label], "#999999", "n", "lookalike", titles=[label])
    texts = [t.text for t in _parse(svg).iter("{http://www.w3.org/2000/svg}text")]
    titles = [t.text for t in _parse(svg).iter("{http://www.w3.org/2000/svg}title")]
    assert label in texts and titles == [label]


def test_large_values_read_in_plain_numbers_without_an_offset():
    svg = plots.columns("big", [2.5e6, 1e6], ["a", "b"], "#999999", "tokens/s", "big")
    labels = [t.text for t in _parse(svg).iter("{http://www.w3.org/2000/svg}text")]
    assert "2,500,000" in labels and "1e6" not in " ".join(labels)


def test_labels_and_values_of_different_lengths_still_draw():
    svg = plots.columns("short", [1.0, 2.0], ["a", "b", "c"], "#999999", "n", "short", titles=["a: 1"])
    assert svg.startswith("<svg") and svg.count('<g class="tip">') == 2


def test_a_backslash_in_a_label_is_text_not_a_pattern_escape():
    svg = plots.columns("slash", [1.0], [r"tok\s \1"], "#999999", r"tok\s", r"value (tok\s \1)")
    assert _parse(svg).get("aria-label") == r"value (tok\s \1)"


def test_markers_split_by_clipping_get_no_tooltip_rather_than_a_wrong_one():
    def titled(ys):
        with Chart("clip", 300, 200, (30, 10, 10, 30)) as c:
            c.ax.set_ylim(0, 10)
            c.tips(c.ax.plot([0, 1, 2], ys, ls="none", marker="o")[0], ["A", "B", "C"])
            return re.findall(r'<g class="tip"><title>([^<]*)</title><use ', c.svg("clip"))

    assert titled([5, 2, 8]) == ["A", "B", "C"]
    assert titled([5, -1e5, 8]) == []  # matplotlib drew B as two clipped marks: no title beats a wrong one


def test_the_users_matplotlibrc_does_not_change_a_chart(tmp_path):
    (tmp_path / "matplotlibrc").write_text("text.usetex: True\naxes.formatter.use_mathtext: True\n"
                                           "savefig.bbox: tight\naxes.grid: True\nfont.size: 30\n")
    code = ("import sys; sys.path.insert(0, 'tests'); from test_charts import _stacked, _columns, _hbars; "
            "sys.stdout.write(_stacked() + _columns(log=True) + _hbars())")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**__import__("os").environ, **env}).stdout
            for env in ({}, {"MATPLOTLIBRC": str(tmp_path)})]
    assert runs[0] == runs[1] and "mathdefault" not in runs[1]


def test_a_negative_trial_value_sits_on_the_axis_and_every_marker_keeps_its_own_tooltip():
    from tunereportkit import realistic

    from perfscope.reports import render_tuning

    record = realistic()
    record["trials"][2]["value"] = -1e6
    html = render_tuning(record)
    tips = re.findall(r'<g class="mk mk-complete"><title>(trial \d+)[^<]*</title><use [^>]*\bx="([^"]*)"', html)
    numbers = [int(t.split()[1]) for t, _ in tips]
    xs = [float(x) for _, x in tips]
    assert len(numbers) == 4
    # each tooltip sits on its own trial's marker: x is linear in the trial number
    per_trial = (xs[1] - xs[0]) / (numbers[1] - numbers[0])
    for n, x in zip(numbers, xs):
        assert abs(xs[0] + (n - numbers[0]) * per_trial - x) < 1.0, (n, x)
