"""``perfscope tune``: profile, shape the space, search, prove the winner, show before and after.

See ``docs/tune.md`` for the steps, the definitions and the outputs.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from contextlib import contextmanager
from pathlib import Path

import optuna
import sqlalchemy.exc

from perfscope.errors import PerfscopeError
from perfscope.redact import redact, url_secrets
from perfscope.runtime.config import config_from_dict
from perfscope.text import safe
from perfscope.tuner import record as tune_record
from perfscope.tuner.attrs import BaselineRun, Worker, worker_of
from perfscope.tuner.command import check_same_command
from perfscope.tuner.objective import require_energy_counter
from perfscope.outlock import FolderLock
from perfscope.tuner.progress import Progress, still_running
from perfscope.tuner.sampler import CoordinateSampler
from perfscope.tuner.prove import prove
from perfscope.tuner.plan import budget_cut, plan_line
from perfscope.tuner.pruner import SlowerThanBestPruner
from perfscope.tuner.results import RunOutputs
from perfscope.tuner.space import build_space, rule_based_guess
from perfscope.tuner.storage import StorageError, describe_storage, open_storage
from perfscope.tuner.profiled import memory_of, step_time_of, trial_verdict, verdict_text
from perfscope.tuner.study import (
    CATCH as STUDY_CATCH,
    SPACE_ATTR,
    TuningStudy,
    pid_alive,
    worker_id,
)
from perfscope.tuner.trial import TrialSpec, cleanup_traces, noise_text
from perfscope.tuner.runner import PROCESS_RUNNER, TrialRunner, run_configuration, runner_of
from perfscope.tuner.options import TuneOptions
from perfscope.record.run_facts import run_facts

BASELINE_PROFILE_STEPS = 5  # as `perfscope profile`'s default active window
SETUP_WAIT_S = 180.0  # how long a second worker waits for the first one's baseline
SETUP_BY_ATTR = "perfscope.setup_by"  # the worker profiling the baseline


class TuneError(PerfscopeError):
    """The tuning cannot start or go on (the baseline fails, the study is unusable...)."""


def tune(options: TuneOptions, *, runner: TrialRunner | None = None) -> dict:
    """Run the whole tuning and write its outputs; returns the ``tune.json`` record.

    Args:
        options: What the tuning is asked (validated).
        runner: Runs each configuration (None: the script in child processes,
            :class:`perfscope.tuner.runner.ProcessRunner`).

    Raises:
        TuneError: the baseline run fails or measures too few steps.
        StorageError: the study storage cannot be opened, or fails while the tuning runs.
        perfscope.outlock.FolderBusy: another tuner holds the output folder.
        tuner.command.CommandChanged: the study was made for another command or measurement.
        KeyboardInterrupt: after writing the outputs of the finished trials.
    """
    if options.objective == "energy" and runner is None:
        require_energy_counter()  # before anything is created: trials that could read no joule
    clock = (runner or PROCESS_RUNNER).clock
    started = clock()
    # The progress bar and our lines say it. ERROR, not WARNING: Optuna logs a trial that raised
    # (Ctrl-C) as a warning with its traceback, and Ctrl-C must end with our one line.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    with FolderLock(options.out_dir), _storage_failures(options):  # one tuner per folder, for its whole life
        return _tune(options, started, runner)


@contextmanager
def _storage_failures(options: TuneOptions):
    """A storage that fails while the tuning runs (a server gone, a table it cannot read) is a
    :class:`StorageError` naming it, not an internal error; the study keeps what it stored."""
    try:
        yield
    except (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError) as e:
        shown = describe_storage(options.storage, options.out_dir)
        reason = str(getattr(e, "orig", None) or e).strip().splitlines()
        raise StorageError(f"the study storage {shown} failed: "
                           f"{redact(reason[0] if reason else type(e).__name__, secrets=url_secrets(options.storage))}; "
                           "the finished trials are kept in it: run the same command again to resume") from None


def _tune(options: TuneOptions, started: float, runner: TrialRunner | None) -> dict:
    out = options.out_dir
    storage = open_storage(options.storage, out)
    board = None
    if options.nodes is not None:
        from perfscope.tuner.nodes import TrialBoard

        board = TrialBoard(options.nodes, options.nproc_per_node)
        print(f"perfscope: node 0 of {options.nodes.nnodes}: driving the study; every trial runs on all nodes")
    spec = TrialSpec.of(options, board=board, runner=runner)
    try:
        return _tune_with(spec, storage, options, started)
    finally:
        if board is not None:
            board.stop()  # the other nodes end too, whatever ended this one (Ctrl-C, an error)


def _tune_with(spec: TrialSpec, storage, options: TuneOptions, started: float) -> dict:
    out = options.out_dir
    study, created = _open_study(storage, options)
    check_same_command(study, options, space_attr=SPACE_ATTR)
    session = TuningStudy(study, spec, out / "trials", storage=storage)
    _ensure_setup(session, created, options)
    notes = _before_search(session, options)
    storage_text = describe_storage(options.storage, out)
    record_args = {"options": options, "session": session, "storage": storage_text}
    confirmation = recommendation = after = None
    outputs = RunOutputs(out, options.best_path)
    comment = f"perfscope tune {Path(options.script).name}"
    try:  # Ctrl-C at any point: tune.json says what finished
        _search(session, options, started, notes)
        _note_stale(session, notes, settle=True)  # a dead worker's trial is not left running for ever
        confirmation, recommendation = prove(session, options, notes)
        _note_outputs(outputs, recommendation, notes)
        record = tune_record.build(**record_args, notes=notes, confirmation=confirmation, recommendation=recommendation)
        outputs.write(record, recommendation, comment=f"{comment}: {recommendation['line']}")  # before the last profile
        if recommendation["status"] == "faster":
            after = _profile_after(session, options, recommendation, notes)
    except KeyboardInterrupt:
        if recommendation is None:
            notes.append("interrupted (Ctrl-C or SIGTERM) before the answer: no best.yaml is written; the finished "
                         f"trials are kept; to resume: {tune_record.resume_command(options)}")
        else:
            notes.append("interrupted (Ctrl-C or SIGTERM) while profiling the recommendation: best.yaml holds the "
                         "answer; the after profile is missing")
        _note_outputs(outputs, recommendation, notes)
        outputs.write(tune_record.build(**record_args, notes=notes, confirmation=confirmation,
                                        recommendation=recommendation, interrupted=True), recommendation,
                      comment=f"{comment}: {recommendation['line']}" if recommendation else None)
        raise
    record = tune_record.build(**record_args, notes=notes, confirmation=confirmation,
                               recommendation=recommendation, after=after)
    outputs.write(record, recommendation, comment=f"{comment}: {recommendation['line']}")
    return record


def _before_search(session: TuningStudy, options: TuneOptions) -> list[str]:
    """What follows from the baseline before the search (the trials' time limit, the space and the
    plan told, lost trials queued again); returns the record's first notes."""
    if options.trial_timeout_s is None:  # a trial may take a few times the baseline's time
        timeout_s = max(60.0, 4.0 * float(session.baseline.duration_s or 60.0) + 30.0)
        session.spec = dataclasses.replace(session.spec, timeout_s=timeout_s)
    _print_space(session)
    plan = plan_line(session, options)
    if plan:
        print(f"perfscope: {safe(plan)}")
    notes: list[str] = []
    requeued = session.requeue_lost_trials()
    if requeued:
        print(f"perfscope: resuming: trial(s) {', '.join(map(str, requeued))} were cut short and are queued again")
    _note_stale(session, notes)
    if not any(v is not None for v in session.baseline.losses):
        line = ("the numerics guard did not run: no loss was seen (perfscope sees the loss passed to "
                "perfscope.backward or to backward() of a scalar), so trials are compared on speed only")
        print(f"perfscope: {safe(line)}")
        notes.append(line)
    return notes


