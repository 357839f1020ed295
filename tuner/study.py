"""The tuning study: a plain Optuna study whose trials run the script through :mod:`perfscope.tuner.trial`.

State lives here: the Optuna study, the search space stored in it (so every worker and every
resumed run searches the same one), the baseline, and the trial folders. Each trial keeps, as
user attributes: ``role`` (baseline, guess, search), ``config`` (the changes it applies),
``step_values`` (throughput per measured step), ``unit``, ``failure`` (kind and reason),
``numerics``, ``verdict`` and ``fractions`` of its profiled steps, ``worker`` (host and pid) and
``feasible``. A trial that could not be measured (a crash, out of memory, a timeout, too few
steps, no samples...) is stored *failed* (Optuna's ``FAIL`` state) with its reason, never with a
value; it counts towards ``--trials`` and its configuration is not measured again. A trial whose
loss departs from the baseline's (``unsafe``) was measured: it keeps its value and carries a
violated Optuna constraint.
"""

from __future__ import annotations

import os
import random
import socket
import time
import warnings
from pathlib import Path

import msgspec
import optuna
from optuna.trial import TrialState

from perfscope.process.keeper import pid_alive
from perfscope.tuner.attrs import BaselineRun, baseline_run, trial_mark
from perfscope.tuner.numerics import at_same_samples, check_losses
from perfscope.tuner.profiled import memory_of, trial_verdict
from perfscope.tuner.pruner import FEASIBLE_ATTR
from perfscope.tuner.space import SearchSpace
from perfscope.tuner.trial import Pruned, TrialOutcome, TrialSpec, cleanup_traces
from perfscope.tuner.runner import run_configuration
from perfscope.record.run_facts import run_facts

SPACE_ATTR = "perfscope.space"
BASELINE_ATTR = "perfscope.baseline"
REQUEUED_ATTR = "perfscope.requeued"
# The trial's Optuna constraint (``Trial.set_constraint``): 1 when it failed or was unsafe, 0 when
# feasible; Optuna's samplers read it, so they learn which regions fail.
CONSTRAINT = "infeasible"


def worker_id() -> dict:
    """This worker's identity, kept on its trials (to recognise trials of a dead worker)."""
    return {"host": socket.gethostname(), "pid": os.getpid()}


MAX_DUPLICATES_IN_A_ROW = 20  # proposals of measured configurations before the space counts as exhausted


class DuplicateTrial(Exception):
    """A trial proposed a configuration already measured (the trial is failed, not run)."""


class TrialFailed(Exception):
    """A trial ran but measured nothing usable; it is stored failed with its reason (never a value)."""


# Exceptions ``study.optimize`` must catch: each fails its trial and the search goes on.
CATCH = (DuplicateTrial, TrialFailed)
# Failed trials that do not count as finished: retried (interrupted, lost) or never run (duplicate).
NOT_COUNTED = ("interrupted", "lost", "duplicate")


def counts_as_finished(t: optuna.trial.FrozenTrial) -> bool:
    """A trial that used a run of the budget: complete, pruned, or failed while measuring."""
    if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
        return True
    kind = trial_mark(t).failure_kind
    return t.state == TrialState.FAIL and kind is not None and kind not in NOT_COUNTED


def heartbeat_timing(storage) -> tuple[float, float] | None:
    """``(heartbeat interval, grace period)`` in seconds of a storage whose running trials record
    heartbeats, else None (a journal file, memory).

    An :class:`optuna.storages.RDBStorage` keeps its constructor's ``heartbeat_interval`` and
    ``grace_period`` as attributes (checked against Optuna 5.1.0; ``optuna>=5,<6`` in
    pyproject.toml); Optuna's grace is twice the interval where none was given."""
    interval = getattr(storage, "heartbeat_interval", None) if isinstance(storage, optuna.storages.RDBStorage) else None
    if not interval:
        return None
    return float(interval), float(storage.grace_period or 2 * interval)


def _same_config(measured: list[tuple[int, list]], changes: dict) -> int | None:
    """The first of ``measured`` (:meth:`TuningStudy._measured_configs`) with ``changes``, or None."""
    key = sorted(changes.items())
    return next((number for number, theirs in measured if theirs == key), None)


