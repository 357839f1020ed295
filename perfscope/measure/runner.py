"""The measurement runner of ``perfscope tune``: time W + K training steps of a script, in-process.

    python -m perfscope.measure --record-dir DIR --warmup-steps W --measure-steps K \\
        [--profile-steps P] [--config PATH] [--seed S] [--drain-prefetch] \\
        [--target-rse R --measure-cap S] -- SCRIPT ARGS...

also as one rank of ``python -m torch.distributed.run ... -m perfscope.measure ...``
(rank ``$RANK``, default 0). The script runs unmodified, as ``perfscope profile`` runs it, and
its steps are found the same way (``docs/collection.md``); Python, NumPy and torch are seeded
with S first and ``--config`` is applied as ``perfscope profile --config`` applies it. Written in
DIR: ``rank<R>.steps.jsonl`` (a line per step as it ends: step, seconds, samples, data_wait_s,
measured, ready, warmup), ``rank<R>.json`` at the end (see :func:`measure_in_process`) and, with
P > 0, ``traces/rank<R>.pt.trace.json.gz`` (steps W+K+2 .. W+K+1+P). The script is ended after
step W+K, or W+K+1+P; the exit status is the script's (0 when perfscope ended it), 2 for bad
options. With ``--drain-prefetch`` W is where the warm-up may end: it goes on while the DataLoader
drains the batches its workers prefetched (``perfscope/measure/warmup.py``), and every
later step moves with it. With ``--target-rse R --measure-cap S`` (one process) K is where the
measured window may end: it goes on while the relative standard error of its throughput is above R,
for at most S seconds of measured steps (``perfscope/measure/window.py``).
"""

from __future__ import annotations

import contextlib
import gc
import os
import pathlib
import random
import sys
import time
from collections.abc import Sequence

import msgspec

from perfscope.collect import traces
from perfscope.collect.errors import CollectError
from perfscope.collect.schedule import MAX_ACTIVE, MAX_STEPS, ProfileSchedule
from perfscope.collect.script import check_script, run_script
from perfscope.errors import OOM_MESSAGE, PerfscopeError
from perfscope.measure import protocol
from perfscope.measure.argv import UsageError, parse_argv
from perfscope.measure.protocol import RankResult, result_path, write_rank_result
from perfscope.text import safe

_PROG = "perfscope.measure"
_REAP_WAIT_S = 5.0


def _energy_counter():
    from perfscope.collect.energy import EnergyProbe

    return EnergyProbe().joules