def _ensure_setup(session: TuningStudy, created: bool, options: TuneOptions) -> None:
    """Load the study's baseline and space; where another worker is setting them up, wait for
    it; where none has (or it gave up), profile the baseline here."""
    study = session.study
    if created:
        study.set_user_attr(SETUP_BY_ATTR, worker_id())
    if session.load_setup():
        return
    if not created and _setup_owner_may_be_running(study):
        print(f"perfscope: study {options.study_name!r} is being set up by another worker: waiting up to "
              f"{SETUP_WAIT_S:.0f} s for its baseline...")
        session.wait_for_setup(SETUP_WAIT_S)
    if session.space is None:
        study.set_user_attr(SETUP_BY_ATTR, worker_id())
        _set_up(session, options, options.out_dir)


def _note_stale(session: TuningStudy, notes: list[str], *, settle: bool = False) -> None:
    """Fail (and say so) the trials of workers that died; ``settle``: also those inside the
    heartbeat grace period, waiting for it while other workers' trials run (the search's end)."""
    lost = session.settle_running_trials() if settle else session.fail_stale_trials()
    if lost:
        line = (f"trial(s) {', '.join(map(str, lost))} of a worker that stopped sending heartbeats (killed, or its "
                "machine lost) were failed and their configurations queued again")
        print(f"perfscope: {safe(line)}")
        notes.append(line)


