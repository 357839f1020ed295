"""Profile a multi-process job through PyTorch's own launcher (torchrun).

``collect(nproc_per_node=N)`` starts::

    python -m torch.distributed.run --standalone --nproc-per-node N \\
        -m perfscope.collect.worker <options> -- SCRIPT ARGS...

(with ``nodes``, a :class:`~perfscope.collect.nodes.NodeLaunch`, ``--nnodes --node-rank
--master-addr --master-port`` in place of ``--standalone``: this node's share of the job)

under a keeper (:mod:`perfscope.process.keeper`) in a new session, waits for
it, and gathers the ranks' trace files. On Ctrl-C, SIGTERM or any error while
waiting, the keeper is told to stop: the launcher gets SIGTERM (it stops the
ranks and their DataLoader workers) and, after a grace period, every process
the job started is killed. If perfscope itself is killed (SIGKILL included),
the kernel tells the keeper, which does the same: nothing is left behind.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

from perfscope.atomic import RecordFileError, read_bounded
from perfscope.collect import traces
from perfscope.process import keeper
from perfscope.process.group import child_env, signal_group  # noqa: F401 - re-exported
from perfscope.collect.result import CollectResult, build_run_info, utc_now_iso
from perfscope.collect.nodes import NodeLaunch
from perfscope.collect.schedule import ProfileSchedule
from perfscope.runtime.config import config_env_of
from perfscope.collect.script import check_script
from perfscope.collect.worker import worker_argv

_INTERRUPTED_EXIT_CODE = 130
# Seconds the launcher gets to stop its ranks after SIGTERM before SIGKILL;
# longer than torchrun's own 30 s grace for ranks that ignore SIGTERM.
_TERMINATE_GRACE_S = 40.0


def launch_workers(
    script: str | os.PathLike,
    script_args: Sequence[str],
    *,
    out_dir: pathlib.Path,
    schedule: ProfileSchedule,
    nproc_per_node: int,
    config: str | os.PathLike | None = None,
    nodes: NodeLaunch | None = None,
) -> CollectResult:
    """Run ``nproc_per_node`` profiled ranks of ``script`` on this node.

    Args:
        script: Path to the script.
        script_args: Its arguments.
        out_dir: Output directory; traces go to ``<out_dir>/traces``.
        schedule: Profiling window and stop rule (the same on every rank).
        nproc_per_node: Number of ranks to start (>= 1).
        config: Path of an acceleration configuration, or None: every rank runs with
            ``$PERFSCOPE_CONFIG`` set to it and applies its zero-code-change subset; run_info
            records ``config`` and rank 0's ``config_applied``.
        nodes: This node's part of a multi-node job, or None for a job of this node alone.

    Returns:
        The result: ``exit_code`` is the launcher's (130 after Ctrl-C),
        ``steps_seen`` and ``stopped_early`` are this node's first rank's, ``error`` the first
        failing rank's; ``trace_files`` are the rank traces this launch wrote (this node's
        global ranks).

    Raises:
        CollectError: Bad script path or unwritable output directory.
    """
    script = check_script(script)
    from perfscope.collect.session import load_run_config

    accel_config, config_path = load_run_config(config)
    cwd = os.getcwd()
    trace_dir = traces.prepare_trace_dir(out_dir)  # absolute: the ranks may chdir
    # Old traces stay until replaced: a launch that fails early must not lose
    # them. What this launch wrote is told apart by comparing with these.
    old_traces = traces.rank_trace_stamps(trace_dir)
    result_dir = pathlib.Path(tempfile.mkdtemp(prefix="perfscope-ranks-"))
    local_ranks = nodes.ranks(nproc_per_node) if nodes is not None else range(nproc_per_node)
    command = [
        sys.executable, "-m", "torch.distributed.run",
        *(nodes.torchrun_args() if nodes is not None else ["--standalone"]), f"--nproc-per-node={nproc_per_node}",
        "-m", "perfscope.collect.worker",
        *worker_argv(out_dir=trace_dir.parent, result_dir=result_dir, schedule=schedule, config=config_path),
        "--", script, *script_args,
    ]  # fmt: skip

    started_at = utc_now_iso()
    t0 = time.perf_counter()
    try:
        env = child_env(config_env_of(config_path))
        if nodes is not None:
            from perfscope.collect.nodes import NNODES_ENV

            env[NNODES_ENV] = str(nodes.nnodes)
        exit_code, interrupted = _run_group(command, env)
        ranks = _read_rank_results(result_dir, local_ranks)
    finally:
        shutil.rmtree(result_dir, ignore_errors=True)
    duration_s = time.perf_counter() - t0

    rank0 = ranks.get(local_ranks[0], {})
    error = None
    if interrupted:
        error = f"{script} was interrupted (KeyboardInterrupt)"
    elif exit_code != 0:
        failed = [(d.get("ended_at", float("inf")), r, d["error"])
                  for r, d in ranks.items() if d.get("error")]  # fmt: skip
        if failed:
            _, rank, message = min(failed)  # the first failure is the root cause
            error = f"rank {rank}: {message}"
        else:
            error = f"the launcher (torch.distributed.run) exited with status {exit_code}"
    run_info = build_run_info(
        script=script,
        args=script_args,
        schedule=schedule,
        world_size=nproc_per_node * (nodes.nnodes if nodes is not None else 1),
        nproc_per_node=nproc_per_node,
        rank=None,
        cwd=cwd,
        started_at=started_at,
        duration_s=duration_s,
    )
    if nodes is not None:
        run_info.update(nnodes=nodes.nnodes, node_rank=nodes.node_rank, rdzv_endpoint=nodes.rdzv_endpoint)
    if accel_config is not None:
        run_info["config"] = accel_config.to_dict()
        applied = rank0.get("config_applied")
        if applied is None:  # rank 0 died before reporting: what it was to apply
            from perfscope.runtime.patching import plan

            applied = plan(accel_config).to_dict()
        run_info["config_applied"] = applied
    return CollectResult(
        trace_dir=trace_dir,
        trace_files=traces.rank_traces_written_since(trace_dir, local_ranks, old_traces),
        exit_code=exit_code,
        error=error,
        steps_seen=int(rank0.get("steps_seen", 0)),
        stopped_early=bool(rank0.get("stopped_early", False)),
        run_info=run_info,
    )


def _run_group(command: list[str], env: dict[str, str]) -> tuple[int, bool]:
    """Run the launcher in its own session; returns (exit code, interrupted).

    Ctrl-C then reaches only perfscope, which stops the launcher in order:
    torchrun forwards the SIGTERM to each rank's process group (ranks and
    their DataLoader workers) and reaps them. SIGTERM sent to perfscope
    itself (a batch scheduler ending the job) also stops the launcher first.
    """
    proc = subprocess.Popen(keeper.command(command, _TERMINATE_GRACE_S), env=env, start_new_session=True)
    interrupted = False
    previous = _on_sigterm_exit()
    try:
        try:
            exit_code = proc.wait()
            if exit_code < 0:  # killed by a signal: report it as a shell would
                exit_code = 128 - exit_code
        except KeyboardInterrupt:
            interrupted = True
            _terminate(proc)
            exit_code = _INTERRUPTED_EXIT_CODE
    except BaseException as exc:
        _terminate(proc)
        if isinstance(exc, SystemExit) and exc.code == 128 + signal.SIGTERM:
            print("perfscope: terminated (SIGTERM); the job's processes were stopped and nothing was analyzed",
                  file=sys.stderr)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        # Anything left in the launcher's group is a leak: kill it.
        signal_group(proc.pid, signal.SIGKILL)
    return exit_code, interrupted


def _on_sigterm_exit():
    """While waiting, turn SIGTERM into SystemExit so the launcher is stopped too."""
    if threading.current_thread() is not threading.main_thread():
        return None  # signal handlers can only be set from the main thread

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, handler)


def _terminate(proc: subprocess.Popen) -> None:
    # SIGTERM to the keeper: the launcher gets it and shuts its ranks down
    # itself (SIGTERM to each rank's group, SIGKILL after 30 s); the keeper
    # then kills whatever is left. Ranks also die with the launcher if it has
    # to be killed (the worker sets PR_SET_PDEATHSIG).
    try:
        keeper.stop(proc, _TERMINATE_GRACE_S)
    except KeyboardInterrupt:
        # A second Ctrl-C from a user who will not wait for ranks that ignore
        # SIGTERM: kill now. Swallowing that Ctrl-C keeps the interrupted
        # run's result (exit code 130, traces written).
        keeper.kill_tree(proc.pid)
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait()


def _read_rank_results(result_dir: pathlib.Path, ranks: range) -> dict[int, dict]:
    results = {}
    for rank in ranks:
        try:
            results[rank] = json.loads(read_bounded(result_dir / f"rank{rank}.json"))
        except (OSError, ValueError, RecordFileError):
            continue  # the rank died before reporting (killed, os._exit, ...)
    return results
