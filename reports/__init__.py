"""HTML rendering of perfscope analyses: one self-contained file per report.

Reports render from a ``summary.json`` record alone, so a saved analysis re-renders without its
traces. Every string that came from a trace, a file name or an argument is escaped.
"""

from reports.bottleneck import render_report, write_report

__all__ = ["render_report", "write_report"]
