"""Writing an analysis to its output directory: ``summary.json`` and ``report.html``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from perfscope.errors import PerfscopeError
from perfscope.siblings import import_sibling
from perfscope.summary import write_summary


def ensure_writable_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` if needed and check that files can be written in it.

    Raises:
        PerfscopeError: it cannot be created or written (one line saying which and why).
    """
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise PerfscopeError(f"cannot write to output directory {path}: {e.strerror or e}") from None
    return path


def write_outputs(summary: dict, out_dir: str | os.PathLike, tables: dict | None = None) -> dict[str, Path]:
    """Write ``summary.json`` and ``report.html`` of a summary record into ``out_dir`` (each
    atomically; the report's timeline uses ``tables`` -- the analysis's trace tables by path --
    and reads any other trace it needs from disk).

    Returns:
        The written paths by name (``"summary"``, ``"report"``).
    """
    write_report = import_sibling("reports").write_report
    out = ensure_writable_dir(out_dir)
    return {
        "summary": write_summary(summary, out / "summary.json"),
        "report": write_report(summary, out / "report.html", tables=tables),
    }
