"""The HTML report in a real browser: headless Chromium loads reports made from real traces.

For each report: no console message (no error, no uncaught exception, no CSP violation), no
network request, the verdict in the page's text, and a screenshot that is not blank and holds a
chart's worth of coloured pixels. How the console and the requests are read is in ``browser.py``;
the first tests prove that the detectors see what they must (a deliberate ``console.error``, an
uncaught exception, a blocked inline script, a blocked and an unblocked remote image).

Skipped with a reason where no Chromium is installed, except under CI (``CI`` set), where a
missing browser fails: ``.ci/run`` installs Debian's ``chromium``. Set ``PERFSCOPE_SCREENSHOTS``
to a folder to keep the screenshots.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import browser

ROOT = Path(__file__).resolve().parents[1]
# The report's own policy, repeated here so the detector tests do not depend on the report code.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
SIZE = (1280, 2000)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="session")
def chromium() -> str:
    exe = browser.find_chromium()
    if exe is None:
        reason = (
            f"no headless browser found (looked for {', '.join(browser.CANDIDATES)} on PATH and $CHROMIUM); "
            "install Debian's `chromium` package to run the browser tests"
        )
        if in_ci():
            pytest.fail(f"CI is set but {reason}; .ci/run should have installed it", pytrace=False)
        pytest.skip(reason)
    return exe


def page_file(tmp_path: Path, body: str, csp: str | None = None) -> Path:
    meta = f'<meta http-equiv="Content-Security-Policy" content="{csp}">' if csp else ""
    path = tmp_path / "page.html"
    path.write_text(f'<!DOCTYPE html><html><head><meta charset="utf-8">{meta}</head><body>{body}</body></html>')
    return path


# ---------------------------------------------------------------------------------------------
# The detectors see what they must


def test_clean_page_gives_nothing(chromium, tmp_path):
    page = browser.load(page_file(tmp_path, "<p>hello <b>world</b></p>", CSP))
    assert page.console == [] and page.requests == []
    assert "hello world" in browser.dom_text(page.dom)


@pytest.mark.parametrize(
    "body, expected",
    [
        ('<script>console.error("deliberate-x")</script>', "deliberate-x"),
        ('<script>setTimeout(() => console.error("late-y"), 300)</script>', "late-y"),
        ('<script>throw new Error("boom-z")</script>', "Uncaught Error: boom-z"),
    ],
    ids=["console.error", "late console.error", "uncaught exception"],
)
def test_console_errors_are_detected(chromium, tmp_path, body, expected):
    messages = browser.console_messages(page_file(tmp_path, body))
    assert any(expected in m for m in messages), messages


def test_csp_violations_are_detected(chromium, tmp_path):
    body = '<script>console.error("must not run")</script><img src="http://example.com/x.png">'
    page = browser.load(page_file(tmp_path, body, CSP))
    assert not any("must not run" in m for m in page.console), page.console
    assert any("inline script" in m and "Content Security Policy" in m for m in page.console), page.console
    assert any("http://example.com/x.png" in m and "Content Security Policy" in m for m in page.console), page.console
    assert page.requests == []  # blocked before it reached the network


def test_network_requests_are_detected(chromium, tmp_path):
    # Without the policy the image is fetched; port 9 on loopback refuses at once, but the
    # request has gone through the network stack and is in the NetLog.
    page = browser.load(page_file(tmp_path, '<img src="http://127.0.0.1:9/x.png">'))
    assert "http://127.0.0.1:9/x.png" in page.requests, page.requests


# ---------------------------------------------------------------------------------------------
# Reports from real traces

ANALYZED = {
    "a100": "hta/a100_rank3_of8_train.json.gz",
    "two_ranks": "hta/two_ranks",
    "resnet50_num_workers_0": "tb_plugin/resnet50_num_workers_0",
    "cpu_only": "hta/cpu_only_rank34.pt.trace.json.gz",
}
REPORTS = [*ANALYZED, pytest.param("profile_io_bound", marks=pytest.mark.slow)]


def perfscope(*args, timeout=300) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "perfscope", *map(str, args)],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.fixture(scope="module", params=REPORTS)
def loaded(request, chromium, tmp_path_factory):
    """(name, summary.json, browser.Page, screenshot path) for one report."""
    name = request.param
    out = tmp_path_factory.mktemp(name) / "out"
    if name in ANALYZED:
        shared = request.getfixturevalue("shared_traces")
        perfscope("analyze", shared / ANALYZED[name], "--out", out)
    else:
        perfscope("profile", "--out", out, ROOT / "examples" / "io_bound.py")
    png = out / "screenshot.png"
    page = browser.screenshot(out / "report.html", png, SIZE)
    if keep := os.environ.get("PERFSCOPE_SCREENSHOTS"):
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(png, Path(keep) / f"{name}.png")
    return name, json.loads((out / "summary.json").read_text()), page, png


def test_report_has_no_console_messages(loaded):
    name, _, page, _ = loaded
    assert page.console == [], f"{name}: console messages in the report:\n" + "\n".join(page.console)


def test_report_makes_no_network_requests(loaded):
    name, _, page, _ = loaded
    assert page.requests == [], f"{name}: the report fetched {page.requests}"


def test_report_text_shows_the_verdict(loaded):
    name, summary, page, _ = loaded
    text = browser.dom_text(page.dom)
    verdict = summary["overall"]["verdict"]
    assert verdict and verdict in text, f"{name}: verdict {verdict!r} not in the page text: {text[:500]}"
    if name == "profile_io_bound":
        assert verdict == "io-bound"


def test_report_timeline_offers_each_rank(loaded):
    name, summary, page, _ = loaded
    if name != "two_ranks":
        pytest.skip("one rank")
    text = browser.dom_text(page.dom)
    assert "rank 1 · step" in text, text[:2000]


def test_report_shows_memory(loaded):
    name, summary, page, _ = loaded
    text = browser.dom_text(page.dom)
    if name == "profile_io_bound":  # perfscope profile measured it: the peak against the machine
        assert summary["details"]["memory"]["kind"] == "host"
        assert "resident" in text and "headroom" in text and "GiB" in text
    elif summary["details"].get("trace_memory"):  # the profiler's allocator instants: read from the trace
        assert "From the traces' allocator records" in text and "Peak allocated" in text and "MiB" in text
        assert "aten::" in text  # the operators charged with the allocations
    else:  # traces recorded without perfscope: the section says what would measure it
        assert "Not measured" in text


def test_report_charts_reach_the_browser_with_their_tooltips(loaded):
    """matplotlib's charts, as the browser parsed them: every per-step bar segment keeps its
    tooltip, and on GPU runs both idle-gap histograms do too."""
    name, summary, page, _ = loaded

    def part(anchor: str) -> str:
        return page.dom.split(f'<section id="{anchor}">')[1].split("</section>")[0]

    steps = part("steps")
    assert steps.count("<svg") == 1 and "</svg>" in steps
    tips = re.findall(r'<g class="tip"><title>(rank [^<]* step [^<]*)</title><path ', steps)
    assert len(tips) >= min(len(summary["steps"]), 300), f"{name}: {len(tips)} bar tooltips"
    if summary["mode"] == "gpu" and "No idle-gap" not in part("gaps"):
        gaps = part("gaps")
        assert gaps.count("<svg") == 2 and len(re.findall(r'<g class="tip"><title>', gaps)) >= 2, name


def test_report_screenshot_is_not_blank(loaded):
    from PIL import Image

    name, _, _, png = loaded
    with Image.open(png) as im:
        rgb = im.convert("RGB")
    assert rgb.size == SIZE
    pixels = SIZE[0] * SIZE[1]
    colours = rgb.getcolors(maxcolors=pixels)
    background_count, background = max(colours)
    # Text alone gives dozens of anti-aliased greys; a blank or error page gives a handful.
    assert len(colours) >= 50, f"{name}: only {len(colours)} colours in the screenshot"
    inked = 1 - background_count / pixels
    assert inked >= 0.02, f"{name}: {inked:.1%} of the screenshot differs from the background {background}"
    # Charts: saturated pixels (text and rules are grey) in at least three hues.
    hsv = rgb.convert("HSV")
    h, s, v = (band.load() for band in hsv.split())
    hues, coloured = set(), 0
    for y in range(0, SIZE[1], 2):  # every other row and column is plenty
        for x in range(0, SIZE[0], 2):
            if s[x, y] > 90 and v[x, y] > 50:
                coloured += 4
                hues.add(h[x, y] // 16)
    assert coloured >= 3000, f"{name}: only ~{coloured} coloured pixels: no chart drawn?"
    assert len(hues) >= 3, f"{name}: coloured pixels in only {len(hues)} hue(s): {sorted(hues)}"


def test_gpu_telemetry_section_and_lane_render_cleanly(chromium, tmp_path):
    """A GPU trace with NVML samples (synthetic: no GPU here): the telemetry section, its lane under the
    timeline and the throttling call-out render without a console message or a request."""
    from perfscope.reports import write_report
    from test_telemetry import traced

    a = traced(tmp_path, [20, 40, 60, 80], reasons={1: 0x40})
    out = write_report(a.summary(), tmp_path / "report.html", tables=a.tables)
    page = browser.screenshot(out, tmp_path / "telemetry.png", SIZE)
    assert page.console == [] and page.requests == []
    text = browser.dom_text(page.dom)
    assert "GPU telemetry" in text and "GPU utilisation 50%" in text and "GPU util (NVML)" in text
    assert "thermal (hardware)" in text


def test_report_shows_operators_and_gpu_efficiency(loaded):
    name, summary, page, _ = loaded

    def part(anchor: str) -> str:
        return browser.dom_text(page.dom.split(f'<section id="{anchor}">')[1].split("</section>")[0])

    operators = summary["details"].get("operators")
    if operators and operators["rows"]:
        text = part("operators")
        assert operators["rows"][0]["name"][:40] in text and "host self (ms)" in text
        assert ("device self (ms)" in text) is (summary["mode"] == "gpu")
        shaped = [r for r in operators["rows"] if r["shapes"]]
        if shaped:
            assert shaped[0]["shapes"][0]["input_dims"][:30] in text
    efficiency = summary["details"].get("gpu_efficiency")
    if efficiency:
        text = part("kernels")
        assert "estimated SM efficiency" in text and "Tensor Core share" in text


def test_report_shows_the_whole_run_of_a_profiled_run_only(loaded):
    """`perfscope profile` timed every step: the Whole run section draws them with the window's
    band and phase bands carrying tooltips; traces analyzed alone have no such section."""
    name, summary, page, _ = loaded
    sections = re.findall(r'<section id="([a-z_-]+)">', page.dom)
    if name != "profile_io_bound":
        assert "run" not in sections and summary["details"].get("run_steps") is None
        return
    (view,) = summary["details"]["run_steps"]
    part = page.dom.split('<section id="run">')[1].split("</section>")[0]
    assert part.count("<svg") == 1 and "profiled window: steps" in part
    assert len(re.findall(r'<g class="tip"><title>(input|forward|backward|optimizer|other): median', part)) == 5
    text = browser.dom_text(part)
    assert f"{view['steps']} steps, median" in text and "Whole run" in text


def test_report_shows_the_model_flops_utilisation_with_its_assumptions(loaded):
    name, summary, page, _ = loaded
    view = summary["details"].get("mfu")
    part = page.dom.split('<section id="kernels">')[1].split("</section>")[0]
    if view is None:
        assert "Model FLOPs utilisation" not in part
        return
    text = browser.dom_text(part)
    assert "Model FLOPs utilisation" in text and "GFLOP a step" in text
    for assumption in view["assumptions"]:
        assert assumption[:60] in text, (name, assumption)
    if view["mfu"] is not None:
        assert f"{view['mfu']:.1%} of" in text