def _note_outputs(outputs: RunOutputs, recommendation: dict | None, notes: list[str]) -> None:
    """Set the earlier run's outputs aside (once), and say so and where they are."""
    lines = outputs.begin()
    extra = outputs.previous_note(recommendation)
    if extra:  # it says where the earlier results are, and that this run did not confirm them
        lines = [extra] if extra not in notes else []
    for line in lines:
        print(f"perfscope: {safe(line)}")
        notes.append(line)


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


def _setup_owner_may_be_running(study: optuna.Study) -> bool:
    """Whether the worker that took on the study's setup may still be doing it (so wait for it)."""
    owner = worker_of(study.user_attrs.get(SETUP_BY_ATTR))
    if owner.host != socket.gethostname():
        return owner != Worker()  # another machine: only its heartbeat-less word; wait, with the timeout
    return owner.pid != os.getpid() and pid_alive(owner.pid or 0)


def _set_up(session: TuningStudy, options: TuneOptions, out: Path) -> None:
    """Profile the baseline, shape the space, seed the study."""
    window = (f"at least {options.measure_steps} measured steps, until their throughput is known to "
              f"{options.target_rse:.0%} or {options.measure_cap_s:g} s" if options.target_rse and not options.nproc_per_node
              else f"{options.measure_steps} measured steps")
    print(f"perfscope: profiling the baseline ({options.warmup_steps} warm-up steps, {window}, then "
          f"{BASELINE_PROFILE_STEPS} profiled steps)...", flush=True)
    outcome = _run_baseline(session.spec, out / "trials" / "baseline")
    verdict, fractions, summary = trial_verdict(outcome)
    baseline = BaselineRun(value=outcome.value, unit=outcome.unit, step_values=outcome.step_values,
                           losses=outcome.losses, verdict=verdict, fractions=fractions, facts=outcome.facts,
                           step_time_us=step_time_of(summary), duration_s=round(outcome.duration_s, 3),
                           data_wait=outcome.data_wait, window=outcome.window)
    if summary is not None:
        from perfscope.outputs import write_outputs

        write_outputs(summary, out / "baseline")
        baseline.summary, baseline.report = "baseline/summary.json", "baseline/report.html"
    cleanup_traces(outcome)
    print(safe(f"perfscope: baseline {outcome.value:.4g} {outcome.unit} ({noise_text(outcome)}), "
               f"verdict {verdict_text(verdict, summary, outcome)}"))
    # The profiled steps' memory peak bounds how far a larger batch may go (the batch group).
    facts = {**(outcome.facts or {}), "memory": memory_of(summary)}
    space = build_space(facts, fractions or {}, verdict or "unknown")
    session.store_setup(space, baseline, rule_based_guess(space, facts, fractions=fractions))


def _run_baseline(spec: TrialSpec, work: Path):
    """Run the script as it is, with its profiled steps; returns the ok outcome.

    Raises:
        TuneError: the run failed (with a hint where it ran too few steps).
    """
    outcome = run_configuration(spec, None, work, profile_steps=BASELINE_PROFILE_STEPS,
                                on_progress=still_running("the baseline"))
    loader = run_facts(outcome.facts).dataloader if outcome.ok else None
    if loader is not None and loader.num_workers:
        # The script loads with workers: drain their prefetched batches and measure whole worker
        # rounds, as every trial with workers does.
        outcome = run_configuration(spec, None, work, profile_steps=BASELINE_PROFILE_STEPS,
                                    loader_workers=loader["num_workers"], prefetch_factor=loader.get("prefetch_factor"),
                                    on_progress=still_running("the baseline (again, draining its workers' batches)"))
    if not outcome.ok:
        hint = ""
        if outcome.status == "too-few-steps" and "perfscope.step()" not in (outcome.reason or ""):
            hint = "; let the script run longer (its arguments go after --) or lower --warmup-steps/--steps-per-trial"
        raise TuneError(f"the baseline run failed ({outcome.status}): {outcome.reason}{hint} "
                        f"(output: {work / 'output.log'})")
    return outcome


