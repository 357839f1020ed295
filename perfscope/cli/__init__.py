"""The ``perfscope`` command: a thin layer over the library.

``perfscope profile SCRIPT [options] [-- script args]``, ``perfscope analyze PATH [options]``,
``perfscope report SUMMARY_OR_OUT_DIR [options]``, ``perfscope diff A B [options]``, and the commands of
their own modules (``tune``, ``forecast``, ``check``); the options are in :mod:`perfscope.cli.parser`.
A user's mistake ends with one line on stderr (``perfscope: error: ...``) and a non-zero exit,
never a traceback.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

from perfscope.cli.args import node_launch
from perfscope.cli.parser import EXIT_USAGE, build_parser
from perfscope.errors import PerfscopeError
from perfscope.outlock import FolderLock
from perfscope.outputs import output_dir, remove_if_empty
from perfscope.redact import redact
from perfscope.text import safe

EXIT_PARTIAL = 3  # outputs written, but some trace files held damage and were left out


def _split_script_args(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def _finish(analysis, out_dir: Path, open_report: bool = False, as_json: bool = False) -> int:
    """Write the outputs, print the table (stdout) -- or, ``as_json``, the answer as one JSON
    document (:mod:`perfscope.record.answer`) -- and the warnings (stderr).

    Returns:
        0, or :data:`EXIT_PARTIAL` when damaged trace files were left out of the analysis.
    """
    from perfscope.console import config_lines, format_summary, format_warnings
    from perfscope.outputs import write_outputs

    summary = analysis.summary()
    paths = write_outputs(summary, out_dir, analysis.tables, analysis.timelines)  # the report reuses the parsed traces
    if as_json:
        from perfscope.record.answer import answer_of, encode

        print(encode(answer_of(summary, paths)))
    else:
        print(format_summary(summary))
        applied = config_lines(summary)
        if applied:
            print("\n" + "\n".join(applied))
        print(f"\nwrote {safe(paths['summary'])} and {safe(paths['report'])}")
    sys.stdout.flush()  # the table first, then the warnings, where both go to one terminal
    for line in format_warnings(summary):
        print(line, file=sys.stderr)
    if open_report:
        _open_in_browser(paths["report"])
    damaged = [s for s in analysis.skipped if s.damaged]
    if damaged:
        files = "1 trace file holds damage and was" if len(damaged) == 1 else f"{len(damaged)} trace files hold damage and were"
        print(f"perfscope: {files} left out (see the warnings above); the outputs describe the others", file=sys.stderr)
        return EXIT_PARTIAL
    return 0


def _open_in_browser(path: Path) -> None:
    """Open a written page in the user's browser; never fails the command (no browser, no display)."""
    import webbrowser

    try:
        opened = webbrowser.open(Path(path).resolve().as_uri())
    except Exception:  # noqa: BLE001 - a missing or broken browser must not fail the analysis
        opened = False
    if not opened:
        print(f"perfscope: could not open a web browser; open {safe(path)} yourself", file=sys.stderr)


def _priced(args) -> dict:
    """``run.price_per_hour`` where ``--price-per-hour`` was given."""
    return {} if args.price_per_hour is None else {"price_per_hour": args.price_per_hour}


def cmd_analyze(args) -> int:
    from perfscope.analysis.run import analyze_files
    from perfscope.heap import map_large_blocks
    from perfscope.trace import find_trace_files

    map_large_blocks()  # freed per-row arrays leave the resident size (perfscope.heap)

    if not args.path:
        raise PerfscopeError("no trace path given")
    path = Path(args.path)
    files = find_trace_files(path)  # validates the input before anything is written
    executor = None
    if args.dask is not None:
        from perfscope.analysis.executors import DaskExecutor

        executor = DaskExecutor(args.dask)  # before anything is written: ExecutorError, one line
    existed = args.out is not None and Path(args.out).exists()
    out = output_dir(args.out, path.name.split(".")[0] or "trace")
    try:
        with FolderLock(out, "perfscope analyze", pid_file=False):  # one run per output directory
            from perfscope.analysis.progress import Progress

            with Progress(files) as progress:
                analysis = analyze_files(files, run_info={"source": str(path), **_priced(args)}, skip_unreadable=path.is_dir(),
                                         jobs=args.jobs, executor=executor, progress=progress)
            return _finish(analysis, out, args.open, args.json)
    except BaseException:
        if not existed:
            remove_if_empty(out)  # no empty directory left behind by a failed analysis (one the user had stays)
        raise
    finally:
        if executor is not None:
            executor.close()


