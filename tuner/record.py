"""The tuning record (``tune.json``, schema ``perfscope.tune`` v1) and the files written from it.

The schema is documented in ``docs/tune.md``; the record is built from the study, so a resumed or
shared study gives the same trial list to every worker.
"""

from __future__ import annotations

import datetime as _dt
import math
import shlex
from pathlib import Path

import msgspec
import orjson
from optuna.trial import TrialState

from perfscope.version import __version__
from perfscope.atomic import write_bytes_atomic
from perfscope.record import tune_schema as schema
from perfscope.record.run_facts import run_facts
from perfscope.tuner.attrs import BaselineRun, Failure, TrialAttrs, trial_attrs, trial_mark
from perfscope.tuner.objective import cost_of

_STATES = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned", TrialState.FAIL: "failed",
           TrialState.RUNNING: "running", TrialState.WAITING: "waiting"}


def _finite(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def trial_entry(t, retried: bool = False) -> dict:
    """One trial of the study as a ``tune.json`` entry (``retried``: a later trial retries it, as
    the storage does for a trial whose worker stopped sending heartbeats)."""
    attrs = trial_attrs(t)
    failure = _failure(t, attrs, retried)
    return {
        "number": t.number,
        "state": _STATES.get(t.state, t.state.name.lower()),
        "role": attrs.role or "search",
        "params": dict(t.params),
        "config": attrs.changes,
        "value": _finite(_value(t, failure)),
        "step_values": [v for v in map(_finite, attrs.step_values or []) if v is not None],
        "feasible": bool(attrs.feasible) and t.state == TrialState.COMPLETE,
        "failure": msgspec.to_builtins(failure),
        "numerics": attrs.numerics or {"status": "not-visible", "detail": "not measured"},
        "verdict": attrs.verdict,
        "memory": attrs.memory,
        "duration_s": _finite(attrs.duration_s),
        "window": attrs.window,
        "threads": attrs.threads,
    }


def _failure(t, attrs: TrialAttrs, retried: bool) -> Failure | None:
    """The trial's failure as recorded, else, for a failed trial, lost (Optuna's heartbeat check
    failed it: it has no ``fail_reason``; ``retried``: its configuration was queued again) or a
    crash inside perfscope."""
    if t.state != TrialState.FAIL or attrs.failure is not None:
        return attrs.failure
    if "fail_reason" not in t.system_attrs:
        again = "; its configuration was queued again" if retried else ""
        return Failure(kind="lost", reason=f"its worker stopped sending heartbeats (killed, or its machine lost){again}")
    return Failure(kind="crash", reason=t.system_attrs["fail_reason"] or "the trial raised an error in perfscope")


def _value(t, failure: Failure | None):
    """A pruned trial's last reported value; none for a failed run (an unsafe one keeps its value)."""
    if t.state == TrialState.PRUNED:
        return t.intermediate_values[t.last_step] if t.last_step is not None else None
    if failure is not None and failure.kind != "unsafe":
        return None  # the run failed: stored failed, with no value
    return t.value


def importances(study) -> dict | None:
    """Optuna's parameter importances (fANOVA) over the complete trials, or None when too few."""
    import optuna

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < 3 or not any(len(t.distributions) for t in complete):
        return None
    try:
        return {k: float(v) for k, v in optuna.importance.get_param_importances(study).items()}
    except (RuntimeError, ValueError, ZeroDivisionError):
        return None  # e.g. every trial has the same parameters


def build(*, options, session, storage: str, notes: list[str], confirmation: dict | None = None,
          recommendation: dict | None = None, after: dict | None = None, interrupted: bool = False) -> dict:
    """The ``tune.json`` record of the study as it stands (``interrupted``: Ctrl-C or SIGTERM
    ended the run before its answer)."""
    baseline = session.baseline or BaselineRun()  # none yet: interrupted while it ran
    stored = session.study.get_trials(deepcopy=False)
    retried = {t.system_attrs["failed_trial"] for t in stored if "failed_trial" in t.system_attrs}
    trials = [trial_entry(t, t.number in retried) for t in stored
              if trial_mark(t).failure_kind != "duplicate"]  # never run
    return {
        "schema": schema.SCHEMA,
        "schema_version": schema.SCHEMA_VERSION,
        "perfscope_version": __version__,
        "generated_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "script": options.script,
        "args": list(options.script_args),
        "nproc_per_node": options.nproc_per_node,
        "study": _plain(schema.Study(name=options.study_name, storage=storage, trials_target=options.trials,
                                     direction="maximize")),
        "objective": _plain(schema.Objective(
            name=options.objective, unit=baseline.unit, warmup_steps=options.warmup_steps,
            measure_steps=options.measure_steps, target_rse=options.target_rse, measure_cap_s=options.measure_cap_s,
            statistic="window")),
        "baseline": _baseline_entry(baseline, trials),
        "space": session.space.describe() if session.space is not None else None,
        "trials": trials,
        "importances": importances(session.study),
        "confirmation": confirmation,
        "recommendation": recommendation,
        "cost": cost_of(price_per_hour=options.price_per_hour, baseline=baseline, recommendation=recommendation,
                        nproc_per_node=options.nproc_per_node, nnodes=options.nodes.nnodes if options.nodes else 1),
        "after": after,
        "decided_by": _decided_by(confirmation, recommendation, interrupted),
        "resume": resume_command(options) if interrupted and recommendation is None else None,
        "notes": list(notes),
    }


def _baseline_entry(baseline: BaselineRun, trials: list[dict]) -> dict:
    """``tune.json``'s ``baseline``: the study's stored baseline, and its trial among ``trials``."""
    return _plain(schema.Baseline(
        trial=next((t["number"] for t in trials if t["role"] == "baseline"), None), value=_finite(baseline.value),
        verdict=baseline.verdict, window=baseline.window, threads=run_facts(baseline.facts).threads,
        fractions=baseline.fractions, step_time_us=_finite(baseline.step_time_us), summary=baseline.summary,
        report=baseline.report))


def _plain(part: msgspec.Struct) -> dict:
    """A part of the record as plain data (its fields in the schema's order)."""
    return msgspec.to_builtins(part)


def _decided_by(confirmation: dict | None, recommendation: dict | None, interrupted: bool) -> str | None:
    if interrupted and recommendation is None:
        return "interrupted"
    if recommendation is None:
        return None
    return "confirmation" if confirmation and confirmation.get("candidates") else "search"


def resume_command(options) -> str:
    """The command that resumes the run: the one typed (a password in it masked), else in words."""
    if not options.command:
        return "run the same command again"
    from perfscope.redact import redact

    return redact(shlex.join(options.command))


def write_outputs(out_dir: Path, record: dict, best: Path | None) -> dict[str, Path]:
    """Write ``tune.json`` and ``report.html`` (each atomically); returns the paths by name."""
    out = Path(out_dir)
    if best is not None:
        try:
            record["best_config"] = str(Path(best).resolve().relative_to(out.resolve()))
        except ValueError:
            record["best_config"] = str(Path(best).resolve())
    paths = {"record": write_bytes_atomic(out / "tune.json", orjson.dumps(record, option=orjson.OPT_INDENT_2))}
    from perfscope import reports

    paths["report"] = reports.write_tuning(record, out / "report.html")
    return paths
