"""``perfscope tune``: profile, shape the space, search, prove the winner, show before and after.

See ``docs/tune.md`` for the steps, the definitions and the outputs.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

from perfscope.errors import PerfscopeError
from perfscope.runtime.config import AccelConfig, config_from_dict, save_config
from tuner import record as tune_record
from tuner.confirm import confirm_candidates
from tuner.progress import Progress
from tuner.pruner import SlowerThanBestPruner
from tuner.space import build_space, rule_based_guess
from tuner.storage import describe_storage, open_storage
from tuner.study import (
    SPACE_ATTR,
    DuplicateTrial,
    TuningStudy,
    pid_alive,
    trial_verdict,
    worker_id,
)
from tuner.trial import TrialSpec, cleanup_traces, run_trial

BASELINE_PROFILE_STEPS = 5  # as `perfscope profile`'s default active window
SETUP_WAIT_S = 180.0
COMMAND_ATTR = "perfscope.command"
SETUP_BY_ATTR = "perfscope.setup_by"  # the worker profiling the baseline  # how long a second worker waits for the first one's baseline


class TuneError(PerfscopeError):
    """The tuning cannot start or go on (the baseline fails, the study is unusable...)."""


@dataclasses.dataclass
class TuneOptions:
    """What ``perfscope tune`` was asked.

    Attributes:
        script, script_args: The training script and its arguments.
        out_dir: Output folder; ``best_path`` the configuration file to write (in it by default).
        trials: Trials in the study, baseline included (the study-wide total).
        time_budget_s: Seconds after which no new trial starts (None: no limit).
        warmup_steps, measure_steps, profile_steps: Per trial (see :class:`tuner.trial.TrialSpec`).
        nproc_per_node: Ranks per trial, or None.
        storage: Study storage URL (None: SQLite in ``out_dir``); study_name its name.
        seed: Seed for the script and the sampler.
        confirm_top, confirm_rounds, min_gain, confidence: The confirmation step.
        trial_timeout_s: Limit of one trial (None: from the baseline's duration).
        progress: Show the progress bar.
    """

    script: str
    script_args: tuple[str, ...]
    out_dir: Path
    best_path: Path
    study_name: str
    trials: int = 12
    time_budget_s: float | None = None
    warmup_steps: int = 3
    measure_steps: int = 8
    profile_steps: int = 2
    nproc_per_node: int | None = None
    storage: str | None = None
    seed: int = 0
    confirm_top: int = 2
    confirm_rounds: int = 5
    min_gain: float = 0.02
    confidence: float = 0.95
    trial_timeout_s: float | None = None
    progress: bool = True


def tune(options: TuneOptions) -> dict:
    """Run the whole tuning and write its outputs; returns the ``tune.json`` record.

    Raises:
        TuneError: the baseline run fails or measures too few steps.
        StorageError: the study storage cannot be opened.
        KeyboardInterrupt: after writing the outputs of the finished trials.
    """
    started = time.monotonic()
    # The progress bar and our lines say it. ERROR, not WARNING: Optuna logs a trial that raised
    # (Ctrl-C) as a warning with its traceback, and Ctrl-C must end with our one line.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    out = options.out_dir
    out.mkdir(parents=True, exist_ok=True)
    storage = open_storage(options.storage, out)
    spec = TrialSpec(script=options.script, script_args=tuple(options.script_args),
                     nproc_per_node=options.nproc_per_node, warmup_steps=options.warmup_steps,
                     measure_steps=options.measure_steps, profile_steps=options.profile_steps, seed=options.seed,
                     timeout_s=options.trial_timeout_s or 900.0)
    study, created = _open_study(storage, options)
    _check_same_command(study, options)
    session = TuningStudy(study, spec, out / "trials")
    if created:
        study.set_user_attr(SETUP_BY_ATTR, worker_id())
    if not session.load_setup():
        if not created and _setup_owner_may_be_running(study):
            print(f"perfscope: study {options.study_name!r} is being set up by another worker: waiting up to "
                  f"{SETUP_WAIT_S:.0f} s for its baseline...")
            session.wait_for_setup(SETUP_WAIT_S)
        if session.space is None:
            study.set_user_attr(SETUP_BY_ATTR, worker_id())
            _set_up(session, options, out)
    if options.trial_timeout_s is None:  # a trial may take a few times the baseline's time
        session.spec = dataclasses.replace(spec, timeout_s=max(60.0, 4.0 * float(session.baseline.get("duration_s") or 60.0) + 30.0))
    _print_space(session)
    requeued = session.requeue_lost_trials()
    if requeued:
        print(f"perfscope: resuming: trial(s) {', '.join(map(str, requeued))} were cut short and are queued again")
    notes: list[str] = []
    if not any(v is not None for v in session.baseline.get("losses") or []):
        line = ("the numerics guard did not run: no loss was seen (perfscope sees the loss passed to "
                "perfscope.backward or to backward() of a scalar), so trials are compared on speed only")
        print(f"perfscope: {line}")
        notes.append(line)
    storage_text = describe_storage(options.storage, out)
    record_args = {"options": options, "session": session, "storage": storage_text}
    confirmation = recommendation = after = None
    try:  # Ctrl-C at any point: tune.json says what finished
        _search(session, options, started, notes)
        confirmation, recommendation = _prove(session, options, notes)
        _write_best(options, recommendation)
        record = tune_record.build(**record_args, notes=notes, confirmation=confirmation, recommendation=recommendation)
        tune_record.write_outputs(out, record, best=options.best_path)  # before the last profile
        if recommendation["status"] == "faster":
            after = _profile_after(session, options, recommendation)
    except KeyboardInterrupt:
        notes.append("interrupted by Ctrl-C: the finished trials are kept; run the same command again to resume")
        tune_record.write_outputs(out, tune_record.build(**record_args, notes=notes, confirmation=confirmation,
                                                         recommendation=recommendation),
                                  best=options.best_path if recommendation else None)
        raise
    record = tune_record.build(**record_args, notes=notes, confirmation=confirmation,
                               recommendation=recommendation, after=after)
    tune_record.write_outputs(out, record, best=options.best_path)
    return record


def _open_study(storage, options: TuneOptions) -> tuple[optuna.Study, bool]:
    sampler = optuna.samplers.TPESampler(seed=options.seed, n_startup_trials=4, multivariate=True)
    pruner = SlowerThanBestPruner(warmup_steps=min(3, options.measure_steps))
    try:
        study = optuna.create_study(storage=storage, study_name=options.study_name, direction="maximize",
                                    sampler=sampler, pruner=pruner)
        return study, True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(storage=storage, study_name=options.study_name, sampler=sampler, pruner=pruner)
        if study.direction != optuna.study.StudyDirection.MAXIMIZE:
            raise TuneError(f"study {options.study_name!r} exists and minimizes; pick another --study-name") from None
        return study, False


def _write_best(options: TuneOptions, recommendation: dict) -> None:
    best = config_from_dict(recommendation["config"])
    comment = f"perfscope tune {Path(options.script).name}: {recommendation['line']}"
    save_config(best, options.best_path, comment=comment, only_changes=True)


def _setup_owner_may_be_running(study: optuna.Study) -> bool:
    """Whether the worker that took on the study's setup may still be doing it (so wait for it)."""
    owner = study.user_attrs.get(SETUP_BY_ATTR) or {}
    if owner.get("host") != socket.gethostname():
        return bool(owner)  # another machine: only its heartbeat-less word; wait, with the timeout
    return owner.get("pid") != os.getpid() and pid_alive(int(owner.get("pid") or 0))


def _check_same_command(study: optuna.Study, options: TuneOptions) -> None:
    """A study belongs to one script and its arguments: resuming it with others would mix baselines.

    A study whose setup never finished (its baseline failed) holds no trial and takes the new command.
    """
    command = {"script": options.script, "args": list(options.script_args), "nproc_per_node": options.nproc_per_node}
    stored = study.user_attrs.get(COMMAND_ATTR)
    if stored is None or (stored != command and SPACE_ATTR not in study.user_attrs and not study.get_trials()):
        study.set_user_attr(COMMAND_ATTR, command)
    elif stored != command:
        raise TuneError(f"study {options.study_name!r} was made for `{_words(stored)}`, not `{_words(command)}`; "
                        "pass another --study-name or --out to start a new one")


def _words(command: dict) -> str:
    ranks = f" --nproc-per-node {command['nproc_per_node']}" if command.get("nproc_per_node") else ""
    args = f" -- {' '.join(command['args'])}" if command.get("args") else ""
    return f"perfscope tune{ranks} {Path(command['script']).name}{args}"


def _set_up(session: TuningStudy, options: TuneOptions, out: Path) -> None:
    """Profile the baseline, shape the space, seed the study."""
    print(f"perfscope: profiling the baseline ({options.warmup_steps} warm-up + {options.measure_steps} measured "
          f"+ {BASELINE_PROFILE_STEPS} profiled steps)...")
    outcome = run_trial(session.spec, None, out / "trials" / "baseline", profile_steps=BASELINE_PROFILE_STEPS)
    loader = (outcome.facts.get("dataloader") or {}) if outcome.ok else {}
    if loader.get("num_workers"):
        # The script loads with workers: drain their prefetched batches and measure whole worker
        # rounds, as every trial with workers does.
        outcome = run_trial(session.spec, None, out / "trials" / "baseline", profile_steps=BASELINE_PROFILE_STEPS,
                            loader_workers=loader["num_workers"], prefetch_factor=loader.get("prefetch_factor"))
    if not outcome.ok:
        log = out / "trials" / "baseline" / "output.log"
        hint = ""
        if outcome.status == "too-few-steps" and "perfscope.step()" not in (outcome.reason or ""):
            hint = "; let the script run longer (its arguments go after --) or lower --warmup-steps/--steps-per-trial"
        raise TuneError(f"the baseline run failed ({outcome.status}): {outcome.reason}{hint} (output: {log})")
    verdict, fractions, summary = trial_verdict(outcome)
    baseline = {
        "value": outcome.value, "unit": outcome.unit, "step_values": outcome.step_values,
        "losses": outcome.losses, "verdict": verdict, "fractions": fractions, "facts": outcome.facts,
        "duration_s": round(outcome.duration_s, 3), "data_wait": outcome.data_wait,
    }
    if summary is not None:
        from perfscope.outputs import write_outputs

        write_outputs(summary, out / "baseline")
        baseline["summary"], baseline["report"] = "baseline/summary.json", "baseline/report.html"
    cleanup_traces(outcome)
    print(f"perfscope: baseline {outcome.value:.4g} {outcome.unit}, verdict {verdict or 'unknown (no profiled steps)'}")
    space = build_space(outcome.facts, fractions or {}, verdict or "unknown")
    session.store_setup(space, baseline, rule_based_guess(space, outcome.facts, fractions=fractions))


def _print_space(session: TuningStudy) -> None:
    space = session.space
    names = ", ".join(k.name for k in space.knobs) or "none"
    print(f"perfscope: searching {names} (groups by share of step time: {', '.join(space.order)})")
    for knob, why in space.excluded.items():
        print(f"  left out {knob}: {why}")


def _search(session: TuningStudy, options: TuneOptions, started: float, notes: list[str]) -> None:
    if not session.space.knobs:
        notes.append("nothing to search: no knob can apply to this run (see space.excluded)")
        return
    done = session.finished_count()
    if done >= options.trials:
        line = (f"the study already holds {done} finished trials (--trials {options.trials}); no new trial ran "
                "(pass a larger --trials to search more); confirming its best again")
        print(f"perfscope: {line}")
        notes.append(line)
        return
    timeout = None
    if options.time_budget_s is not None:
        timeout = max(0.0, options.time_budget_s - (time.monotonic() - started))
    target = optuna.study.MaxTrialsCallback(options.trials, states=(TrialState.COMPLETE, TrialState.PRUNED))
    with Progress(session, options, started, enabled=options.progress) as progress:
        # No n_trials: skipped duplicates do not count, MaxTrialsCallback ends the study-wide search.
        session.study.optimize(session.objective, timeout=timeout, callbacks=[target, progress.update],
                               catch=(DuplicateTrial,))
    if session.exhausted:
        notes.append("the search stopped early: the sampler kept proposing configurations already measured")


def _prove(session: TuningStudy, options: TuneOptions, notes: list[str]) -> tuple[dict | None, dict]:
    """Confirm the best few candidates against the baseline; the recommendation."""
    baseline_value = float(session.baseline["value"])
    keep = {"status": "keep-current", "trial": None, "config": {}, "speedup": None, "ci_low": None, "ci_high": None}
    candidates, seen = [], set()
    for t in session.feasible_trials():
        key = tuple(sorted((t.user_attrs.get("config") or {}).items()))
        if not key or key in seen or t.value <= baseline_value * (1 + options.min_gain):
            continue
        seen.add(key)
        candidates.append(t)
        if len(candidates) >= options.confirm_top:
            break
    if not candidates:
        if not session.space.knobs:
            keep["line"] = "keep your current settings: no knob can apply to this run (see the knobs left out)"
        else:
            keep["line"] = ("keep your current settings: no feasible trial beat the baseline by more than "
                            f"{options.min_gain:.0%} in the search")
        return None, keep
    spec = session.spec
    work = session.work_dir / f"confirm-{os.getpid()}"  # other workers may confirm at the same time
    print(f"perfscope: confirming trial(s) {', '.join(str(t.number) for t in candidates)} against the baseline, "
          f"{options.confirm_rounds} interleaved rounds...")

    def measure(config: AccelConfig | None, name: str):
        def run() -> float | None:
            outcome = run_trial(spec, config, work / name, profile_steps=0,
                                **session.loader_settings(config))
            if not outcome.ok or outcome.value is None:
                notes.append(f"confirmation run of {name} failed ({outcome.status}): {outcome.reason}")
                return None
            return outcome.value
        return run

    def baseline_run() -> float:
        value = measure(None, "baseline")()
        if value is None:
            raise TuneError("the baseline failed during confirmation; see the notes in tune.json")
        return value

    results = confirm_candidates(
        baseline_run,
        {t.number: measure(config_from_dict(t.user_attrs["config"]), f"trial-{t.number}") for t in candidates},
        rounds=options.confirm_rounds, confidence=options.confidence, min_gain=options.min_gain,
    )
    confirmation = {"rounds": options.confirm_rounds, "confidence": options.confidence, "min_gain": options.min_gain,
                    "candidates": []}
    best = None
    for t in candidates:
        c = results.get(t.number)
        entry = {"trial": t.number, "config": t.user_attrs["config"], "baseline": None, "candidate": None,
                 "speedup": None, "ci_low": None, "ci_high": None, "faster": False}
        if c is not None:
            entry.update(baseline=list(c.baseline), candidate=list(c.candidate), speedup=c.speedup,
                         ci_low=c.ci_low, ci_high=c.ci_high, faster=c.faster)
            # The largest *proven* gain: the interval's low end, not the noisier point estimate.
            if c.faster and (best is None or c.ci_low > best[1].ci_low):
                best = (t, c)
        confirmation["candidates"].append(entry)
    if best is None:
        lines = [f"trial {e['trial']}: {e['speedup']:.2f}x ({e['ci_low']:.2f}x-{e['ci_high']:.2f}x)"
                 for e in confirmation["candidates"] if e["speedup"] is not None]
        keep["line"] = ("keep your current settings: no candidate was faster beyond the measured noise"
                        + (f" ({'; '.join(lines)})" if lines else ""))
        return confirmation, keep
    t, c = best
    recommendation = {"status": "faster", "trial": t.number, "config": t.user_attrs["config"], "speedup": c.speedup,
                      "ci_low": c.ci_low, "ci_high": c.ci_high, "line": c.describe(),
                      "hint": _range_hint(session.space, t.user_attrs["config"])}
    return confirmation, recommendation


def _range_hint(space, config: dict) -> str | None:
    """What to try next when the recommendation sits at the top of a searched range."""
    top = space.at_top(config)
    if not top:
        return None
    which = " and ".join(f"{k.name}={config[k.name]!r}" for k in top)
    ranges = "; ".join(f"{k.name} {k.choices_text()}" for k in top)
    line = (f"{which} {'is the largest value' if len(top) == 1 else 'are the largest values'} searched ({ranges}): "
            "larger ones were not tried and may be faster still")
    if any(k.name == "num_workers" for k in top):
        # build_space's range: 2 workers per core (at least 4, at most 16), or the script's own value.
        line += ("; num_workers goes up to 2 per CPU core (at least 4, at most 16) or to the script's own "
                 "value: set more workers in the script to search further")
    return line


def _profile_after(session: TuningStudy, options: TuneOptions, recommendation: dict) -> dict | None:
    """Profile the recommended configuration and compare it with the baseline's profile."""
    out = options.out_dir
    config = config_from_dict(recommendation["config"])
    outcome = run_trial(session.spec, config, session.work_dir / f"best-{os.getpid()}", profile_steps=BASELINE_PROFILE_STEPS,
                        **session.loader_settings(config))
    verdict, fractions, summary = trial_verdict(outcome)
    cleanup_traces(outcome)
    if summary is None:
        return None
    from perfscope.outputs import write_outputs
    from perfscope.siblings import import_sibling

    write_outputs(summary, out / "best")
    after = {"verdict": verdict, "fractions": fractions, "summary": "best/summary.json", "report": "best/report.html",
             "diff": None}
    baseline_summary = out / "baseline" / "summary.json"
    if baseline_summary.is_file():
        from perfscope.summary import load_summary

        reports = import_sibling("reports")
        reports.write_diff(load_summary(baseline_summary), summary, out / "diff.html", "baseline", "best")
        after["diff"] = "diff.html"
    return after
