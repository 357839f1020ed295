"""Profile a script in this process: one rank, one trace file."""

from __future__ import annotations

import contextlib
import os
import pathlib
import time
import warnings
from collections.abc import Iterator, Sequence

from perfscope.collect import traces
from perfscope.collect.errors import CollectError
from perfscope.collect.result import CollectResult, build_run_info, utc_now_iso
from perfscope.collect.schedule import ProfileSchedule
from perfscope.collect.script import check_script, run_script


def import_torch():
    """Import torch, or explain that ``perfscope profile`` needs it.

    Raises:
        CollectError: torch is not installed.
    """
    try:
        import torch
    except ImportError:
        raise CollectError(
            "perfscope profile needs PyTorch >= 2.4 in this environment "
            "(pip install 'perfscope-torch[torch]'); analyzing existing traces does not"
        ) from None
    return torch


def profile_in_process(
    script: str | os.PathLike,
    script_args: Sequence[str],
    *,
    out_dir: pathlib.Path,
    schedule: ProfileSchedule,
    rank: int = 0,
    world_size: int = 1,
    nproc_per_node: int | None = None,
    result_rank: int | None = None,
    config: str | os.PathLike | None = None,
) -> CollectResult:
    """Run ``script`` under the profiler and write ``traces/rank<rank>...``.

    An old trace of this rank is not deleted up front: the new one replaces it
    atomically once written, so a run that fails before its window keeps the
    previous run's trace (it is just not reported in ``trace_files``).

    Args:
        script: Path to the script.
        script_args: Its arguments.
        out_dir: Output directory; traces go to ``<out_dir>/traces``. A
            relative one is taken relative to the current directory now.
        schedule: Profiling window and stop rule.
        rank: This process's rank (names the trace file).
        world_size: Ranks in the job (for run_info).
        nproc_per_node: Recorded in run_info.
        result_rank: ``rank`` recorded in run_info (None for a plain run).
        config: Path of an acceleration configuration (YAML) or None. The script runs with
            ``$PERFSCOPE_CONFIG`` set to its absolute path (what ``perfscope.accelerate`` reads)
            and under :func:`perfscope.runtime.patching.patched`; run_info gets ``config`` (the
            dict) and ``config_applied`` (the patching report).

    Returns:
        The result; ``trace_files`` holds this rank's trace if this run wrote
        one.

    Raises:
        CollectError: Bad script path, unwritable output, torch missing, or the
            trace could not be written.
        ConfigError: An invalid configuration.
    """
    script = check_script(script)
    accel_config, config_path = load_run_config(config)
    torch = import_torch()
    from perfscope.collect.steps import StepTracker  # imports torch

    cwd = os.getcwd()  # before the script, which may chdir
    trace_dir = traces.prepare_trace_dir(out_dir)  # absolute
    trace_path = trace_dir / traces.trace_file_name(rank)
    exporter = traces.TraceExporter(trace_path)

    from perfscope.collect.host import HostStepRecorder, tracing

    from perfscope.collect.children import counting
    from perfscope.collect.guardian import guarded
    from perfscope.collect.one_profiler import only_ours

    from perfscope.collect.job_watch import JobWatch

    from perfscope.collect.telemetry import TelemetrySampler

    from perfscope.collect.window import Window

    # Ranks of one job must stop at the same step: only a process on its own lengthens its window
    # (collect() and the rank worker pass the job's world size, read and checked from torchrun's env).
    window = Window(torch, schedule, records=lambda: prof.steps, extend=world_size == 1)
    ours = build_profiler(torch, schedule, exporter, window=window)
    job = JobWatch()
    telemetry = TelemetrySampler()  # samples nothing until the script has a CUDA device
    # CPU time and memory per step, the rank's node and DDP, GPU telemetry: in the trace header
    from perfscope.collect.flops import FlopStep, target_step

    flops = FlopStep(target_step(schedule.skip_first))  # one start-up step's FLOPs, for the MFU
    from perfscope.collect.modules import ModuleRanges

    # time per nn.Module, where asked for: a range around each module call of the traced steps
    from perfscope.collect.oom import OomWatch

    oom = OomWatch(trace_dir, rank)  # what held the GPU's memory, should an allocation fail
    prof = HostStepRecorder(ours, job.header, telemetry=telemetry, flops=flops,
                            modules=ModuleRanges() if schedule.modules else None, oom=oom)
    # the profiler's and the FLOP counter's steps are slowed by them: not the run's pace
    timer = _run_timer(trace_path, lambda: flops.active or (not tracker.window_done and tracing(ours)))
    tracker = StepTracker(prof, schedule, window, timer)

    started_at = utc_now_iso()
    t0 = time.perf_counter()
    # The job watch first: the configuration's DDP patch finds the script's frame and must stay outermost.
    with job, _applied_config(accel_config, config_path) as patch_report:
        tracker.start()
        try:
            with only_ours(torch, ours), guarded() as guard, counting() as started:
                outcome = run_script(script, list(script_args))
                guard.script_cut = outcome.stopped_early
        finally:
            tracker.close()
            telemetry.stop()
            oom.close()
    if outcome.stopped_early:
        _destroy_process_group(torch)
    duration_s = time.perf_counter() - t0

    if exporter.error is not None:
        raise CollectError(f"could not write trace {trace_path}: {exporter.error}")
    if timer.error is not None:
        warnings.warn(f"perfscope: the whole-run step record is incomplete: {timer.error}", stacklevel=2)
    run_info = build_run_info(
        script=script,
        args=script_args,
        schedule=schedule,
        world_size=world_size,
        nproc_per_node=nproc_per_node,
        rank=result_rank,
        cwd=cwd,
        started_at=started_at,
        duration_s=duration_s,
    )
    extension = window.outcome_dict()
    if extension is not None:
        run_info["window_extension"] = extension
    if oom.record is not None:
        run_info["oom"] = oom.record
    if accel_config is not None:
        run_info["config"] = accel_config.to_dict()
        run_info["config_applied"] = patch_report.to_dict()
    return CollectResult(
        trace_dir=trace_dir,
        trace_files=[trace_path] if exporter.written else [],
        exit_code=outcome.exit_code,
        error=outcome.error,
        steps_seen=tracker.steps_seen,
        stopped_early=outcome.stopped_early,
        run_info=run_info,
        processes_started=started.count,
    )


