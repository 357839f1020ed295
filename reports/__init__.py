"""HTML rendering of perfscope analyses: one self-contained file per report.

Reports render from a ``summary.json`` record (plus, for the timeline, the traces when they can be
found), so a saved analysis re-renders at any time. Every string that came from a trace, a file
name or an argument is escaped; the page runs no script and loads nothing from outside.
"""

from reports.bottleneck import render_report, write_report
from reports.diff import render_diff, text_diff, write_diff
from reports.tuning import render_tuning, write_tuning

__all__ = ["render_diff", "render_report", "render_tuning", "text_diff", "write_diff", "write_report", "write_tuning"]
