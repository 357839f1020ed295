"""What a collection run returns, and the environment description it carries."""

from __future__ import annotations

import dataclasses
import datetime
import pathlib
import socket
import sys
from collections.abc import Sequence

from perfscope.collect.schedule import ProfileSchedule


@dataclasses.dataclass(kw_only=True)
class CollectResult:
    """The outcome of :func:`perfscope.collect.collect`.

    Attributes:
        trace_dir: ``<out_dir>/traces``.
        trace_files: Traces written, one per rank, in rank order. Empty when
            the script ended before the active window recorded anything.
        exit_code: The script's exit status (0 when perfscope ended it at
            ``max_steps``; 130 when interrupted with Ctrl-C; with
            ``nproc_per_node`` the launcher's status).
        error: One line describing how the script failed, None if it did not.
        steps_seen: Training steps counted on rank 0 (or in this process).
        stopped_early: True when perfscope ended the script at ``max_steps``.
        run_info: JSON-able description of the run; see :func:`build_run_info`.
        processes_started: Processes the script started with ``multiprocessing`` (DataLoader
            workers left out): where steps are 0, the training may have run in them.
    """

    trace_dir: pathlib.Path
    trace_files: list[pathlib.Path]
    exit_code: int
    error: str | None
    steps_seen: int
    stopped_early: bool
    run_info: dict
    processes_started: int = 0


def utc_now_iso() -> str:
    """The current time as ISO 8601 UTC, e.g. ``2025-01-31T12:00:00.123456+00:00``."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def build_run_info(
    *,
    script: str,
    args: Sequence[str],
    schedule: ProfileSchedule,
    world_size: int,
    nproc_per_node: int | None,
    rank: int | None,
    cwd: str,
    started_at: str,
    duration_s: float,
) -> dict:
    """Describe the run for the report (all values JSON-able).

    Args:
        script: The script path as given.
        args: The script's arguments.
        schedule: The profiling schedule.
        world_size: Number of ranks (1 for a single process).
        nproc_per_node: Processes launched per node, or None when perfscope
            did not launch them (single process / torchrun-started job).
        rank: This process's rank, or None for a single process / launcher.
        cwd: The working directory at launch, read before the script ran
            (a script may ``os.chdir``).
        started_at: ISO 8601 UTC start time.
        duration_s: Wall time of the whole run, in seconds.

    Returns:
        Keys: script, args, cwd, host, python, torch_version, cuda_version
        (None without CUDA), devices (device names, ``["cpu"]`` without
        CUDA), world_size, nproc_per_node, rank, schedule, started_at,
        duration_s.
    """
    import torch

    cuda = torch.cuda.is_available()
    devices = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if cuda
        else ["cpu"]
    )
    return {
        "script": script,
        "args": list(args),
        "cwd": cwd,
        "host": socket.gethostname(),
        "python": sys.version.split()[0],
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "devices": devices,
        "world_size": world_size,
        "nproc_per_node": nproc_per_node,
        "rank": rank,
        "schedule": schedule.to_dict(),
        "started_at": started_at,
        "duration_s": round(duration_s, 3),
    }