def _print_space(session: TuningStudy) -> None:
    space = session.space
    names = ", ".join(k.name for k in space.knobs) or "none"
    print(f"perfscope: searching {names} (bottlenecks by share of step time: {', '.join(space.order)})")
    for knob, why in space.excluded.items():
        print(safe(f"  left out {knob}: {why}"))


def _search(session: TuningStudy, options: TuneOptions, started: float, notes: list[str]) -> None:
    if not session.space.knobs:
        notes.append("nothing to search: no knob can apply to this run (see space.excluded)")
        return
    done = session.finished_count()
    if done >= options.trials:
        line = (f"the study already holds {done} finished trials (--trials {options.trials}); no new trial ran "
                "(pass a larger --trials to search more); confirming its best again")
        print(f"perfscope: {safe(line)}")
        notes.append(line)
        return
    clock = runner_of(session.spec).clock
    if options.time_budget_s is not None and clock() - started >= options.time_budget_s:
        session.cut_short = budget_cut(session, options, clock() - started)
        notes.append(session.cut_short)
        return

    def target(study: optuna.Study, trial) -> None:
        # --trials is the study's total; --time-budget starts no trial once spent (on the runner's clock)
        if session.finished_count() >= options.trials:
            study.stop()
        elif options.time_budget_s is not None and clock() - started >= options.time_budget_s:
            study.stop()

    # The profile's order first, one knob at a time around the best; then TPE (tuner/sampler.py).
    if not isinstance(session.study.sampler, CoordinateSampler):
        session.study.sampler = CoordinateSampler(session.space, session.study.sampler)
    with Progress(session, options, started, enabled=options.progress, clock=clock) as progress:
        # No n_trials: skipped duplicates do not count; `target` ends the study-wide search.
        session.study.optimize(session.objective, callbacks=[target, progress.update], catch=STUDY_CATCH)
    if session.exhausted:
        notes.append(f"the search stopped early: {session.exhausted}")
    elif session.finished_count() < options.trials and options.time_budget_s is not None \
            and clock() - started >= options.time_budget_s:
        session.cut_short = budget_cut(session, options, clock() - started)
        print(f"perfscope: {safe(session.cut_short)}")
        notes.append(session.cut_short)


def _profile_after(session: TuningStudy, options: TuneOptions, recommendation: dict,
                   notes: list[str]) -> dict | None:
    """Profile the recommended configuration and compare it with the baseline's profile; where
    it cannot be profiled, a note in ``notes`` (and on the console) says why."""
    out = options.out_dir
    config = config_from_dict(recommendation["config"])
    print(f"perfscope: profiling the recommended configuration for the before/after comparison "
          f"({BASELINE_PROFILE_STEPS} profiled steps)...", flush=True)
    # The least measured window (no target error): a configuration that is many times faster
    # would otherwise measure until the script's last step and leave none to profile.
    spec = dataclasses.replace(session.spec, target_rse=None)
    outcome = run_configuration(spec, config, session.work_dir / f"best-{os.getpid()}",
                                profile_steps=BASELINE_PROFILE_STEPS,
                                on_progress=still_running("the profile of the recommendation"),
                                **session.loader_settings(config))
    verdict, fractions, summary = trial_verdict(outcome)
    cleanup_traces(outcome)
    if summary is None:
        why = (f"its run failed ({outcome.status}: {outcome.reason})" if not outcome.ok else
               f"its run left no step to profile after {spec.warmup_steps} warm-up and {spec.measure_steps} "
               "measured steps: give the script more steps (after --) for the before/after comparison")
        line = f"the recommendation was not profiled, so there is no before/after comparison: {why}"
        print(f"perfscope: {safe(line)}")
        notes.append(line)
        return None
    from perfscope import reports
    from perfscope.outputs import write_outputs

    write_outputs(summary, out / "best")
    after = {"verdict": verdict, "fractions": fractions, "step_time_us": step_time_of(summary),
             "summary": "best/summary.json", "report": "best/report.html", "diff": None}
    baseline_summary = out / "baseline" / "summary.json"
    if baseline_summary.is_file():
        from perfscope.record import load_summary

        confirmed = {"ratio": recommendation.get("speedup"), "low": recommendation.get("ci_low"),
                     "high": recommendation.get("ci_high"), "rounds": recommendation.get("rounds"),
                     "unit": session.baseline.unit if session.baseline is not None else None}
        reports.write_diff(load_summary(baseline_summary), summary, out / "diff.html", "baseline", "best",
                           speedup=confirmed)
        after["diff"] = "diff.html"
    return after
