"""Benchmark: the timeline's lanes drawn as hand-written SVG (reports/svg.py, as the report does)
against the same rectangles drawn by matplotlib's SVG backend (the report's chart technology).

The timeline draws thousands of merged events, each a rectangle with its own hover title; this
measures what drawing them through matplotlib would cost: the page bytes and the time to draw,
interleaved (hand, matplotlib, hand, ...) so the machine's load drifts across both alike. The
matplotlib drawing is the lighter one (a single PolyCollection, and no per-event title, which
matplotlib's SVG backend does not write).

    python bench/bench_timeline_svg.py [--rects 5000] [--runs 7]
"""

from __future__ import annotations

import argparse
import io
import random
import statistics
import time

from perfscope.reports.svg import open_svg, rect


def _events(n: int) -> list[tuple[float, int, float]]:
    rng = random.Random(0)
    return [(rng.random() * 1000.0, rng.randrange(8), rng.random() * 2.0 + 0.1) for _ in range(n)]


def hand(events) -> str:
    parts = [open_svg(1000, 80, "timeline lanes")]
    parts += [rect(x, lane * 10, w, 8, "#4c78a8", f"kernel {i}") for i, (x, lane, w) in enumerate(events)]
    return "".join(parts) + "</svg>"


def with_matplotlib(events) -> str:
    import matplotlib

    matplotlib.use("svg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    fig, ax = plt.subplots(figsize=(10, 0.8))
    ax.add_collection(PolyCollection([[(x, y * 10), (x + w, y * 10), (x + w, y * 10 + 8), (x, y * 10 + 8)]
                                      for x, y, w in events], facecolors="#4c78a8"))
    ax.set_xlim(0, 1000)
    ax.set_ylim(0, 80)
    out = io.StringIO()
    fig.savefig(out, format="svg")
    plt.close(fig)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rects", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    events = _events(args.rects)
    with_matplotlib(events[:10])  # matplotlib's import and font cache, outside the timings
    times: dict[str, list[float]] = {"hand": [], "matplotlib": []}
    sizes = {}
    for _ in range(args.runs):
        for name, draw in (("hand", hand), ("matplotlib", with_matplotlib)):
            start = time.perf_counter()
            page = draw(events)
            times[name].append(time.perf_counter() - start)
            sizes[name] = len(page.encode())
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.rects} rectangles, {args.runs} interleaved runs")
    for name in times:
        print(f"  {name:10s} median {med[name] * 1e3:7.1f} ms (min {min(times[name]) * 1e3:.1f}, "
              f"max {max(times[name]) * 1e3:.1f}); {sizes[name] / 1e3:.0f} kB")
    print(f"  matplotlib / hand: time {med['matplotlib'] / med['hand']:.0f}x, bytes {sizes['matplotlib'] / sizes['hand']:.2f}x")


if __name__ == "__main__":
    main()