def _run_timer(trace_path: pathlib.Path, traced):
    """The timer of every step of the run, writing beside the rank's trace (a record a previous
    run left there is removed first: it must not be read as this run's)."""
    from perfscope.collect.run_timer import RunTimer
    from perfscope.record.run_steps import run_steps_path

    path = run_steps_path(trace_path)
    path.unlink(missing_ok=True)  # the directory was just checked writable
    return RunTimer(path, traced)


def build_profiler(torch, schedule: ProfileSchedule, on_trace_ready, window=None):
    """The ``torch.profiler.profile`` a :class:`~perfscope.collect.steps.StepTracker` drives.

    CPU activity, plus CUDA where available; its torch schedule skips one step more than
    ``schedule.skip_first`` (profiler step 0 is the script's setup) and records once.

    Args:
        torch: The torch module (imported by the caller).
        schedule: The profiling window.
        on_trace_ready: Called with the profiler when the window is recorded (a TraceExporter).
        window: A :class:`perfscope.collect.window.Window` to use as the profiler's schedule
            (the same steps, lengthened on a busy machine), or None for torch's own schedule.
    """
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    if window is not None:
        return torch.profiler.profile(activities=activities, schedule=window, on_trace_ready=on_trace_ready)
    with warnings.catch_warnings():
        # warmup=0 is a legitimate choice; torch warns about it on every run.
        warnings.filterwarnings("ignore", message=".*warmup.*")
        torch_schedule = torch.profiler.schedule(
            # +1: profiler step 0 is the script's setup, before the first step.
            skip_first=schedule.skip_first + 1,
            wait=0,
            warmup=schedule.warmup,
            active=schedule.active,
            repeat=1,
        )
    return torch.profiler.profile(activities=activities, schedule=torch_schedule, on_trace_ready=on_trace_ready)


def load_run_config(config: str | os.PathLike | None):
    """(validated AccelConfig, absolute path) of a run's configuration file, or (None, None).

    Raises:
        ConfigError: unreadable file, invalid YAML, unknown keys or bad values.
    """
    if config is None:
        return None, None
    from perfscope.runtime.config import load_config

    path = os.path.abspath(os.fspath(config))  # absolute: the script may chdir
    return load_config(path), path


@contextlib.contextmanager
def config_env(path: str | None) -> Iterator[None]:
    """``$PERFSCOPE_CONFIG`` set to ``path`` for the block (unchanged when None), then restored."""
    from perfscope.runtime.config import CONFIG_ENV

    if path is None:
        yield
        return
    previous = os.environ.get(CONFIG_ENV)
    os.environ[CONFIG_ENV] = path
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(CONFIG_ENV, None)
        else:
            os.environ[CONFIG_ENV] = previous


@contextlib.contextmanager
def _applied_config(accel_config, path: str | None):
    """The zero-code-change patches of ``accel_config`` and its env var, around the script run."""
    if accel_config is None:
        yield None
        return
    from perfscope.runtime.patching import patched

    with config_env(path), patched(accel_config) as report:
        yield report


def _destroy_process_group(torch) -> None:
    # The script was cut off before its own cleanup; a process group left
    # alive makes NCCL warn at exit and can hold the rendezvous port. All ranks
    # stop at the same step, so no collective is in flight.
    dist = torch.distributed
    try:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - cleanup only
        warnings.warn(f"perfscope: could not destroy the process group: {exc}", stacklevel=2)
