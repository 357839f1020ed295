"""One trial: the script in its own process, measured, under a timeout, and never left running.

A trial starts ``python -m perfscope.measure`` (through ``torch.distributed.run`` for
several ranks) in a new session with the trial's configuration in ``$PERFSCOPE_CONFIG``. The
measurement writes one JSON line per finished step and rank (``rank<R>.steps.jsonl``), which this
module reads while the script runs: each new measured step gives the throughput so far to
``on_step`` (the pruner's intermediate value). At the end each rank leaves ``rank<R>.json`` with
its exit status, losses, facts about the run and its trace. Whatever happens -- pruned, timed out,
Ctrl-C, an error here -- the whole process group is stopped (SIGTERM, then SIGKILL) before
:func:`run_trial` returns or raises.

The script's output goes through a pipe into a bounded ``output.log`` (:mod:`perfscope.tuner.output`): a
trial whose output outruns :data:`perfscope.tuner.output.LIMIT_BYTES`, or whose log cannot be written (a
full disk), is stopped and failed with that reason (kind ``output``).

Throughput of measured step ``s``: the samples all ranks fetched in ``s`` divided by the longest
rank's duration of ``s`` (samples/s); steps/s (1 / longest duration) when no batch size is seen.
A trial's value is the throughput of its whole measured window: all its samples (or steps) over
the sum of its step durations. Not the median of the per-step values: N DataLoader workers tend to
deliver N batches at once, so most steps find a batch ready and a few wait for the next burst; the
median step then overstates the throughput by up to N times (measured on examples/io_bound.py with
4 workers: median 2300 samples/s, window 1070 samples/s).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from perfscope.process.group import child_env
from perfscope.runtime.config import CONFIG_ENV, AccelConfig, config_env_of, save_config
from perfscope.text import safe
from perfscope.tuner.outcome import judge_outcome
from perfscope.tuner.output import OutputLog
from perfscope.tuner.procs import MARK_ENV, new_mark, stop_trial, trial_command
from perfscope.measure.protocol import RankResult, read_rank_result
from perfscope.measure.protocol import read_step_lines, steps_path
from perfscope.measure.records import StepReader, drawn_from_queues
from perfscope.tuner.watch import Measured, watch
from perfscope.tuner.trial_spec import (  # noqa: F401 - re-exported: the trial's records
    PRUNED_REASON, Pruned, TrialOutcome, TrialSpec)
from perfscope.tuner.objective import unit_of
from perfscope.tuner.window import measure_steps_for, warmup_steps_for
from perfscope.record.run_facts import run_facts


def measure_command(spec: TrialSpec, record_dir: Path, config_path: str | None, profile_steps: int,
                    launch: list[str] | None = None) -> list[str]:
    """The command line of one trial (the launcher's, for several ranks; ``launch``: torchrun's
    placement of this node in a multi-node trial, instead of ``--standalone``)."""
    own = measure_args(spec, record_dir, config_path, profile_steps)
    if spec.nproc_per_node is None:
        return [sys.executable, *own]
    # torchrun would outlive a killed perfscope: it is exec'd by a process that asked to die with its parent
    return [sys.executable, "-m", "perfscope.process.orphan_guard", "-m", "torch.distributed.run",
            *(launch or ["--standalone"]), f"--nproc-per-node={spec.nproc_per_node}", *own]


def measure_args(spec: TrialSpec, record_dir: Path | str, config_path: str | None, profile_steps: int) -> list[str]:
    """The measurement's own arguments (``-m perfscope.measure ... -- SCRIPT ARGS``)."""
    own = ["-m", "perfscope.measure", "--record-dir", str(record_dir),
           "--warmup-steps", str(spec.warmup_steps), "--measure-steps", str(spec.measure_steps),
           "--profile-steps", str(profile_steps), "--seed", str(spec.seed)]
    if config_path is not None:
        own += ["--config", config_path]
    if spec.objective == "energy":
        own.append("--energy")
    if spec.nproc_per_node is None:  # one process: the warm-up ends once the prefetched batches are drained
        own.append("--drain-prefetch")
        if spec.target_rse is not None:  # ... and the window once its throughput is known well enough
            own += ["--target-rse", repr(float(spec.target_rse)), "--measure-cap", repr(float(spec.measure_cap_s))]
    return [*own, "--", spec.script, *spec.script_args]



