"""HTML rendering of perfscope analyses: one self-contained file per report.

Reports render from a ``summary.json`` record (plus, for the timeline, the traces when they can be
found), so a saved analysis re-renders at any time. Every string that came from a trace, a file
name or an argument is escaped; the page runs no script and loads nothing from outside.
"""

__all__ = ["render_diff", "render_report", "render_tuning", "text_diff", "write_diff", "write_report", "write_tuning"]

# Each report's module loads on first use: an analysis renders one report and pays for that one.
_HOME = {"render_report": "perfscope.reports.bottleneck", "write_report": "perfscope.reports.bottleneck",
         "render_diff": "perfscope.reports.diff", "text_diff": "perfscope.reports.diff", "write_diff": "perfscope.reports.diff",
         "render_tuning": "perfscope.reports.tuning", "write_tuning": "perfscope.reports.tuning"}


def __getattr__(name: str):
    if name in _HOME:
        import importlib

        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'perfscope.reports' has no attribute {name!r}")
