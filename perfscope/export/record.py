"""What an experiment tracker is given of a perfscope output folder: one typed record.

A profile or analysis folder (``summary.json``, ``report.html``, ``traces/rank*.run.jsonl``)
gives one run; a tune folder (``tune.json``) gives a parent run and one child run per trial.
Units: milliseconds for step times (``*_ms``), shares in [0, 1], USD for costs, joules for energy.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from perfscope.errors import PerfscopeError
from perfscope.version import __version__

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


def _profile_steps(summary: dict) -> list[StepMetrics]:
    """Per step number: the slowest rank's step time and the ranks' mean shares, as measured."""
    by_step: dict[int, list[dict]] = {}
    for row in summary.get("steps") or []:
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
    from perfscope.run_steps import read_run_steps

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


def profile_export(folder: Path, summary: dict) -> RunExport:
    """The run of a ``perfscope profile`` or ``analyze`` output folder."""
    run, overall, details = summary.get("run") or {}, summary.get("overall") or {}, summary.get("details") or {}
    params = {k: _text(run[k]) for k in ("script", "source", "world_size", "nproc_per_node", "price_per_hour")
              if run.get(k) is not None}
    if run.get("args"):
        params["args"] = " ".join(run["args"])
    if run.get("devices"):
        params["devices"] = ", ".join(run["devices"])
    params["mode"] = _text(summary.get("mode") or "")
    for key, value in (run.get("config") or {}).items():
        params[f"config.{key}"] = _text(value)
    tags = {"perfscope.verdict": overall.get("verdict") or "none",
            "perfscope.provisional": "true" if overall.get("provisional") else "false",
            "perfscope.version": summary.get("perfscope_version") or __version__,
            "perfscope.command": "profile" if run.get("script") else "analyze"}
    if overall.get("runner_up"):
        tags["perfscope.runner_up"] = overall["runner_up"]
    scalars: dict[str, float] = {}
    _put(scalars, "median_step_ms", overall.get("median_step_time_us"), 1e-3)
    _put(scalars, "step_time_ms", overall.get("step_time_us"), 1e-3)
    _put(scalars, "steps_counted", overall.get("steps_counted"))
    for c, v in (overall.get("fractions") or {}).items():
        _put(scalars, f"share/{c}", v)
    _put(scalars, "mfu", (details.get("mfu") or {}).get("mfu"))
    _put(scalars, "memory_peak_bytes", (details.get("memory") or {}).get("peak_bytes"))
    cost = details.get("cost") or {}
    _put(scalars, "cost_per_step_usd", cost.get("per_step"))
    _put(scalars, "cost_per_1000_samples_usd", cost.get("per_1000_samples"))
    _put(scalars, "cost_per_run_usd", cost.get("per_run"))
    _put(scalars, "energy_per_step_j", (details.get("energy") or {}).get("per_step_j"))
    name = Path(run.get("script") or run.get("source") or folder.name).stem.split(".")[0] or folder.name
    return RunExport(name=name, params=params, tags=tags, steps=_merge(_profile_steps(summary), _run_steps(folder)),
                     summary=scalars, artifacts=_files(folder, "report.html", "summary.json"))


def tune_export(folder: Path, record: dict) -> RunExport:
    """The parent run of a ``perfscope tune`` output folder, and one child run per trial."""
    objective, rec = record.get("objective") or {}, record.get("recommendation") or {}
    params = {"script": _text(record.get("script") or ""), "args": " ".join(record.get("args") or []),
              "objective": _text(objective.get("name") or "time"), "unit": _text(objective.get("unit") or ""),
              "trials_target": _text((record.get("study") or {}).get("trials_target"))}
    if record.get("nproc_per_node"):
        params["nproc_per_node"] = _text(record["nproc_per_node"])
    tags = {"perfscope.recommendation": rec.get("status") or "none",
            "perfscope.decided_by": record.get("decided_by") or "none",
            "perfscope.verdict": (record.get("baseline") or {}).get("verdict") or "none",
            "perfscope.version": record.get("perfscope_version") or __version__, "perfscope.command": "tune"}
    scalars: dict[str, float] = {}
    _put(scalars, "baseline_value", (record.get("baseline") or {}).get("value"))
    for key in ("speedup", "ci_low", "ci_high"):
        _put(scalars, key, rec.get(key))
    cost = record.get("cost") or {}
    _put(scalars, "cost_per_1000_baseline_usd", cost.get("baseline"))
    _put(scalars, "cost_per_1000_best_usd", cost.get("best"))
    children = []
    for t in record.get("trials") or []:
        child_params = {f"config.{k}": _text(v) for k, v in (t.get("config") or {}).items()}
        child_params["role"] = _text(t.get("role") or "")
        child_tags = {"perfscope.state": t.get("state") or "unknown", "perfscope.verdict": t.get("verdict") or "none"}
        if (t.get("failure") or {}).get("kind"):
            child_tags["perfscope.failure"] = t["failure"]["kind"]
        child_scalars: dict[str, float] = {}
        _put(child_scalars, "value", t.get("value"))
        _put(child_scalars, "duration_s", t.get("duration_s"))
        steps = [StepMetrics(step=i + 1, values={"value": float(v)})
                 for i, v in enumerate(t.get("step_values") or []) if _number(v) is not None]
        children.append(RunExport(name=f"trial {t.get('number')}", params=child_params, tags=child_tags,
                                  steps=steps, summary=child_scalars))
    name = f"tune-{Path(record.get('script') or folder.name).stem}"
    return RunExport(name=name, params=params, tags=tags, summary=scalars,
                     artifacts=_files(folder, "tune.json", "report.html", "best.yaml"), children=children)


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