class TuningStudy:
    """One worker's view of a tuning study.

    Args:
        study: The Optuna study (maximize), opened on its storage.
        spec: How trials run.
        work_dir: Folder for trial records (one sub-folder per trial, reused).
        storage: The storage the study was opened on (:func:`perfscope.tuner.storage.open_storage`),
            through which the trials of killed workers are failed with their reason; None for a
            study in memory, whose trials end with this process.
    """

    def __init__(self, study: optuna.Study, spec: TrialSpec, work_dir: Path, *,
                 storage: optuna.storages.BaseStorage | None = None) -> None:
        self.study = study
        self.storage = storage
        self.spec = spec
        self.work_dir = Path(work_dir)
        self.space: SearchSpace | None = None
        self.baseline: BaselineRun | None = None
        self.duplicates_in_a_row = 0
        self.exhausted: str | None = None
        """Why the search stopped early (None: it did not)."""
        self.cut_short: str | None = None
        """What the time budget left undone, as a line (None: it left nothing undone)."""

    # ------------------------------------------------------------------ setup
    def load_setup(self) -> bool:
        """Read the space and baseline another worker (or an earlier run) stored; False if none."""
        attrs = self.study.user_attrs
        if SPACE_ATTR not in attrs or BASELINE_ATTR not in attrs:
            return False
        self.space = SearchSpace.from_json(attrs[SPACE_ATTR])
        self.baseline = baseline_run(attrs[BASELINE_ATTR])
        return True

    def wait_for_setup(self, timeout_s: float, poll_s: float = 2.0, *, clock=time.monotonic, sleep=time.sleep) -> bool:
        """Wait until another worker stored the space and baseline; False after ``timeout_s``
        (seconds on ``clock``, polled every ``poll_s`` through ``sleep``)."""
        deadline = clock() + timeout_s
        while clock() < deadline:
            if self.load_setup():
                return True
            sleep(poll_s)
        return self.load_setup()

    def store_setup(self, space: SearchSpace, baseline: BaselineRun, guess: dict | None) -> None:
        """Record the space and the baseline as trial 0, and enqueue the rule-based guess."""
        self.space, self.baseline = space, baseline
        self.study.set_user_attr(SPACE_ATTR, space.to_json())
        self.study.add_trial(optuna.trial.create_trial(
            params=space.baseline_params,
            distributions=space.distributions,
            value=baseline.value,
            user_attrs={"role": "baseline", "config": {}, "step_values": baseline.step_values,
                        "unit": baseline.unit, "verdict": baseline.verdict,
                        "fractions": baseline.fractions, "numerics": {"status": "ok", "detail": "the reference"},
                        FEASIBLE_ATTR: True, "worker": worker_id(),
                        "duration_s": baseline.duration_s},
            constraints={CONSTRAINT: 0.0},
        ))
        if guess is not None:
            self.study.enqueue_trial(guess, user_attrs={"role": "guess"}, skip_if_exists=True)
        # Last: its presence tells other workers the setup is complete.
        self.study.set_user_attr(BASELINE_ATTR, msgspec.to_builtins(baseline))

    def loader_settings(self, config) -> dict:
        """``loader_workers`` and ``prefetch_factor`` a configuration runs with (its own settings,
        else the baseline's), as keyword arguments of :func:`perfscope.tuner.trial.run_trial`."""
        loader = run_facts(self.baseline.facts if self.baseline is not None else None).dataloader
        workers, prefetch = (loader.num_workers, loader.prefetch_factor) if loader is not None else (None, None)
        if config is not None and config.num_workers is not None:
            workers = config.num_workers
        if config is not None and config.prefetch_factor is not None:
            prefetch = config.prefetch_factor
        return {"loader_workers": workers, "prefetch_factor": prefetch}

    # ------------------------------------------------------------------ resume
    def requeue_lost_trials(self) -> list[int]:
        """Queue again the trials an interrupted or killed run of this host left unfinished.

        A RUNNING trial whose worker ran on this host and is gone (the run was killed) is failed
        first. Trials failed as ``interrupted`` (Ctrl-C) are queued again once each. Trials of
        other hosts are left to the storage's heartbeat.

        Returns:
            The numbers of the trials queued again.
        """
        self._fail_killed_trials()
        done = set(self.study.user_attrs.get(REQUEUED_ATTR, []))
        queued = []
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
            attrs = trial_mark(t)
            if attrs.failure_kind == "interrupted" and t.number not in done and t.params:
                # Not skip_if_exists: the failed trial itself has these parameters, so Optuna
                # would skip every re-queue (REQUEUED_ATTR already queues each trial once).
                self.study.enqueue_trial(t.params, user_attrs={"role": attrs.role or "search"})
                queued.append(t.number)
        if queued:
            self.study.set_user_attr(REQUEUED_ATTR, sorted(done | set(queued)))
        return queued

    def _fail_killed_trials(self) -> None:
        """Fail (kind ``interrupted``) the running trials of this host whose worker process is gone."""
        if self.storage is None:
            return
        host = socket.gethostname()
        study_id = None
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            worker = trial_mark(t).worker
            if worker is not None and worker.host == host and not pid_alive(worker.pid or 0):
                study_id = self.storage.get_study_id_from_name(self.study.study_name) if study_id is None else study_id
                trial_id = self.storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
                # The reason first: a finished trial takes no more attributes.
                self.storage.set_trial_user_attr(trial_id, "failure", {"kind": "interrupted", "reason": "its worker was killed"})
                self.storage.set_trial_state_values(trial_id, TrialState.FAIL)

    def fail_stale_trials(self) -> list[int]:
        """Fail the running trials whose worker stopped sending heartbeats (killed, its machine
        lost) and queue their configurations again once (the storage's retry callback), through
        :func:`optuna.storages.fail_stale_trials`. SQL storages only: a journal file has no heartbeat.

        Optuna does this when a worker starts a trial; this also does it where none starts (the
        search's end), so a dead worker's trial is not left RUNNING for ever. Such a trial has no
        ``failure`` of its own: its record reads it as lost (:mod:`perfscope.tuner.record`).

        Returns:
            The numbers of the trials failed.
        """
        if heartbeat_timing(self.storage) is None:
            return []
        running = {t.number for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        if not running:
            return []
        with warnings.catch_warnings():  # "experimental" since Optuna 2.9
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)
        # failed meanwhile with neither a failure of ours nor an error Optuna caught: the heartbeat check's
        return sorted(t.number for t in self.study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
                      if t.number in running and trial_mark(t).failure is None and "fail_reason" not in t.system_attrs)

    def settle_running_trials(self, *, say=print, clock=time.monotonic, sleep=time.sleep) -> list[int]:
        """At the end of this worker's search: fail the trials of workers that died, also those
        that died less than the storage's grace period ago (:meth:`fail_stale_trials` alone would
        leave them RUNNING, with no worker left to notice). Waits while other workers' trials are
        RUNNING, at most the grace period plus one heartbeat interval: a worker dead when the wait
        began is stale by then; a trial still RUNNING after it has a live worker, which finishes it.

        Args:
            say: Prints the one line said before waiting.

        Returns:
            The numbers of the trials failed.
        """
        timing = heartbeat_timing(self.storage)
        if timing is None:
            return []
        interval, grace = timing
        wait_s = grace + interval
        deadline = clock() + wait_s
        failed: list[int] = []
        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if running:
            say(f"perfscope: {len(running)} trial(s) of other workers still running: waiting up to {wait_s:.0f} s for "
                "them to end or to be found lost (their workers' heartbeats)")
        while True:
            failed += self.fail_stale_trials()
            if not self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) or clock() >= deadline:
                return failed
            sleep(max(0.1, min(interval, deadline - clock())))

    # ------------------------------------------------------------------ trials
    def finished_count(self) -> int:
        """Trials that count towards the study's target (:func:`counts_as_finished`), baseline included."""
        return sum(map(counts_as_finished, self.study.get_trials(deepcopy=False)))

    def objective(self, trial: optuna.Trial) -> float:
        """Run one trial; returns its value.

        Raises:
            TrialFailed: it measured nothing usable (stored failed, with its reason).
            optuna.TrialPruned: the pruner stopped it.
            KeyboardInterrupt: Ctrl-C (the trial is marked ``interrupted`` and re-queued later).
        """
        assert self.space is not None and self.baseline is not None
        trial.set_user_attr("worker", worker_id())
        if "failure" in trial.user_attrs:  # a re-queued trial inherits the failure of the one it retries
            trial.set_user_attr("failure", None)
        if "role" not in trial.user_attrs:
            trial.set_user_attr("role", "search")
        try:
            return self._measure(trial)
        except KeyboardInterrupt:
            # Wherever Ctrl-C lands (the run, its analysis, a storage write), the trial is
            # interrupted, not crashed: a re-run queues it again.
            trial.set_user_attr("failure", {"kind": "interrupted", "reason": "stopped by Ctrl-C"})
            raise

    def _measure(self, trial: optuna.Trial) -> float:
        params = self.space.suggest(trial)
        config = self.space.to_config(params)
        trial.set_user_attr("config", config.changes())
        twin = self.same_config_trial(trial.number, config.changes())
        if twin is not None:
            # Samplers propose a configuration again on small discrete spaces: skip it rather
            # than spend a run (and a trial of the budget) measuring it twice.
            # The next trial gets a configuration not measured yet, drawn at random from the space.
            trial.set_user_attr("failure", {"kind": "duplicate", "reason": f"same configuration as trial {twin}"})
            self.duplicates_in_a_row += 1
            fresh = self.unmeasured_params(seed=trial.number)
            if fresh is None or self.duplicates_in_a_row >= MAX_DUPLICATES_IN_A_ROW:
                running = [t.number for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                           if t.number != trial.number]
                if fresh is not None:
                    self.exhausted = "the sampler kept proposing configurations already measured"
                else:
                    self.exhausted = "every configuration of the space has been measured" + (
                        f" or is being measured (trial(s) {', '.join(map(str, running))} running)" if running else "")
                self.study.stop()  # (nearly) every configuration has been measured
            else:
                self.study.enqueue_trial(fresh, user_attrs={"role": "search"})
            raise DuplicateTrial(twin)
        self.duplicates_in_a_row = 0

        def report(index: int, running_median: float) -> None:
            trial.report(running_median, index)
            if trial.should_prune():
                raise Pruned

        outcome = run_configuration(self.spec, config, self.work_dir / f"trial-{trial.number}", on_step=report,
                                    **self.loader_settings(config))
        trial.set_user_attr("step_values", outcome.step_values)
        trial.set_user_attr("unit", outcome.unit)
        trial.set_user_attr("duration_s", round(outcome.duration_s, 3))
        trial.set_user_attr("window", outcome.window)  # its noise: the RSE of its throughput
        trial.set_user_attr("threads", (outcome.facts or {}).get("threads"))
        if outcome.status == "pruned":
            trial.set_user_attr(FEASIBLE_ATTR, True)
            trial.set_constraint(CONSTRAINT, 0.0)
            raise optuna.TrialPruned(outcome.reason)
        return self.record_outcome(trial, outcome)

    def unmeasured_params(self, seed: int, attempts: int = 500) -> dict | None:
        """Parameters of a configuration no trial has measured yet (random draws), or None."""
        rng = random.Random(seed)
        measured = self._measured_configs(-1)  # read once: the draws are checked against it
        for _ in range(attempts):
            params = self.space.sample(rng)
            if _same_config(measured, self.space.to_config(params).changes()) is None:
                return params
        return None

    def same_config_trial(self, number: int, changes: dict) -> int | None:
        """A finished (or failed while measuring) or running trial, other than ``number``, with the
        same configuration."""
        return _same_config(self._measured_configs(number), changes)

    def _measured_configs(self, number: int) -> list[tuple[int, list]]:
        """``(trial number, its changes sorted)`` of the finished (or failed while measuring) and
        running trials other than ``number``, in trial order."""
        return [(t.number, sorted(trial_mark(t).changes.items())) for t in self.study.get_trials(deepcopy=False)
                if t.number != number and (t.state == TrialState.RUNNING or counts_as_finished(t))]

    def _batch_ratio(self, trial: optuna.Trial) -> float:
        """The trial's batch size over the baseline's (1 when it keeps the script's)."""
        new = trial_mark(trial).changes.get("batch_size")
        loader = run_facts(self.baseline.facts).dataloader
        old = loader.batch_size if loader is not None else None
        return new / old if new and old else 1.0

    def record_outcome(self, trial: optuna.Trial, outcome: TrialOutcome) -> float:
        """Store a finished trial's verdict, numerics and feasibility; returns its value.

        Raises:
            TrialFailed: the trial failed, or measured no value (after storing why).
        """
        verdict, fractions, summary = trial_verdict(outcome)
        cleanup_traces(outcome)
        trial.set_user_attr("verdict", verdict)
        trial.set_user_attr("fractions", fractions)
        trial.set_user_attr("memory", memory_of(summary))
        failure = None if outcome.ok else {"kind": outcome.status, "reason": outcome.reason}
        if outcome.ok:
            # The same steps in both (trials with DataLoader workers warm up longer).
            first, last = self.spec.warmup_steps, self.spec.warmup_steps + self.spec.measure_steps
            numerics = check_losses(*at_same_samples(self.baseline.losses, outcome.losses, first, last,
                                                     self._batch_ratio(trial)))
            trial.set_user_attr("numerics", numerics.to_dict())
            if numerics.unsafe:
                failure = {"kind": "unsafe", "reason": numerics.detail}
        feasible = failure is None
        trial.set_user_attr("failure", failure)
        trial.set_user_attr(FEASIBLE_ATTR, feasible)
        trial.set_constraint(CONSTRAINT, 0.0 if feasible else 1.0)
        if failure is not None and failure["kind"] != "unsafe":
            raise TrialFailed(f"{failure['kind']}: {failure['reason']}")
        if outcome.value is None or not outcome.value > 0:  # run_trial fails these; never store a non-value
            failure = {"kind": "unmeasured", "reason": "the measured window held no samples"}
            trial.set_user_attr("failure", failure)
            trial.set_user_attr(FEASIBLE_ATTR, False)
            raise TrialFailed(f"unmeasured: {failure['reason']}")
        return float(outcome.value)

    def feasible_trials(self) -> list[optuna.trial.FrozenTrial]:
        """Complete feasible trials, best first."""
        trials = [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                  if trial_mark(t).feasible and t.value is not None]
        return sorted(trials, key=lambda t: -t.value)