def measure_in_process(
    script: str | os.PathLike,
    args: Sequence[str],
    *,
    record_dir: str | os.PathLike,
    warmup_steps: int,
    measure_steps: int,
    profile_steps: int = 0,
    config: str | os.PathLike | None = None,
    seed: int = 0,
    rank: int = 0,
    drain_prefetch: bool = False,
    target_rse: float | None = None,
    measure_cap_s: float | None = None,
    energy: bool = False,
) -> dict:
    """Run ``script`` in this process and measure its steps; writes the files described above.

    Args:
        script: Path of the training script.
        args: Its arguments.
        record_dir: Where ``rank<rank>.steps.jsonl``, ``rank<rank>.json`` and ``traces/`` go
            (created; a relative one is taken against the current directory now).
        warmup_steps: W, steps run and timed but not measured (>= 0).
        measure_steps: K, measured steps (>= 1).
        profile_steps: P, steps recorded by the PyTorch profiler after the measured ones, after
            one profiler warm-up step (0: no profiler at all).
        config: Path of a YAML acceleration configuration, applied as ``perfscope profile
            --config`` applies it, or None.
        seed: Seed of Python's ``random``, NumPy and torch before the script runs.
        rank: This process's rank (names the files).
        drain_prefetch: Extend the warm-up beyond W steps while the DataLoader's workers still
            have prefetched batches to drain (at most ``perfscope.measure.warmup.MAX_EXTRA_WARMUP_STEPS``
            more); one process only: ranks that stop at different steps hang in a collective.
        target_rse, measure_cap_s: Both or neither (one process only, as drain_prefetch): measure
            beyond K steps while the relative standard error of the window's throughput is above
            ``target_rse`` (a fraction, in (0, 1]), for at most ``measure_cap_s`` seconds of
            measured steps (``perfscope.measure.window``).
        energy: Read the energy counter at every boundary (``energy_j`` of each step line;
            :meth:`perfscope.collect.energy.EnergyProbe.joules`): ``perfscope tune --objective energy``.

    Each finished step s (a step lasts from one boundary to the next, in seconds of host wall
    time) appends ``{"step", "seconds", "samples", "data_wait_s", "measured"}`` to
    ``rank<rank>.steps.jsonl`` at once: samples sums the leading dimension of the first tensor
    of each batch the script's DataLoader returned in the step (null without a fetch, or when a
    batch holds no tensor); data_wait_s is the time spent in those fetches; measured is
    W < s <= W+K; ready is the count of batches the DataLoader's workers had ready at the step's
    first fetch (null: no workers or no fetch); warm-up steps add ``"warmup": true``, later
    (profiler) steps ``"profiled": true``.

    Returns:
        The dict written to ``rank<rank>.json``: exit_code, error (one line), error_kind (null,
        "oom", "error"), steps_seen, warmup_steps_used (W, or more with drain_prefetch),
        stopped_early, losses (mean loss of each step 1..steps_seen, null where none was seen),
        loss_source ("perfscope.backward",
        "autograd.backward" or null), trace (path or null), config_applied (patch report) and
        facts: torch, cuda, gpu_name, cuda_capability, bf16_supported, cpu_count (cores this
        process may use), world_size, local_world_size, dist_backend, ddp ({bucket_cap_mb
        (MiB), static_graph} of the first DistributedDataParallel, or null), dataloader
        (num_workers, pin_memory, prefetch_factor, persistent_workers, iterable, batch_size of
        the first loader iterated, or null), accelerate ({called, optimizer, loader}), tf32 and
        cudnn_benchmark (as set when the first step began).

    Raises:
        ValueError: a step count out of range.
        CollectError: bad script path, unwritable record folder, torch missing.
        ConfigError: an invalid configuration.
    """
    window = _steady_window(warmup_steps, measure_steps, profile_steps, target_rse, measure_cap_s)
    from perfscope.collect import session

    script = check_script(script)
    accel_config, config_path = session.load_run_config(config)
    torch = session.import_torch()
    from perfscope.measure import hooks
    from perfscope.measure.facts import run_facts
    from perfscope.measure.warmup import window_profiler
    from perfscope.collect.one_profiler import only_ours
    from perfscope.collect.steps import StepTracker

    record_dir = traces.absolute_out_dir(record_dir)  # the script may chdir
    steps_path = protocol.steps_path(record_dir, rank)
    result_file = result_path(record_dir, rank)
    schedule, exporter = _schedule(record_dir, rank, warmup_steps + measure_steps, profile_steps)
    steps_file = _open_steps(record_dir, result_file, steps_path)
    recorder = hooks.Recorder(warmup_steps=warmup_steps, measure_steps=measure_steps,
                              last_step=schedule.window_steps, steps_file=steps_file, drain_prefetch=drain_prefetch,
                              window=window, energy=_energy_counter() if energy else None)
    inner, ours = hooks.NullProfiler(), None
    if exporter is not None:  # its schedule follows the recorder's window wherever the warm-up ends
        from perfscope.collect.host import HostStepRecorder

        ours = window_profiler(torch, recorder, profile_steps, exporter)
        inner = HostStepRecorder(ours)
    tracker = StepTracker(hooks.StepClock(inner, recorder), schedule)
    recorder.on_extend = tracker.delay_window  # one step added to the warm-up

    try:
        # Order matters: our constructor wrappers inside patching's (it looks at its caller's
        # frame); our fetch wrapper outside the tracker's (the boundary falls inside the fetch).
        with recorder.observing(), session._applied_config(accel_config, config_path) as patch_report:
            tracker.start()
            try:
                with recorder.hooks(), only_ours(torch, ours):
                    seed_everything(seed, torch)
                    outcome = run_script(script, list(args))
                # Before patching restores the flags and the script's group may be gone.
                recorder.first_step = recorder.first_step or hooks.backend_flags()
                recorder.dist = recorder.dist or hooks.dist_snapshot()
            finally:
                tracker.close()
            config_applied = patch_report.to_dict() if patch_report is not None else None
    finally:
        steps_file.close()
    if outcome.stopped_early:
        session._destroy_process_group(torch)
    gc.collect()  # the script's DataLoader iterators (held by its frames) stop their workers now

    trace = _written_trace(exporter)
    if recorder.write_error is not None:
        print(safe(f"perfscope: could not write {steps_path}: {recorder.write_error}"), file=sys.stderr)
    from perfscope.measure.losses import loss_means

    losses, loss_source = loss_means(recorder, tracker.steps_seen, torch)
    result = RankResult(
        exit_code=outcome.exit_code, error=outcome.error, error_kind=_error_kind(outcome), steps_seen=tracker.steps_seen,
        warmup_steps_used=recorder.warmup_steps, stopped_early=outcome.stopped_early, losses=losses,
        loss_source=loss_source, trace=trace, config_applied=config_applied, facts=run_facts(torch, recorder),
        window=window.summary(*recorder.measured_steps()) if window is not None else None,
    )
    write_rank_result(record_dir, rank, result)
    return msgspec.to_builtins(result)




def _steady_window(warmup_steps: int, measure_steps: int, profile_steps: int, target_rse: float | None,
                   measure_cap_s: float | None):
    """The measurement window that grows until its throughput is steady (``SteadyWindow``), or None
    for exactly K steps; the step counts checked first.

    Raises:
        ValueError: a step count out of range, or only one of target_rse and measure_cap_s.
    """
    for name, value, minimum, maximum in (("warmup_steps", warmup_steps, 0, MAX_STEPS),
                                          ("measure_steps", measure_steps, 1, MAX_STEPS),
                                          ("profile_steps", profile_steps, 0, MAX_ACTIVE)):
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            raise ValueError(f"{name} must be an integer in {minimum}..{maximum:,}, got {value!r}")
    if (target_rse is None) != (measure_cap_s is None):
        raise ValueError("target_rse and measure_cap_s go together: give both or neither")
    if target_rse is None:
        return None
    from perfscope.measure.window import SteadyWindow

    return SteadyWindow(target_rse=target_rse, cap_s=measure_cap_s, max_steps=MAX_STEPS - warmup_steps)


