"""Charts with axes drawn by matplotlib's SVG backend, inlined in the report page.

matplotlib places the ticks (linear and logarithmic), lays out the labels and draws the marks; this
module turns its SVG file into an element that can sit in an HTML page beside others:

* no XML prologue, no metadata (no date: the same summary gives the same page), no ``<style>``
  element (inside inline SVG its ``*`` rule would restyle the whole page);
* the page's own font (matplotlib's font list is dropped; ``svg text`` in report.css applies);
* ids unique in the page: the chart's ``key`` is matplotlib's hash salt, so its clip paths and
  markers get ids no other chart has, and matplotlib's own group ids are removed;
* a tooltip per mark: :meth:`Chart.tip` names an artist, :meth:`Chart.tips` each element of a
  collection or each marker of a line, in drawing order; each becomes
  ``<g class="CLS"><title>TIP</title>...</g>`` (the browser's tooltip, and what tests count);
* coordinates cut to 0.1 of a unit, which keeps the page about the size of hand-written SVG.

The page keeps its Content-Security-Policy: matplotlib's output uses only inline ``style``
attributes, which the report's CSP allows, and no script. Text never goes through mathtext
(``text.parse_math`` off: a knob called ``$x$`` stays ``$x$``), and every label given to
matplotlib goes through :func:`perfscope.reports.html.clean` first.

matplotlib is imported on the first chart, not with the module: commands that draw nothing
(``check``, ``merge``) never pay for it. No pyplot: each chart is its own ``Figure``, with no
global figure manager, so charts are independent of each other and of the GUI backends.
"""

from __future__ import annotations

import functools
import hashlib
import io
import pickle
import re
import threading
from collections import OrderedDict
import warnings
from contextlib import ExitStack

from perfscope.reports.html import clean, esc

# matplotlib's SVG backend draws at 72 units per inch: a figure of W/72 x H/72 inches has the
# viewBox "0 0 W H", and one unit is one CSS pixel when the chart is shown at its own width.
UNITS_PER_INCH = 72.0

RC = {
    "svg.fonttype": "none",  # text stays text: small, selectable, in the page's font
    "text.parse_math": False,  # names from a record are never mathtext
    "font.size": 11.0,
    "axes.labelsize": 11.0,
    "xtick.labelsize": 10.0,
    "ytick.labelsize": 10.0,
    "text.color": "#222222",
    "axes.labelcolor": "#222222",
    "axes.edgecolor": "#444444",
    "axes.linewidth": 1.0,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.axisbelow": True,
    "axes.facecolor": "none",
    "figure.facecolor": "none",
    "xtick.color": "#444444",
    "ytick.color": "#444444",
    "xtick.labelcolor": "#222222",
    "ytick.labelcolor": "#222222",
    "grid.color": "#e4e4e4",
    "grid.linewidth": 1.0,
    "lines.solid_capstyle": "butt",
    # tick labels in plain numbers: no "1e6" offset or multiplier that a reader can miss
    "axes.formatter.useoffset": False,
    "axes.formatter.limits": (-6, 15),
}

# Why each rewrite of matplotlib's file is safe: they touch only what matplotlib itself writes.
_PROLOGUE = re.compile(r"^.*?(?=<svg\b)", re.DOTALL)
_ROOT = re.compile(r"<svg\b[^>]*>")
_METADATA = re.compile(r"\s*<metadata>.*?</metadata>", re.DOTALL)
_STYLE = re.compile(r"\s*<style[^>]*>.*?</style>", re.DOTALL)
_EMPTY_DEFS = re.compile(r"\s*<defs>\s*</defs>")
_GROUP_ID = re.compile(r'<g id="([^"]*)"')
_FONT_FAMILY = re.compile(r"font-family: [^;\"]*;? ?")
_NO_ROTATION = re.compile(r' transform="rotate\(-0 [^)]*\)"')
_GEOMETRY = re.compile(r'\b(d|x|y|width|height|transform|x1|x2|y1|y2)="([^"]*)"')
_LONG_NUMBER = re.compile(r"(-?\d+\.\d)\d+")
_TAG = re.compile(r"<[^>]*>")
_MARK = re.compile(r"<(path|use)\b[^>]*?/>")
_BETWEEN_TAGS = re.compile(r">\s+<")
_EMPTY_GROUP = re.compile(r"<g/>")
_GROUP_TAG = re.compile(r"<g\b|</g>")


# matplotlib's settings are one per process: charts drawn from two threads at once take turns.
_DRAWING = threading.RLock()


def _figure_class():
    """matplotlib's ``Figure``, imported on first use (with the SVG backend it saves through)."""
    from matplotlib.figure import Figure

    return Figure


def _geometry(m: re.Match) -> str:
    value = _LONG_NUMBER.sub(r"\1", " ".join(m.group(2).split()))
    return f'{m.group(1)}="{value}"'


