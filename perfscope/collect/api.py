"""``collect()``: the entry point ``perfscope profile`` calls."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence

from perfscope.collect import traces
from perfscope.collect.errors import CollectError
from perfscope.collect.nodes import NodeLaunch
from perfscope.collect.result import CollectResult
from perfscope.collect.schedule import ProfileSchedule


def is_distributed_worker() -> bool:
    """True when this process is one rank of a job started by torchrun.

    torchrun (and most cluster launchers built on it) set ``RANK`` and
    ``WORLD_SIZE``; ``collect()`` then profiles only this rank.

    Raises:
        CollectError: Both are set but not a valid pair: not integers,
            ``WORLD_SIZE < 1``, or ``RANK`` outside ``0 .. WORLD_SIZE-1``
            (a hand-set or stale environment; profiling as some other rank
            would write or wait for the wrong trace files).
    """
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return False
    rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    if world_size < 1:
        raise CollectError(f"environment variable WORLD_SIZE must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise CollectError(
            f"environment variable RANK must be in 0..{world_size - 1} (WORLD_SIZE={world_size}), got {rank}"
        )
    return True


def collect(
    script: str | os.PathLike,
    script_args: Sequence[str],
    *,
    out_dir: pathlib.Path,
    schedule: ProfileSchedule = ProfileSchedule(),
    nproc_per_node: int | None = None,
    config: str | os.PathLike | None = None,
    nodes: NodeLaunch | None = None,
) -> CollectResult:
    """Run a training script under the PyTorch profiler and write its traces.

    Three modes:

    * plain: the script runs in this interpreter as ``python SCRIPT args``
      would; one trace, ``traces/rank0.pt.trace.json.gz``;
    * ``nproc_per_node=N``: N ranks through ``torch.distributed.run
      --standalone``; one trace per rank;
    * inside a torchrun job (``RANK``/``WORLD_SIZE`` set): this rank only,
      into ``traces/rank<RANK>...``. ``collect()`` does not wait for the
      other ranks; on rank 0 the caller does, with
      :func:`perfscope.collect.wait_for_rank_traces` (the CLI's
      ``--rank-wait``).

    Args:
        script: Path to the training script (a ``.py`` file).
        script_args: Arguments passed to the script.
        out_dir: Output directory (created if missing). A relative path is
            taken relative to the current directory at the call, whatever
            directory the script changes to.
        schedule: Which steps to record and when to end the script.
        nproc_per_node: Ranks to launch on this node, or None for a plain run.
        config: Path of an acceleration configuration (YAML; see ``docs/runtime.md``), or
            None. The script (each rank) runs with ``$PERFSCOPE_CONFIG`` set to its absolute
            path, so ``perfscope.accelerate(config=None)`` picks it up, and with the knobs that
            need no code change patched in (:mod:`perfscope.runtime.patching`). The result's
            run_info records ``config`` (the dict) and ``config_applied`` (the patching report).
        nodes: This node's part of a multi-node job (needs ``nproc_per_node``), or None.

    Returns:
        What happened: trace files, exit status, one-line error, steps seen.
        A failing script is reported in the result, not raised.

    Raises:
        CollectError: Bad script path, unwritable output directory, torch not
            installed, invalid ``nproc_per_node``, an invalid torchrun
            environment (see :func:`is_distributed_worker`), or a trace write
            failure.
        ConfigError: An invalid configuration (checked before the script starts).
    """
    out_dir = traces.absolute_out_dir(out_dir)
    if config is not None:
        from perfscope.collect.session import load_run_config

        config = load_run_config(config)[1]  # validated now, passed on as an absolute path
    if nodes is not None and nproc_per_node is None:
        raise CollectError("a multi-node job (--nnodes) needs --nproc-per-node: the ranks to start on this node")
    if nproc_per_node is not None:
        if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int) or nproc_per_node < 1:
            raise CollectError(f"--nproc-per-node must be an integer >= 1, got {nproc_per_node!r}")
        if is_distributed_worker():
            raise CollectError(
                "--nproc-per-node cannot be used inside a job started by torchrun "
                "(RANK is set); run `torchrun ... -m perfscope profile SCRIPT` without it"
            )
        from perfscope.collect.session import import_torch

        import_torch()
        from perfscope.collect.launch import launch_workers

        return launch_workers(
            script, script_args, out_dir=out_dir, schedule=schedule, nproc_per_node=nproc_per_node,
            config=config, nodes=nodes,
        )

    from perfscope.collect.session import profile_in_process

    if not is_distributed_worker():
        return profile_in_process(script, script_args, out_dir=out_dir, schedule=schedule, config=config)

    rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")  # checked above
    local_world = os.environ.get("LOCAL_WORLD_SIZE")
    return profile_in_process(
        script,
        script_args,
        out_dir=out_dir,
        schedule=schedule,
        rank=rank,
        world_size=world_size,
        nproc_per_node=int(local_world) if local_world and local_world.isdigit() else None,
        result_rank=rank,
        config=config,
    )


def _env_int(name: str) -> int:
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        raise CollectError(f"environment variable {name} must be an integer, got {value!r}") from None