def _schedule(record_dir: pathlib.Path, rank: int, timed: int, profile_steps: int):
    """The step schedule and the trace exporter (None without profiled steps): steps 1..W+K
    untraced, W+K+1 the profiler's warm-up, then P recorded; or, without a profiler, ended after
    step W+K."""
    if not profile_steps:
        return ProfileSchedule(skip_first=0, warmup=0, active=timed), None
    trace_dir = traces.prepare_trace_dir(record_dir)  # creates record_dir too
    exporter = traces.TraceExporter(trace_dir / traces.trace_file_name(rank))
    return ProfileSchedule(skip_first=timed, warmup=1, active=profile_steps), exporter


def _open_steps(record_dir: pathlib.Path, result_file: pathlib.Path, steps_path: pathlib.Path):
    """The steps file, open for writing; an earlier run's result removed (it must not pass for
    this one's).

    Raises:
        CollectError: the record folder cannot be written.
    """
    try:
        record_dir.mkdir(parents=True, exist_ok=True)
        result_file.unlink(missing_ok=True)
        return open(steps_path, "wb")  # noqa: SIM115 - the caller closes it
    except OSError as exc:
        raise CollectError(f"cannot write to record directory {record_dir}: {exc.strerror or exc}") from None


def _written_trace(exporter) -> str | None:
    """The trace's path where it was written; why not on stderr where it failed."""
    if exporter is None:
        return None
    if exporter.written:
        return str(exporter.path)
    if exporter.error is not None:
        print(safe(f"perfscope: could not write trace {exporter.path}: {exporter.error}"), file=sys.stderr)
    return None


def _error_kind(outcome) -> str | None:
    if outcome.exit_code == 0:
        return None
    return "oom" if outcome.error and OOM_MESSAGE.search(outcome.error) else "error"


def seed_everything(seed: int, torch) -> None:
    """Seed Python's ``random``, NumPy (when installed) and torch (CPU and every CUDA device)."""
    random.seed(seed)
    try:
        import numpy
    except ImportError:
        pass
    else:
        numpy.random.seed(seed)
    torch.manual_seed(seed)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure this process's run of the script; returns the exit status (2: bad options)."""
    # Die with the parent (perfscope tune, or torch.distributed.run for a rank): a tuner killed
    # outright must not leave a trial training on.
    import signal

    from perfscope.process.keeper import die_with_parent

    die_with_parent(signal.SIGKILL)  # exits if the parent died before it took effect
    try:
        options, script, args = parse_argv(sys.argv[1:] if argv is None else argv)
        rank = int(os.environ.get("RANK", "0"))
        if rank < 0:
            raise ValueError
    except UsageError as exc:
        print(f"{_PROG}: error: {safe(exc)}", file=sys.stderr)
        return 2
    except ValueError:
        print(f"{_PROG}: error: environment variable RANK must be an integer >= 0, got "
              f"{os.environ.get('RANK')!r}", file=sys.stderr)
        return 2
    try:
        from perfscope.collect.nodes import check_layout

        check_layout()
        result = measure_in_process(script, args, record_dir=options["record_dir"],
                                    warmup_steps=options["warmup_steps"], measure_steps=options["measure_steps"],
                                    profile_steps=options["profile_steps"], config=options["config"],
                                    seed=options["seed"], rank=rank, drain_prefetch=options["drain_prefetch"],
                                    target_rse=options["target_rse"], measure_cap_s=options["measure_cap_s"],
                                    energy=options["energy"])
    except PerfscopeError as exc:  # a bad script path, config or record folder: nothing ran
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"{_PROG}: error: {safe(message)}", file=sys.stderr)
        _write_failure(pathlib.Path(options["record_dir"]), rank, message)
        return 2
    _reap_workers()
    return int(result["exit_code"])


def _write_failure(record_dir: pathlib.Path, rank: int, message: str) -> None:
    # So the parent reads why, not just a status; best effort (the folder may be the problem).
    with contextlib.suppress(OSError):
        write_rank_result(record_dir, rank, RankResult(exit_code=2, error=message, error_kind="error"))


def _reap_workers() -> None:
    """End the DataLoader worker processes a stopped script left (iterators it still held).

    They are daemonic multiprocessing children; the process must not exit with any alive.
    """
    import multiprocessing

    children = [p for p in multiprocessing.active_children() if p.daemon]
    for child in children:
        child.terminate()
    deadline = time.monotonic() + _REAP_WAIT_S
    for child in children:
        child.join(max(0.0, deadline - time.monotonic()))
        if child.is_alive():
            child.kill()
            child.join(1.0)


if __name__ == "__main__":
    sys.exit(main())
