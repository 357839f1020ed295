"""The analysis of a run (:class:`Analysis`) and its summary record (``summary.json``), built from its frames.

The record's schema, its reading and writing are :mod:`perfscope.record`; ``docs/summary.md`` is
generated from the schema.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass, field

import msgspec
import pandas as pd

from perfscope import steptime
from perfscope.analysis.cost import cost_view, energy_view
from perfscope.analysis.verdict import RunVerdict
from perfscope.record.schema import SCHEMA, SCHEMA_VERSION, Cost, Details, QualityEntry, Skipped, TraceEntry


@dataclass(kw_only=True)
class Analysis:
    """The analysis of a run.

    Attributes:
        steps: One row per (rank, step): ``rank``, ``worker``, ``step``, ``status``,
            ``status_reason``, ``counted``, ``complete``, ``mode``, metrics in microseconds
            (``*_us``) and as fractions of step time (``*_frac``), the class costs
            (``io_cost_frac`` ...), ``verdict`` and ``runner_up`` (None for steps not counted).
        verdict: The run's verdict over the counted steps of all ranks (its ``verdict`` is None
            when no step has the evidence for one; ``reason`` says why).
        mode: ``"gpu"`` or ``"cpu"``.
        traces: Per-file facts (path, worker, rank, mode, events, markers, devices, warnings,
            data quality), as the record's ``traces[]`` entries.
        notes: Statements about how the traces were read (no step markers, steps not counted).
        warnings: Problems that did not stop the analysis (repairs, dropped events...).
        run_info: Metadata of the profiled run when perfscope recorded it, else ``{}``.
        details: Run-level detail for the report (:func:`perfscope.analysis.details.build_details`),
            as the record's struct; its ``cost`` and ``energy`` come with the summary.
        skipped: Files of a directory that could not be read: ``path``, ``reason`` and ``damaged``
            (a trace that holds damage, as opposed to a file that is no trace).
        tables: The trace tables analyzed, by resolved file path, so the report's timeline
            need not parse the traces a second time.
        timelines: By the same paths, each trace's step windows and (GPU traces) partition
            interval sets, ``(StepWindows, list | None)``, so the report need not find them again.
    """

    steps: pd.DataFrame
    verdict: RunVerdict
    mode: str
    traces: list[TraceEntry]
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    run_info: dict = field(default_factory=dict)
    details: Details = field(default_factory=Details)
    skipped: list[Skipped] = field(default_factory=list)
    tables: dict = field(default_factory=dict, repr=False)
    timelines: dict = field(default_factory=dict, repr=False)

    @property
    def ranks_analyzed(self) -> int:
        """Number of distinct ranks in the analysis."""
        return int(self.steps["rank"].nunique())

    @property
    def world_size(self) -> int:
        """The job's world size as the traces record it (``distributedInfo``), else the ranks analyzed."""
        recorded = [t.world_size for t in self.traces if isinstance(t.world_size, int)]
        return max(recorded) if recorded else self.ranks_analyzed

    def summary(self) -> dict:
        """The versioned ``summary.json`` record (see ``docs/summary.md``)."""
        return build_summary(self)


