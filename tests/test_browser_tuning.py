"""The tuning report in a real browser: headless Chromium loads pages rendered from tuning records.

As for the bottleneck report (``test_browser.py``, whose ``chromium`` fixture this reuses: skipped
without a browser, failed under CI): no console message (no error, no CSP violation), no network
request, the recommendation in the page's text, and a screenshot that is not blank and holds a
chart's worth of coloured pixels. The hostile record puts ``<img onerror>`` and quotes into every
string field, so a missed escape would show as a request or a console message.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import browser
import pytest
import test_browser
from tunereportkit import EVIL, HEADLINE, hostile, keep_current, realistic

from perfscope.reports import write_tuning

chromium = test_browser.chromium
SIZE = test_browser.SIZE

RECORDS = {
    "realistic": (realistic, HEADLINE),
    "keep_current": (keep_current, "Keep your current settings: no trial of the search beat the baseline"),
    # the hostile knob name and value show as text, in the headline like everywhere else
    "hostile": (hostile, f"1.80x faster (95% interval 1.60x–2.00x, 5 rounds): {EVIL} {EVIL} → {EVIL}"),
}


@pytest.fixture(scope="module", params=list(RECORDS))
def tuning_page(request, chromium, tmp_path_factory):
    """(name, expected headline, browser.Page, screenshot path) for one tuning record."""
    name = request.param
    make, headline = RECORDS[name]
    out = tmp_path_factory.mktemp(f"tune-{name}")
    html = write_tuning(make(), out / "report.html")
    png = out / "screenshot.png"
    page = browser.screenshot(html, png, SIZE)
    if keep := os.environ.get("PERFSCOPE_SCREENSHOTS"):
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(png, Path(keep) / f"tune_{name}.png")
    return name, headline, page, png


def coloured_pixels(png: Path) -> tuple[int, float, int, set[int]]:
    """(distinct colours, share of pixels unlike the background, saturated pixels, their hue bins)."""
    from PIL import Image

    with Image.open(png) as im:
        rgb = im.convert("RGB")
    assert rgb.size == SIZE
    pixels = SIZE[0] * SIZE[1]
    colours = rgb.getcolors(maxcolors=pixels)
    background_count, _ = max(colours)
    h, s, v = (band.load() for band in rgb.convert("HSV").split())
    hues, coloured = set(), 0
    for y in range(0, SIZE[1], 2):
        for x in range(0, SIZE[0], 2):
            if s[x, y] > 90 and v[x, y] > 50:
                coloured += 4
                hues.add(h[x, y] // 16)
    return len(colours), 1 - background_count / pixels, coloured, hues


def test_tuning_report_in_browser(tuning_page):
    name, headline, page, png = tuning_page
    assert page.console == [], f"{name}: console messages in the tuning report:\n" + "\n".join(page.console)
    assert page.requests == [], f"{name}: the tuning report fetched {page.requests}"
    text = browser.dom_text(page.dom)
    assert headline in text, f"{name}: {headline!r} not in the page text: {text[:500]}"
    assert "<img" not in page.dom.lower(), f"{name}: an <img> element reached the DOM"
    n_colours, inked, coloured, hues = coloured_pixels(png)
    assert n_colours >= 50, f"{name}: only {n_colours} colours in the screenshot"
    assert inked >= 0.02, f"{name}: {inked:.1%} of the screenshot differs from the background"
    assert coloured >= 3000, f"{name}: only ~{coloured} coloured pixels: no chart drawn?"
    assert len(hues) >= 3, f"{name}: coloured pixels in only {len(hues)} hue(s): {sorted(hues)}"
