"""``summary.json``: the versioned record of an analysis, for programs and for re-rendering.

The schema is documented in ``docs/summary.md``. A reader checks ``schema`` and
``schema_version``; fields are only ever added within a major version.
"""

from __future__ import annotations

import datetime as _dt
import math
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from perfscope.atomic import write_bytes_atomic
from perfscope.errors import PerfscopeError

if TYPE_CHECKING:
    from perfscope.analysis.run import Analysis

SCHEMA = "perfscope.summary"
SCHEMA_VERSION = 1


def _clean(value):
    """JSON-safe scalars: NaN (a metric that does not apply to a step's mode) becomes null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):  # numpy scalar
        return _clean(value.item())
    return value


def _clean_tree(value):
    if isinstance(value, dict):
        return {k: _clean_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean_tree(v) for v in value]
    return _clean(value)


def build_summary(analysis: Analysis) -> dict:
    """The summary record of an :class:`~perfscope.analysis.run.Analysis` (a JSON-able dict)."""
    from perfscope import __version__

    v = analysis.verdict
    frame = analysis.steps
    counted = frame.loc[frame["complete"], "step_time_us"] if frame["complete"].any() else frame["step_time_us"]
    steps = [
        {k: _clean(val) for k, val in row.items()}
        for row in analysis.steps.to_dict(orient="records")
    ]
    devices = sorted({d for t in analysis.traces for d in t["devices"] if d})
    run = dict(analysis.run_info)
    run.setdefault("world_size", analysis.world_size)
    run["ranks_analyzed"] = analysis.ranks_analyzed
    run.setdefault("devices", devices)
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "perfscope_version": __version__,
        "generated_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "mode": analysis.mode,
        "run": run,
        "units": {"*_us": "microseconds", "*_frac": "fraction of the step's step_time_us", "*_s": "seconds"},
        "overall": {
            "verdict": v.verdict,
            "runner_up": v.runner_up,
            "fractions": v.fractions,
            "step_share": v.step_share,
            "advice": v.advice,
            "steps_counted": int(counted.size),
            "median_step_time_us": float(counted.median()),
            "mean_step_time_us": float(counted.mean()),
        },
        "details": _clean_tree(analysis.details),
        "traces": analysis.traces,
        "notes": analysis.notes,
        "warnings": analysis.warnings,
        "steps": steps,
    }


def write_summary(summary: dict, path: str | Path) -> Path:
    """Write ``summary`` as indented JSON, atomically."""
    return write_bytes_atomic(path, orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))


def load_summary(path: str | Path) -> dict:
    """Read a ``summary.json`` (or the one inside an output directory).

    Raises:
        PerfscopeError: missing, not JSON, or not a perfscope summary of a known major version.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "summary.json"
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise PerfscopeError(f"{path}: no such summary file") from None
    except orjson.JSONDecodeError as e:
        raise PerfscopeError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise PerfscopeError(f"{path}: not a perfscope summary (schema field missing)")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise PerfscopeError(f"{path}: summary schema version {data.get('schema_version')} is not supported (expected {SCHEMA_VERSION})")
    return data