def run_trial(
    spec: TrialSpec,
    config: AccelConfig | None,
    work_dir: Path,
    *,
    on_step: Callable[[int, float], None] | None = None,
    profile_steps: int | None = None,
    loader_workers: int | None = None,
    prefetch_factor: int | None = None,
    on_progress: Callable[[float, int], None] | None = None,
) -> TrialOutcome:
    """Run and measure one configuration.

    Args:
        spec: How trials run.
        config: The configuration to apply (None or no changes: the script as it is).
        work_dir: A folder for this trial's records, log and traces (created; emptied first).
        on_step: Called after each measured step (each whole round of DataLoader workers) with
            ``(step index from 0, throughput so far)``; it may raise :class:`Pruned` to stop the trial.
        profile_steps: Overrides ``spec.profile_steps`` (e.g. 0 for confirmation runs).
        loader_workers, prefetch_factor: The DataLoader settings this trial runs with, when
            known: the measured window is a whole number of worker rounds
            (:func:`measure_steps_for`) and, for several ranks, the warm-up has a fixed length that
            drains the prefetched batches (:func:`warmup_steps_for`; one process drains them by
            watching the queue, ``--drain-prefetch``).
        on_progress: Called every :data:`PROGRESS_S` while the trial runs with ``(seconds so far,
            measured steps so far)``, so that a long phase is never silent.

    Returns:
        The :class:`TrialOutcome`; failures of the script are outcomes, not exceptions.

    Raises:
        KeyboardInterrupt: after stopping the trial's processes.
        OSError: the work folder cannot be written.
        perfscope.tuner.board.NodeLost: a node of a multi-node job went away during the trial (after stopping it).
    """
    work_dir = Path(work_dir)
    spec = dataclasses.replace(spec, measure_steps=measure_steps_for(spec.measure_steps, loader_workers),
                               warmup_steps=warmup_steps_for(spec.warmup_steps, loader_workers, prefetch_factor)
                               if spec.nproc_per_node else spec.warmup_steps)
    record_dir, env, mark, command, shared = _set_up(spec, config, work_dir,
                                                     spec.profile_steps if profile_steps is None else profile_steps)
    ranks = spec.nproc_per_node or 1
    measured = Measured([StepReader(steps_path(record_dir, r)) for r in range(ranks)],
                         max(1, loader_workers or 1), on_step, spec.objective)
    started = time.monotonic()
    log = OutputLog(work_dir / "output.log", spec.output_keep_bytes, spec.output_limit_bytes)
    read_end, write_end = os.pipe()
    try:
        try:
            log.start(read_end)
        except OSError as e:  # a full disk: this trial fails, the study goes on
            os.close(read_end)
            return TrialOutcome(status="output", reason=f"the trial's log {log.path} could not be created: "
                                                         f"{e.strerror or e}")
        # Under a keeper: whatever the trial starts ends with it (tuner/procs.py).
        proc = subprocess.Popen(trial_command(command, spec.nproc_per_node is not None), env=env, stdout=write_end,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    except BaseException:
        log.close()
        raise
    finally:
        os.close(write_end)  # the child holds its own copy: EOF once every writer is gone
    try:
        status, reason = watch(proc, measured, log, spec, on_progress, started)
    except Pruned:
        status, reason = "pruned", PRUNED_REASON
    except KeyboardInterrupt:
        stop_trial(proc, spec.nproc_per_node is not None, mark)
        shared = None  # no waiting for the other nodes after Ctrl-C: their ranks fail without ours
        raise
    finally:
        stop_trial(proc, spec.nproc_per_node is not None, mark)
        log.close()
        if shared is not None:
            for line in spec.board.finished(shared):
                print(f"perfscope: {safe(line)}", flush=True)
    if status == "lost":
        from perfscope.tuner.board import NodeLost

        raise NodeLost(f"{reason}; stopped the tuning: the finished trials are kept in the study, run the same "
                       "command on every node to resume")
    if status is None and log.problem is not None:  # e.g. the disk filled while joining the log
        status, reason = "output", log.problem
    outcome = TrialOutcome(status=status or "ok", reason=reason, step_values=measured.final_values(),
                           step_samples=measured.samples, step_seconds=measured.seconds,
                           unit=unit_of(spec.objective, measured.unit), step_energy=measured.energy,
                           objective=spec.objective,
                           duration_s=time.monotonic() - started, exit_code=proc.returncode)
    _read_results(outcome, record_dir, ranks, work_dir / "output.log", spec)
    return outcome


def _set_up(spec: TrialSpec, config: AccelConfig | None, work_dir: Path, profile: int):
    """The trial's folders, environment, process mark, command line and (a job over several
    nodes) its announcement on the board: ``(record_dir, env, mark, command, shared)``."""
    shutil.rmtree(work_dir, ignore_errors=True)
    record_dir = work_dir / "records"
    record_dir.mkdir(parents=True)
    config_path = None
    if config is not None and config.changes():
        config_path = str(save_config(config, work_dir / "config.yaml", only_changes=True).resolve())
    env = child_env(config_env_of(config_path))
    if config_path is None:
        env.pop(CONFIG_ENV, None)  # the baseline runs as the user runs it
    mark = env[MARK_ENV] = new_mark()
    launch = shared = None
    if spec.board is not None:  # tell the other nodes first: their ranks join this trial's rendezvous
        shared = spec.board.announce(config.changes() if config_path else {}, warmup_steps=spec.warmup_steps,
                                     measure_steps=spec.measure_steps, profile_steps=profile, seed=spec.seed,
                                     timeout_s=spec.timeout_s)
        launch = spec.board.launch_args(shared)
        from perfscope.collect.nodes import NNODES_ENV

        env[NNODES_ENV] = str(spec.board.nodes.nnodes)
    return record_dir, env, mark, measure_command(spec, record_dir, config_path, profile, launch), shared


def _batch_size(facts: dict | None) -> int | None:
    """The DataLoader's batch size in a rank's run facts, None when the run did not show it."""
    loader = run_facts(facts).dataloader
    return loader.batch_size if loader is not None else None


def _read_results(outcome: TrialOutcome, record_dir: Path, ranks: int, log: Path, spec: TrialSpec) -> None:
    """Fill ``outcome`` from the ranks' records (:mod:`perfscope.measure.protocol`) and say why it
    failed, where it did."""
    results = {r: res for r in range(ranks) if (res := read_rank_result(record_dir, r)) is not None}
    rank0 = results.get(0)
    if rank0 is not None:  # the window, facts and losses are rank 0's
        outcome.window, outcome.facts, outcome.config_applied, outcome.losses = (
            rank0.window, rank0.facts or {}, rank0.config_applied, list(rank0.losses))
    outcome.trace_files = [Path(r.trace) for r in results.values() if _has_trace(r)]
    outcome.drawn_samples = _drawn_samples(results, record_dir, len(outcome.step_seconds) or spec.measure_steps)
    wait = _data_wait(record_dir)
    if wait is not None:
        outcome.data_wait = wait
    if outcome.status == "ok":
        judge_outcome(outcome, results, rank0, log, spec)


def _has_trace(res: RankResult) -> bool:
    return bool(res.trace) and Path(res.trace).is_file()


def _drawn_samples(results: dict[int, RankResult], record_dir: Path, steps: int) -> int:
    """Samples the ranks' measured steps drew from batches loaded before the window."""
    return sum(drawn_from_queues(steps_path(record_dir, r), _batch_size(res.facts), steps) for r, res in results.items())


def _data_wait(record_dir: Path) -> float | None:
    """Rank 0's share of its measured steps' time spent waiting for data (None without time)."""
    measured = [line for line in read_step_lines(steps_path(record_dir, 0)) if line.measured]
    total = sum(line.seconds for line in measured)
    return sum(line.data_wait_s for line in measured) / total if total > 0 else None


def noise_text(outcome: TrialOutcome) -> str:
    """The measured window in words: ``"±2.1% over 24 steps"`` (or ``"8 steps"`` when not estimated)."""
    w = outcome.window or {}
    steps = len(outcome.step_seconds)
    if outcome.noise is None:
        return f"{steps} steps"
    ended = {"time cap": ", time cap reached", "script ended": ", the script ended first"}.get(w.get("ended_by"), "")
    return f"±{outcome.noise:.1%} over {steps} steps{ended}"


def cleanup_traces(outcome: TrialOutcome) -> None:
    """Remove a trial's trace files once analyzed (GPU traces take tens of MB each)."""
    for path in outcome.trace_files:
        try:
            os.unlink(path)
        except OSError:
            pass