def _clean(value):
    """JSON-safe scalars: NaN (a metric that does not apply to a step's mode) becomes null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):  # numpy scalar
        return _clean(value.item())
    return value


def _clean_tree(value):
    """JSON-safe data of a part of the record: its structs as objects of every field, in order (a
    sparse struct's, ``omit_defaults``, without the fields it lacks), as msgspec encodes them."""
    if isinstance(value, msgspec.Struct):
        sparse = value.__struct_config__.omit_defaults
        items = ((f.encode_name, getattr(value, f.name)) for f in msgspec.structs.fields(value))
        return {name: _clean_tree(v) for name, v in items if not (sparse and v is None)}
    if isinstance(value, dict):
        return {k: _clean_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean_tree(v) for v in value]
    return _clean(value)


def build_summary(analysis: Analysis) -> dict:
    """The summary record of an :class:`Analysis` (a JSON-able dict)."""
    from perfscope.version import __version__

    v = analysis.verdict
    frame = analysis.steps
    counted = frame.loc[frame["counted"], "step_time_us"]
    steps = [
        {k: _clean(val) for k, val in row.items()}
        for row in analysis.steps.to_dict(orient="records")
    ]
    # the counted steps, or those a provisional verdict classified (without their waits for a core)
    counted_rows = steptime.verdict_rows(steps, v.provisional)
    representative = steptime.representative_step(counted_rows)
    devices = sorted({d for t in analysis.traces for d in t.devices if d})
    run = dict(analysis.run_info)
    run.setdefault("world_size", analysis.world_size)
    run["ranks_analyzed"] = analysis.ranks_analyzed
    run.setdefault("devices", devices)
    step_time = steptime.step_time_us(counted_rows)
    d = analysis.details
    # the verdict's steps; where none has a reading (no verdict, a busy machine's withheld steps), every step's
    read = [r for r in counted_rows if r.get("host_energy_j") is not None] or steps
    details = _clean_tree(msgspec.structs.replace(
        d, cost=_cost(analysis, run, step_time, d),
        energy=energy_view(read, analysis.traces, int(run["world_size"]), _batch_size(d))))
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
            "provisional": v.provisional,
            "core_wait_share": v.core_wait_share,
            "runner_up": v.runner_up,
            "reason": v.reason,
            "other_largest": v.other_largest,
            "fractions": v.fractions,
            "step_share": v.step_share,
            "advice": v.advice,
            "steps_counted": int(counted.size),
            "steps_total": int(len(frame)),
            "steps_by_status": {str(k): int(n) for k, n in frame["status"].value_counts().items()},
            "median_step_time_us": float(counted.median()) if counted.size else None,
            "mean_step_time_us": float(counted.mean()) if counted.size else None,
            "step_time_us": step_time,
            "representative_step": _clean(representative),
        },
        "details": details,
        "data_quality": _clean_tree(merged_quality(analysis.traces)),
        "traces": _clean_tree(analysis.traces),
        "skipped": _clean_tree(analysis.skipped),
        "notes": analysis.notes,
        "warnings": analysis.warnings,
        "steps": steps,
    }


def _cost(analysis, run: dict, step_time: float | None, details: Details) -> Cost | None:
    """``details.cost`` (:func:`perfscope.analysis.cost.cost_view`) at the run's price, if given."""
    price = run.get("price_per_hour")
    if price is None:
        return None
    job = details.facts.job
    runs = [r.total_s for r in details.run_steps or [] if r.total_s]
    return cost_view(price_per_hour=float(price), step_time_us=step_time, shares=analysis.verdict.fractions,
                     mode=analysis.mode, world_size=int(run["world_size"]), nnodes=int(job.nnodes or 1) if job else 1,
                     batch_size=_batch_size(details), run_seconds=max(runs) if runs else None)


def _batch_size(details: Details) -> int | None:
    """Samples a rank's step takes: the first DataLoader's batch size ``perfscope profile`` recorded."""
    batch = details.facts.loader.batch_size if details.facts.loader else None
    return batch if isinstance(batch, int) and batch > 0 else None


def merged_quality(traces: list[TraceEntry]) -> list[QualityEntry]:
    """The data-quality entries of every trace, summed by (action, reason, unit); examples merged."""
    merged: dict[tuple, QualityEntry] = {}
    for t in traces:
        for e in t.data_quality or []:
            key = (e.action, e.reason, e.unit or "event")
            m = merged.setdefault(key, QualityEntry(action=key[0], reason=key[1], unit=key[2], count=0, traces=0,
                                                    examples={}))
            m.count += int(e.count)
            m.traces += 1
            for name, n in (e.examples or {}).items():
                m.examples[name] = m.examples.get(name, 0) + int(n)
    for m in merged.values():
        m.examples = dict(sorted(m.examples.items(), key=lambda kv: -kv[1])[:5])
    return list(merged.values())
