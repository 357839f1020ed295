"""Small HTML helpers shared by the report sections: escaping, number formatting, the page shell.

Every value that reaches the page goes through :func:`esc` (text and attribute values alike), so
a kernel called ``</script><script>...`` or a file called ``<img onerror=...>`` stays text. The
page carries no script at all and a Content-Security-Policy that allows nothing but its own
inline styles and ``data:`` images, so even a missed escape could not run code or fetch anything.
"""

from __future__ import annotations

import html
import re
from importlib import resources

from perfscope.record.values import finite_number

# Nothing external: no script anywhere, styles only inline, images only data: URIs.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"


# C0 control characters other than tab, newline and carriage return are not allowed in HTML text.
# Controls, and the bidi embeddings, overrides and isolates that can make a name read otherwise.
# Lone surrogates (from a JSON "\ud800") and the noncharacters U+FFFE/U+FFFF cannot be encoded or are not XML.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]")


def clean(value) -> str:
    """``value`` as text with control characters (a NUL in a kernel name) and bidi controls
    replaced by U+FFFD, not escaped: for text handed to a library that escapes it (matplotlib)."""
    return _CONTROL.sub("\ufffd", "" if value is None else str(value))


def esc(value) -> str:
    """``value`` as HTML text, safe in element content and in quoted attribute values; control
    characters become U+FFFD (:func:`clean`)."""
    return html.escape(clean(value), quote=True)


num = finite_number  # a finite float of a record's value, or None (None, NaN, text in a hand-edited summary)


def _decimals(v: float) -> int:
    v = abs(v)
    return 0 if v >= 100 else 1 if v >= 10 else 2


def ms(value_us, unit: bool = True) -> str:
    """Microseconds shown as milliseconds (``76.8 ms``); ``-`` when unknown."""
    v = num(value_us)
    if v is None:
        return "-"
    v /= 1000.0
    return f"{v:.{_decimals(v)}f}" + (" ms" if unit else "")


def dur(value_us) -> str:
    """A duration with a unit that fits: ``850 µs``, ``12.3 ms``, ``4.20 s``."""
    v = num(value_us)
    if v is None:
        return "-"
    if abs(v) < 1000:
        return f"{v:.{_decimals(v)}f} µs"
    if abs(v) < 1e6:
        return f"{v / 1e3:.{_decimals(v / 1e3)}f} ms"
    return f"{v / 1e6:.{_decimals(v / 1e6)}f} s"


def pct(frac, digits: int = 1) -> str:
    v = num(frac)
    return "-" if v is None else f"{100.0 * v:.{digits}f}%"


def count(value) -> str:
    v = num(value)
    return "-" if v is None else f"{int(v):,}"


def truncate(text, limit: int = 120) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def section(anchor: str, title: str, body: str) -> str:
    """One report section; ``anchor`` and ``title`` are perfscope's own words (escaped anyway)."""
    return f'<section id="{esc(anchor)}">\n<h2>{esc(title)}</h2>\n{body}\n</section>\n'


def note(text: str, cls: str = "muted") -> str:
    return f'<p class="{cls}">{esc(text)}</p>'


def table(headers: list[tuple[str, str]], rows: list[tuple[str, list[str]]], caption: str = "") -> str:
    """A table. ``headers``: (label, css class); ``rows``: (row class, cells already HTML)."""
    head = "".join(f'<th scope="col" class="{c}">{esc(h)}</th>' for h, c in headers)
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    body = "\n".join(
        f'<tr class="{rc}">' + "".join(f'<td class="{c}">{cell}</td>' for (_, c), cell in zip(headers, cells)) + "</tr>"
        for rc, cells in rows
    )
    return f"<table>{cap}<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody></table>"


def legend(items: list[tuple[str, str]]) -> str:
    """A colour legend: (label, colour) pairs."""
    return '<div class="legend">' + "".join(
        f'<span><i style="background:{esc(c)}"></i>{esc(label)}</span>' for label, c in items
    ) + "</div>"


def figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{esc(caption)}</figcaption></figure>"


def page(title: str, header: str, nav: list[tuple[str, str]], body: str) -> str:
    """The whole document: CSP, inline CSS, header, section links, sections."""
    css = resources.files("perfscope.reports").joinpath("templates/report.css").read_text(encoding="utf-8")
    links = "".join(f'<a href="#{esc(a)}">{esc(t)}</a>' for a, t in nav)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<meta name="referrer" content="no-referrer">\n<link rel="icon" href="data:,">\n'
        f"<title>{esc(title)}</title>\n<style>\n{css}</style>\n</head>\n<body>\n"
        f"{header}\n<nav>{links}</nav>\n{body}</body>\n</html>\n"
    )
