"""The bottleneck report page (``report.html``), rendered from a summary record with Jinja2.

Jinja2's autoescaping escapes every value placed in the page; the page loads nothing from outside
(a Content-Security-Policy forbids it), so a hostile kernel or file name can neither break out of
the markup nor make the page call home.
"""

from __future__ import annotations

from pathlib import Path

import jinja2

from perfscope.atomic import write_text_atomic

# What the report shows per step, in order: (column, heading). Times in milliseconds on the page.
# The columns of each mode are its partition of the step (docs/metrics.md): they add up to 100%.
_GPU_COLUMNS = (
    ("compute_frac", "compute"),
    ("exposed_comm_frac", "exposed comm"),
    ("exposed_h2d_frac", "exposed H2D"),
    ("exposed_other_mem_frac", "other copies"),
    ("input_wait_frac", "input wait"),
    ("h2d_wait_frac", "H2D wait"),
    ("launch_wait_frac", "launch wait"),
    ("kernel_wait_frac", "kernel wait"),
    ("other_idle_frac", "other idle"),
)
_CPU_COLUMNS = (
    ("operator_frac", "operators"),
    ("exposed_comm_frac", "exposed comm"),
    ("dataloader_frac", "DataLoader"),
    ("framework_overhead_frac", "framework overhead"),
)

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("reports", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def _pct(value) -> str:
    return "-" if value is None else f"{100.0 * value:.1f}%"


def _ms(value_us) -> str:
    return "-" if value_us is None else f"{value_us / 1000.0:.2f}"


_ENV.filters["pct"] = _pct
_ENV.filters["ms"] = _ms


def _counted(names) -> str:
    """``["A100", "A100", "V100"]`` -> ``"2 x A100, V100"``."""
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return ", ".join(f"{c} x {n}" if c > 1 else n for n, c in counts.items())


_ENV.filters["counted"] = _counted


def render_report(summary: dict) -> str:
    """The report page for a summary record (as from :func:`perfscope.summary.build_summary`).

    Returns:
        One self-contained HTML document (str).
    """
    columns = _GPU_COLUMNS if summary.get("mode") == "gpu" else _CPU_COLUMNS
    return _ENV.get_template("bottleneck.html").render(s=summary, columns=columns)


def write_report(summary: dict, path: str | Path) -> Path:
    """Render the report and write it to ``path`` atomically."""
    return write_text_atomic(path, render_report(summary))