def cmd_profile(args, script_args: list[str]) -> int:
    from perfscope import collect
    from perfscope.analysis.run import analyze_files
    from perfscope.collect.script import check_script

    check_script(args.script)  # before anything is created
    nodes = node_launch(args)
    if args.config is not None:
        _announce_config(args.config)
    out = output_dir(args.out, Path(args.script).stem)
    with _run_lock(args, out):
        schedule = collect.ProfileSchedule(
            skip_first=args.skip_first, warmup=args.warmup, active=args.active, max_steps=args.max_steps,
            extend_s=args.extend_s, modules=args.modules,
        )
        started = time.time()
        from perfscope.cli.watch import live_view

        # --json: the answer alone on stdout, the script's prints go to stderr; on a terminal, the live view
        with _stdout_to_stderr(args.json), live_view(args, out):
            result = collect.collect(args.script, script_args, out_dir=out, schedule=schedule,
                                     nproc_per_node=args.nproc_per_node, config=args.config, nodes=nodes)
        run_info = {**result.run_info, **({"error": result.error} if result.error else {}), "exit_code": result.exit_code,
                    **_priced(args)}
        trace_files = _job_traces(args, result, started)
        if trace_files is None:  # a rank other than 0 under torchrun: rank 0 analyzes
            return result.exit_code
        if not trace_files:
            if args.out is None:
                remove_if_empty(out)  # the default directory was made for this run
            return _nothing_profiled(args, result, run_info)
        if result.error:
            print(f"perfscope: the script failed ({safe(result.error)}); analyzing the steps captured before it did", file=sys.stderr)
        # Only this run's traces: the directory may hold older ones from a run with more ranks. When
        # the script failed, ranks may have stopped at different steps: keep the ones all ranks hold.
        from perfscope.heap import map_large_blocks

        map_large_blocks()  # freed per-row arrays leave the resident size (perfscope.heap)
        analysis = analyze_files(trace_files, run_info=run_info, common_steps_only=result.error is not None)
        status = _finish(analysis, out, args.open, args.json)
        if nodes is not None:
            ranks = nodes.ranks(args.nproc_per_node)
            print(f"node {nodes.node_rank} of {nodes.nnodes}: this summary covers ranks {ranks[0]}-{ranks[-1]}; for the "
                  "whole job, gather every node's output directory under one folder and run `perfscope analyze FOLDER`",
                  file=sys.stderr if args.json else sys.stdout)
        # The outputs now describe this run: rank traces left from an earlier one would contradict them.
        collect.remove_stale_rank_traces(result.trace_dir, trace_files)
    from perfscope.cli.export import export_after

    return export_after(args, out, result.exit_code or status)


@contextlib.contextmanager
def _stdout_to_stderr(on: bool):
    """While the block runs, file descriptor 1 (and ``sys.stdout``) write to standard error, the
    script's ranks and children included (they inherit the descriptor); restored after."""
    if not on:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _run_lock(args, out: Path):
    """One run per output directory; the ranks of a torchrun job share theirs (no lock)."""
    from perfscope import collect

    if args.nproc_per_node is None and collect.is_distributed_worker():
        return contextlib.nullcontext()
    return FolderLock(out, "perfscope profile", pid_file=False)


def _announce_config(path: str) -> None:
    """Check the configuration (ConfigError: one line, exit 2) and say, once per job, what the
    script must call for the knobs that cannot be patched at launch."""
    from perfscope.runtime.config import load_config
    from perfscope.runtime.patching import plan

    line = plan(load_config(path)).needs_accelerate_line()
    if line and os.environ.get("RANK", "0") == "0":  # once per job under torchrun
        print(line, file=sys.stderr)


def _job_traces(args, result, started: float) -> list | None:
    """The traces to analyze: this process's, or under torchrun (no --nproc-per-node) rank 0's
    wait for every rank's of this run; None on the other ranks, which only say what they wrote."""
    from perfscope import collect

    trace_files = list(result.trace_files)
    if args.nproc_per_node is not None or not collect.is_distributed_worker():
        return trace_files
    rank = int(os.environ.get("RANK", "0"))
    if rank != 0:
        print(f"perfscope: rank {rank}: wrote {safe(', '.join(map(str, trace_files))) or 'no trace'}", file=sys.stderr)
        return None
    world = int(os.environ.get("WORLD_SIZE", "1"))
    trace_files = collect.wait_for_rank_traces(result.trace_dir, world, args.rank_wait, newer_than=started)
    if len(trace_files) < world:
        print(f"perfscope: only {len(trace_files)} of {world} rank traces reached {safe(result.trace_dir)}; "
              f"analyzing those (run `perfscope analyze {safe(result.trace_dir)}` once all are there)", file=sys.stderr)
    return trace_files


