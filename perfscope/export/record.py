"""What an experiment tracker is given of a perfscope output folder: one typed record.

A profile or analysis folder (``summary.json``, ``report.html``, ``traces/rank*.run.jsonl``)
gives one run; a tune folder (``tune.json``) gives a parent run and one child run per trial.
Units: milliseconds for step times (``*_ms``), shares in [0, 1], USD for costs, joules for energy.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from typing import TYPE_CHECKING

from perfscope.errors import PerfscopeError
from perfscope.version import __version__

if TYPE_CHECKING:
    from perfscope.record.schema import Run
    from perfscope.record.tune_schema import Baseline, Recommendation, Trial, TuneRecord
    from perfscope.record.view import Record

# Whole-run steps kept as step metrics: every k-th step beyond this many (a long run's curve,
# not 200,000 points a tracker draws slowly).
MAX_RUN_POINTS = 10_000


class StepMetrics(msgspec.Struct, kw_only=True):
    """The metrics of one step (``step``: the training step's number, from 1)."""

    step: int
    values: dict[str, float]


class RunExport(msgspec.Struct, kw_only=True):
    """One run as a tracker logs it.

    Attributes:
        name: The run's name (the script's stem, ``trial 3``...).
        params: Parameters (text): what the run was asked.
        tags: Tags (text): what it concluded (verdict, provisional) and who wrote it.
        steps: Step-indexed metrics, in step order.
        summary: One value each: the run's figures (median step, MFU, memory peak, cost ...).
        artifacts: Files to attach (absolute paths that exist).
        children: Runs under this one (a tune's trials).
    """

    name: str
    params: dict[str, str] = {}
    tags: dict[str, str] = {}
    steps: list[StepMetrics] = []
    summary: dict[str, float] = {}
    artifacts: list[str] = []
    children: list[RunExport] = []


def _text(value) -> str:
    return value if isinstance(value, str) else msgspec.json.encode(value).decode()


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value else None


def _put(summary: dict, key: str, value, scale: float = 1.0) -> None:
    v = _number(value)
    if v is not None:
        summary[key] = v * scale


def _files(folder: Path, *names: str) -> list[str]:
    return [str((folder / n).resolve()) for n in names if (folder / n).is_file()]


def _profile_steps(rows: list[dict]) -> list[StepMetrics]:
    """Per step number: the slowest rank's step time and the ranks' mean shares, as measured
    (``rows``: the record's step rows)."""
    by_step: dict[int, list[dict]] = {}
    for row in rows:
        if isinstance(row.get("step"), int) and _number(row.get("step_time_us")) is not None:
            by_step.setdefault(row["step"], []).append(row)
    out = []
    for step, rows in sorted(by_step.items()):
        values = {"step_time_ms": max(r["step_time_us"] for r in rows) / 1000.0}
        for c in ("io", "comm", "launch", "compute", "other"):
            shares = [r[f"{c}_cost_frac"] for r in rows if _number(r.get(f"{c}_cost_frac")) is not None]
            if shares:
                values[f"share/{c}"] = sum(shares) / len(shares)
        out.append(StepMetrics(step=step, values=values))
    return out


def _run_steps(folder: Path) -> list[StepMetrics]:
    """Rank 0's whole-run record, thinned to :data:`MAX_RUN_POINTS` steps: each step's seconds and phases."""
    from perfscope.record.run_steps import read_run_steps

    trace = folder / "traces" / "rank0.pt.trace.json.gz"
    steps = read_run_steps(trace).steps or []
    every = max(1, -(-len(steps) // MAX_RUN_POINTS))
    return [StepMetrics(step=s.step, values={"run/step_s": s.seconds, "run/input_s": s.input,
                                             "run/forward_s": s.forward, "run/backward_s": s.backward,
                                             "run/optimizer_s": s.optimizer, "run/other_s": s.other})
            for s in steps[::every]]


def _merge(*series: list[StepMetrics]) -> list[StepMetrics]:
    merged: dict[int, dict[str, float]] = {}
    for part in series:
        for m in part:
            merged.setdefault(m.step, {}).update(m.values)
    return [StepMetrics(step=s, values=v) for s, v in sorted(merged.items())]


def profile_export(folder: Path, summary: dict | Record) -> RunExport:
    """The run of a ``perfscope profile`` or ``analyze`` output folder (``summary``: its record)."""
    from perfscope.record.schema import Run  # the record's schema: not for the command line's --help
    from perfscope.record.view import record_of

    record = record_of(summary)
    run, overall = record.run or Run(), record.overall_or_empty()
    tags = {"perfscope.verdict": overall.verdict or "none",
            "perfscope.provisional": "true" if overall.provisional else "false",
            "perfscope.version": record.perfscope_version or __version__,
            "perfscope.command": "profile" if run.script else "analyze"}
    if overall.runner_up:
        tags["perfscope.runner_up"] = overall.runner_up
    name = Path(run.script or run.source or folder.name).stem.split(".")[0] or folder.name
    return RunExport(name=name, params=_run_params(run, record.mode), tags=tags,
                     steps=_merge(_profile_steps(record.steps or []), _run_steps(folder)),
                     summary=_run_figures(record), artifacts=_files(folder, "report.html", "summary.json"))


def _run_params(run: Run, mode: str | None) -> dict[str, str]:
    """What the run was asked: the script or the traces, ranks, devices, price, configuration."""
    params = {k: _text(getattr(run, k)) for k in ("script", "source", "world_size", "nproc_per_node", "price_per_hour")
              if getattr(run, k) is not None}
    if run.args:
        params["args"] = " ".join(run.args)
    if run.devices:
        params["devices"] = ", ".join(run.devices)
    params["mode"] = _text(mode or "")
    for key, value in (run.config or {}).items():
        params[f"config.{key}"] = _text(value)
    return params


def _run_figures(record: Record) -> dict[str, float]:
    """The run's figures: step times, shares, MFU, memory peak, cost and energy where recorded."""
    overall, details = record.overall_or_empty(), record.details_or_empty()
    fractions = msgspec.structs.asdict(overall.fractions) if overall.fractions is not None else {}
    cost, mfu, memory, energy = details.cost, details.mfu, details.memory, details.energy
    scalars: dict[str, float] = {}
    for key, value, scale in (("median_step_ms", overall.median_step_time_us, 1e-3),
                              ("step_time_ms", overall.step_time_us, 1e-3),
                              ("steps_counted", overall.steps_counted, 1.0),
                              *((f"share/{c}", v, 1.0) for c, v in fractions.items()),
                              ("mfu", mfu.mfu if mfu else None, 1.0),
                              ("memory_peak_bytes", memory.peak_bytes if memory else None, 1.0),
                              ("cost_per_step_usd", cost.per_step if cost else None, 1.0),
                              ("cost_per_1000_samples_usd", cost.per_1000_samples if cost else None, 1.0),
                              ("cost_per_run_usd", cost.per_run if cost else None, 1.0),
                              ("energy_per_step_j", energy.per_step_j if energy else None, 1.0)):
        _put(scalars, key, value, scale)
    return scalars


def tune_export(folder: Path, data: dict | TuneRecord) -> RunExport:
    """The parent run of a ``perfscope tune`` output folder, and one child run per trial (``data``:
    its ``tune.json``, read leniently as the tuning report reads it)."""
    from perfscope.record.lenient import lenient
    from perfscope.record.tune_schema import Baseline, Objective, Recommendation, Study, TuneCost, TuneRecord

    record = data if isinstance(data, TuneRecord) else lenient(data, TuneRecord)
    objective, study = record.objective or Objective(), record.study or Study()
    params = {"script": _text(record.script or ""), "args": " ".join(record.args or []),
              "objective": _text(objective.name or "time"), "unit": _text(objective.unit or ""),
              "trials_target": _text(study.trials_target)}
    if record.nproc_per_node:
        params["nproc_per_node"] = _text(record.nproc_per_node)
    rec, baseline, cost = record.recommendation or Recommendation(), record.baseline or Baseline(), record.cost or TuneCost()
    scalars: dict[str, float] = {}
    for key, value in (("baseline_value", baseline.value), ("speedup", rec.speedup), ("ci_low", rec.ci_low),
                       ("ci_high", rec.ci_high), ("cost_per_1000_baseline_usd", cost.baseline),
                       ("cost_per_1000_best_usd", cost.best)):
        _put(scalars, key, value)
    name = f"tune-{Path(record.script or folder.name).stem}"
    return RunExport(name=name, params=params, tags=_tune_tags(record, rec, baseline), summary=scalars,
                     artifacts=_files(folder, "tune.json", "report.html", "best.yaml"),
                     children=[_trial_export(t) for t in record.trials or []])


def _tune_tags(record: TuneRecord, rec: Recommendation, baseline: Baseline) -> dict[str, str]:
    """What the tune concluded: the recommendation, what decided it, the baseline's verdict."""
    return {"perfscope.recommendation": rec.status or "none", "perfscope.decided_by": record.decided_by or "none",
            "perfscope.verdict": baseline.verdict or "none",
            "perfscope.version": record.perfscope_version or __version__, "perfscope.command": "tune"}


def _trial_export(t: Trial) -> RunExport:
    """A tune's trial as a child run: its configuration, state and verdict, value per step."""
    params = {f"config.{k}": _text(v) for k, v in (t.config or {}).items()}
    params["role"] = _text(t.role or "")
    tags = {"perfscope.state": t.state or "unknown", "perfscope.verdict": t.verdict or "none"}
    if t.failure is not None and t.failure.kind:
        tags["perfscope.failure"] = t.failure.kind
    scalars: dict[str, float] = {}
    _put(scalars, "value", t.value)
    _put(scalars, "duration_s", t.duration_s)
    steps = [StepMetrics(step=i + 1, values={"value": float(v)})
             for i, v in enumerate(t.step_values or []) if _number(v) is not None]
    return RunExport(name=f"trial {t.number}", params=params, tags=tags, steps=steps, summary=scalars)


def _tune_record(path: Path) -> dict:
    """``tune.json`` as data, read with a bound.

    Raises:
        PerfscopeError: unreadable, not JSON, or not a tuning record.
    """
    import orjson

    from perfscope.atomic import RecordFileError, read_bounded
    from perfscope.record.tune_schema import SCHEMA

    try:
        data = orjson.loads(read_bounded(path))
    except (OSError, RecordFileError, orjson.JSONDecodeError) as e:
        raise PerfscopeError(f"{path}: cannot be read as a tuning record ({e})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise PerfscopeError(f"{path}: not a perfscope tuning record (schema {SCHEMA!r})")
    return data


def read_export(folder: Path) -> RunExport:
    """The run of an output folder: a tune's (``tune.json``) or a profile's (``summary.json``).

    Raises:
        PerfscopeError: no such folder, or neither record in it (or one that cannot be read).
    """
    folder = Path(folder)
    if folder.is_file() and folder.name in ("summary.json", "tune.json"):
        folder = folder.parent
    if not folder.is_dir():
        raise PerfscopeError(f"{folder}: not a folder (give the --out folder of perfscope profile, analyze or tune)")
    if (folder / "tune.json").is_file():
        return tune_export(folder, _tune_record(folder / "tune.json"))
    if (folder / "summary.json").is_file():
        from perfscope.record import load_summary

        return profile_export(folder, load_summary(folder / "summary.json"))
    raise PerfscopeError(f"{folder}: holds neither summary.json nor tune.json (not a perfscope output folder)")