def _tag(m: re.Match) -> str:
    """One tag with the font list and no-op rotations dropped and its geometry cut to 0.1 units.
    Only tags are rewritten, never text: a label reading ``x="1.234"`` stays as it is (matplotlib
    escapes ``<``, ``>`` and quotes inside attributes, so a tag ends at the first ``>``)."""
    return _GEOMETRY.sub(_geometry, _NO_ROTATION.sub("", _FONT_FAMILY.sub("", m.group(0))))


class Chart:
    """One figure being drawn: its axes, the tooltips of its marks, and the inline SVG it becomes.

    Use as a context manager (matplotlib's settings, :data:`RC`, hold while it is open, and
    other threads' charts wait for it to close)::

        with Chart("gaps-count", 440, 220, (56, 8, 10, 52)) as c:
            bars = c.ax.bar(...)
            c.tips(bars, ["1 µs-10 µs: 12 gaps", ...])
            svg = c.svg("idle gaps by length: count")

    Args:
        key: a name unique among the charts of one page (letters, digits, ``-``); it salts
            matplotlib's ids, so two charts never share one.
        width, height: size in viewBox units (CSS pixels at the chart's own width).
        margins: (left, right, top, bottom) of the axes inside the figure, same units.
    """

    def __init__(self, key: str, width: float, height: float, margins: tuple[float, float, float, float]):
        if not re.fullmatch(r"[A-Za-z][\w-]*", key):
            raise ValueError(f"chart key {key!r}: letters, digits, '-' or '_', starting with a letter")
        self.key, self.width, self.height, self.margins = key, float(width), float(height), margins
        self._tips: dict[str, tuple[str, list[str], bool]] = {}
        self._stack = ExitStack()

    def __enter__(self) -> Chart:
        import matplotlib

        with ExitStack() as stack:  # released again if anything below fails
            stack.enter_context(_DRAWING)
            stack.enter_context(matplotlib.rc_context())
            matplotlib.rcdefaults()  # the user's matplotlibrc (usetex, tight bbox, grids) is not the report's
            matplotlib.rcParams.update({**RC, "svg.hashsalt": self.key})
            # Off the user's terminal: missing glyphs (the browser draws the text, in its own fonts) and
            # the tick arithmetic of absurd values (or_note says when a chart could not be drawn).
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("ignore")
            self.fig = _figure_class()(figsize=(self.width / UNITS_PER_INCH, self.height / UNITS_PER_INCH))
            left, right, top, bottom = self.margins
            self.ax = self.fig.add_axes((left / self.width, bottom / self.height,
                                         1 - (left + right) / self.width, 1 - (top + bottom) / self.height))
            self.fig.patch.set_visible(False)  # transparent anyway: two paths fewer per chart
            self.ax.patch.set_visible(False)
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def _gid(self, artist, cls: str, texts: list[str], each: bool):
        gid = f"{self.key}-tip{len(self._tips)}"
        artist.set_gid(gid)
        self._tips[gid] = (cls, [clean(t) for t in texts], each)
        return artist

    def tip(self, artist, text: str, cls: str = "tip"):
        """Give ``artist`` (a patch, line, collection) one tooltip; returns the artist."""
        return self._gid(artist, cls, [text], False)

    def tips(self, artists, texts: list[str], cls: str = "tip"):
        """One tooltip per mark, in order: the elements of a collection, the markers of a line, or
        each artist of a list (a bar container). A mark without a text keeps none."""
        if isinstance(artists, (list, tuple)) or hasattr(artists, "patches"):
            for artist, t in zip(getattr(artists, "patches", artists), texts):
                self._gid(artist, cls, [t], False)
            return artists
        return self._gid(artists, cls, list(texts), True)

    def svg(self, label: str) -> str:
        """The chart as an inline ``<svg>`` element (str) with ``role="img"`` and ``label`` as its
        accessible name."""
        buf = io.StringIO()
        self.fig.savefig(buf, format="svg", bbox_inches=None, metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
        return inline(buf.getvalue(), label, self.width, self.height, self._tips)


def inline(raw: str, label: str, width: float, height: float, tips: dict[str, tuple[str, list[str], bool]]) -> str:
    """matplotlib's SVG file ``raw`` as an element for the page (see the module's docstring).

    ``tips`` maps a group id to (class, texts, each): with ``each`` false the group gets the one
    text as its title; with ``each`` true every path or marker in the group gets its own, in order.
    """
    out = _EMPTY_DEFS.sub("", _STYLE.sub("", _METADATA.sub("", _PROLOGUE.sub("", raw, count=1))))
    out = _TAG.sub(_tag, out)
    root = (f'<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" '
            f'viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" role="img" aria-label="{esc(label)}">')
    out = _ROOT.sub(lambda _m: root, out, count=1)  # a function: a backslash in the label is not an escape
    pieces, pos = [], 0
    for m in _GROUP_ID.finditer(out):
        if m.start() < pos:
            continue  # inside a group already rewritten with its marks
        pieces.append(out[pos:m.start()])
        pos = m.end()
        cls, texts, each = tips.get(m.group(1), ("", [], False))
        if not texts:
            pieces.append("<g")  # matplotlib's own ids (figure_1, axes_1, ...) would repeat between charts
        elif not each:
            pieces.append(f'<g class="{esc(cls)}"><title>{esc(texts[0])}</title')  # the rest of the tag follows
        else:
            end = _group_end(out, m.start())
            marks = iter(texts)
            found = [mk for mk in _MARK.finditer(out[pos:end]) if ' id="' not in mk.group(0)]
            if len(found) != len(texts):
                # matplotlib split or dropped a mark (a marker far outside the plot is clipped into
                # two): titles by position would name the wrong marks, so none is given
                marks = iter(())

            def titled(mark: re.Match) -> str:
                if ' id="' in mark.group(0):
                    return mark.group(0)  # a marker's shape in <defs>, drawn by the <use>s after it
                t = next(marks, None)
                return mark.group(0) if t is None else f'<g class="{esc(cls)}"><title>{esc(t)}</title>{mark.group(0)}</g>'

            pieces.append("<g" + _MARK.sub(titled, _GROUP_ID.sub("<g", out[pos:end])))
            pos = end
    pieces.append(out[pos:])
    # whitespace between tags is matplotlib's indentation (text content never is only whitespace)
    return _EMPTY_GROUP.sub("", _BETWEEN_TAGS.sub("><", "".join(pieces).strip()))


def _group_end(text: str, start: int) -> int:
    """Index just before the ``</g>`` that closes the group opened at ``start``."""
    depth = 0
    for m in _GROUP_TAG.finditer(text, start):
        depth += 1 if m.group(0) == "<g" else -1
        if depth == 0:
            return m.start()
    raise ValueError("unbalanced SVG groups from matplotlib")


def or_note(draw):
    """Decorate a function returning a chart's SVG: when matplotlib cannot draw its values (a
    hand-edited summary's 1e308 ms overflows the axis: ValueError, OverflowError), the page gets a
    visible note in its place, and the rest of the report still renders."""

    @functools.wraps(draw)
    def drawn(*args, **kwargs) -> str:
        try:
            return draw(*args, **kwargs)
        except (ValueError, OverflowError, FloatingPointError) as e:
            return f'<p class="warn">Chart not drawn: matplotlib could not draw these values ({esc(e)}).</p>'

    return drawn


# Charts kept per drawing function: a page has a dozen charts at most, and the tuning report is
# re-rendered at each checkpoint of a study with most of them unchanged. The byte budget bounds a
# long-lived process (a notebook) drawing large charts: one of 1,500 trials is about 0.8 MB.
CACHED_CHARTS = 64
CACHED_BYTES = 8 << 20
_CACHES: list[tuple[threading.Lock, OrderedDict]] = []


def clear_cache() -> None:
    """Forget every chart kept by :func:`cached` (a test that checks drawing itself needs this)."""
    for lock, kept in _CACHES:
        with lock:
            kept.clear()


def cached(draw):
    """Decorate a pure function returning a chart's SVG (str): a call with the same arguments as one
    of the last :data:`CACHED_CHARTS` (at most :data:`CACHED_BYTES` of SVG) returns that call's SVG
    instead of drawing it again. A chart's SVG depends only on its arguments (matplotlib's settings
    are :data:`RC`, its ids salted by the chart's key), and drawing one costs tens of milliseconds,
    looking it up microseconds. Arguments are compared by a digest of their pickled bytes (equal
    bytes, equal values); ones that cannot be pickled are drawn every time. A drawing that raises
    is not kept (put :func:`or_note` outside this decorator)."""
    kept: OrderedDict[bytes, str] = OrderedDict()
    lock = threading.Lock()
    _CACHES.append((lock, kept))

    @functools.wraps(draw)
    def drawn(*args, **kwargs) -> str:
        try:
            key = hashlib.blake2b(pickle.dumps((args, sorted(kwargs.items())), protocol=pickle.HIGHEST_PROTOCOL),
                                  digest_size=20).digest()
        except Exception:  # noqa: BLE001 - whatever pickling raises (a ctypes pointer: ValueError): no key
            return draw(*args, **kwargs)
        with lock:
            svg = kept.get(key)
            if svg is not None:
                kept.move_to_end(key)
                return svg
        svg = draw(*args, **kwargs)
        with lock:
            kept[key] = svg
            size = sum(map(len, kept.values()))
            while len(kept) > CACHED_CHARTS or (size > CACHED_BYTES and len(kept) > 1):
                size -= len(kept.popitem(last=False)[1])
        return svg

    return drawn


# Tick steps: 1, 2, 2.5 or 5 times a power of ten (axes read 0, 20, 40, not 0, 15, 30)
NICE_STEPS = (1, 2, 2.5, 5, 10)


def integer_label(v: float, _pos=None) -> str:
    """A tick label: ``1,000`` for round values, ``2.5`` otherwise (no scientific notation, no mathtext)."""
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,g}"