def _nothing_profiled(args, result, run_info: dict) -> int:
    """The exit status (or PerfscopeError) of a run that left no trace, with why said on stderr."""
    if result.error:
        print(f"perfscope: the script failed before a profiled step was recorded: {safe(result.error)}", file=sys.stderr)
        from perfscope.console_views import oom_lines

        for line in oom_lines(run_info.get("oom")):
            print(f"perfscope: {line}", file=sys.stderr)
        if run_info.get("oom"):
            print(f"perfscope: torch's snapshot for https://pytorch.org/memory_viz: "
                  f"{safe(result.trace_dir)}/oom-rank*.pickle", file=sys.stderr)
        return result.exit_code or 1
    if result.steps_seen == 0 and result.processes_started:
        raise PerfscopeError(
            f"no steps were profiled: the script ran no training step in its own process, and started "
            f"{result.processes_started} other process(es) (multiprocessing / torch.multiprocessing.spawn), "
            "whose steps perfscope cannot see from here; start the ranks with `perfscope profile "
            "--nproc-per-node N` (or torchrun ... -m perfscope profile) instead of spawning them in the script"
        )
    if result.steps_seen == 0 and not result.stopped_early:
        # It ended on its own before training (`-- --help`, a dry run): its exit is the run's.
        print(f"perfscope: {safe(args.script)} exited with status {result.exit_code} before its first training "
              "step; nothing was profiled (a loop without a torch optimizer must call perfscope.step())",
              file=sys.stderr)
        return result.exit_code
    raise PerfscopeError(
        f"no steps were profiled: the script ran {result.steps_seen} steps, but profiling records steps "
        f"{args.skip_first + args.warmup + 1} to {args.skip_first + args.warmup + args.active}; "
        "lower --skip-first/--warmup, or mark steps with perfscope.step() if the loop uses no torch optimizer"
    )


def _check_args(parser, args, unknown: list[str], script_args: list[str]) -> None:
    """What argparse cannot check: --max-steps against the profiling window, options argparse did
    not know, script arguments to a command that runs no script (parser.error: exit 2)."""
    if args.command == "profile" and args.max_steps:
        window = args.skip_first + args.warmup + args.active
        if args.max_steps < window:
            parser.error(f"--max-steps {args.max_steps} would end the script before profiling is done: "
                         f"use 0 (run to the end) or at least --skip-first + --warmup + --active = {window}")
    if unknown:
        where = " (arguments for the script go after `--`)" if args.command in ("profile", "tune") else ""
        parser.error(f"unrecognized arguments: {' '.join(unknown)}{where}")
    if script_args and args.command not in ("profile", "tune"):
        parser.error("arguments after `--` are only for `perfscope profile` and `perfscope tune`")


def _run(args, script_args: list[str]) -> int:
    """The command's own function; its exit status."""
    if args.command == "profile":
        return cmd_profile(args, script_args)
    if args.command in ("report", "diff"):
        from perfscope.cli.saved import cmd_diff, cmd_report

        return (cmd_report if args.command == "report" else cmd_diff)(args, _open_in_browser)
    if args.command == "forecast":
        from perfscope.cli.forecast import run
        from perfscope.cli.saved import load

        return run(args, *load(args.summary))
    if args.command == "check":
        from perfscope.cli.check import run
        from perfscope.cli.saved import load

        return run(args, load)
    if args.command == "merge":
        from perfscope.cli.merge import run

        return run(args)
    if args.command == "watch":
        from perfscope.cli.watch import run

        return run(args)
    if args.command == "export":
        from perfscope.cli.export import run

        return run(args)
    if args.command == "tune":
        from perfscope.cli.tune import cmd_tune

        return cmd_tune(args, script_args, _open_in_browser)
    return cmd_analyze(args)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``perfscope`` command; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    own, script_args = _split_script_args(argv)
    parser = build_parser()
    args, unknown = parser.parse_known_args(own)
    _check_args(parser, args, unknown, script_args)
    args.command_line = ("perfscope", *argv)  # as typed: what a line telling how to run it again shows
    try:
        return _run(args, script_args)
    except PerfscopeError as e:
        print(f"perfscope: error: {safe(redact(str(e)))}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:  # missing or unreadable input files
        print(f"perfscope: error: {safe(e.strerror + ': ' + str(e.filename) if e.filename and e.strerror else e)}",
              file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("perfscope: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug in perfscope, not the user's mistake: one line, traceback on request
        if os.environ.get("PERFSCOPE_DEBUG"):
            raise
        print(f"perfscope: internal error: {type(e).__name__}: {safe(redact(str(e)))} (set PERFSCOPE_DEBUG=1 to see the "
              "traceback, and please report it)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
