"""One rank of a job launched by ``collect(nproc_per_node=N)``.

Run by PyTorch's launcher, never by hand::

    python -m torch.distributed.run --standalone --nproc-per-node N \\
        -m perfscope.collect.worker --out DIR --result-dir TMP \\
        --skip-first 3 --warmup 2 --active 5 --max-steps none -- SCRIPT ARGS...

Each rank profiles itself into ``DIR/traces/rank<RANK>.pt.trace.json.gz``,
writes its outcome as JSON to ``TMP/rank<RANK>.json`` for the parent, and
exits with the script's exit status.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import sys
import time
from collections.abc import Sequence

from perfscope.collect.schedule import ProfileSchedule
from perfscope.process.keeper import die_with_parent
from perfscope.errors import PerfscopeError
from perfscope.text import safe

_OPTIONS = ("--out", "--result-dir", "--skip-first", "--warmup", "--active", "--max-steps", "--config", "--modules")


def worker_argv(
    *,
    out_dir: pathlib.Path,
    result_dir: pathlib.Path,
    schedule: ProfileSchedule,
    config: str | None = None,
) -> list[str]:
    """The worker's options, to be followed by ``--``, the script and its args.

    ``config`` (an absolute path) makes each rank run the script with the configuration's
    zero-code-change subset patched in, as ``profile_in_process(config=...)`` does.
    """
    max_steps = "none" if schedule.max_steps is None else str(schedule.max_steps)
    extra = [] if config is None else ["--config", str(config)]
    return [*extra,
        "--out", str(out_dir),
        "--result-dir", str(result_dir),
        "--skip-first", str(schedule.skip_first),
        "--warmup", str(schedule.warmup),
        "--active", str(schedule.active),
        "--max-steps", max_steps,
        "--modules", "1" if schedule.modules else "0",
    ]  # fmt: skip


def parse_argv(argv: Sequence[str]) -> tuple[dict[str, str], str, list[str]]:
    """Split ``[--opt value]... [--] SCRIPT ARGS...`` without touching ARGS.

    Parsed by hand: argparse would treat the script's own ``--flags`` as ours.

    Returns:
        (options by name without dashes, script, script args).
    """
    argv = list(argv)
    options: dict[str, str] = {}
    while argv and argv[0] in _OPTIONS and len(argv) >= 2:
        options[argv[0][2:].replace("-", "_")] = argv[1]
        argv = argv[2:]
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise SystemExit("perfscope.collect.worker: missing SCRIPT")
    missing = [o for o in ("out", "result_dir") if o not in options]
    if missing:
        raise SystemExit(f"perfscope.collect.worker: missing --{missing[0].replace('_', '-')}")
    return options, argv[0], argv[1:]


def main(argv: Sequence[str] | None = None) -> int:
    """Profile this rank; returns the script's exit status."""
    from perfscope.collect.session import profile_in_process

    # torchrun stops its ranks when it is terminated, but not when it is killed (SIGKILL, OOM
    # killer): without this the ranks would keep training. Exits if the launcher is already gone.
    die_with_parent(signal.SIGKILL)

    options, script, args = parse_argv(sys.argv[1:] if argv is None else argv)
    max_steps = options.get("max_steps", "none")
    schedule = ProfileSchedule(
        skip_first=int(options.get("skip_first", 3)),
        warmup=int(options.get("warmup", 2)),
        active=int(options.get("active", 5)),
        max_steps=None if max_steps == "none" else int(max_steps),
        modules=options.get("modules", "0") == "1",
    )
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    result_file = pathlib.Path(options["result_dir"]) / f"rank{rank}.json"
    # SIGTERM (from the launcher when another rank failed, or from perfscope
    # on Ctrl-C) keeps its default action: a rank blocked in a collective
    # could not run a Python handler anyway, and would hold up the shutdown.
    try:
        from perfscope.collect.nodes import check_layout

        check_layout()
        result = profile_in_process(
            script,
            args,
            out_dir=pathlib.Path(options["out"]),
            schedule=schedule,
            rank=rank,
            world_size=world_size,
            result_rank=rank,
            config=options.get("config"),
        )
    except PerfscopeError as exc:  # CollectError, or a config changed since it was checked
        print(f"perfscope: error: rank {rank}: {safe(exc)}", file=sys.stderr)
        _write_json(result_file, {"exit_code": 2, "error": str(exc), "steps_seen": 0,
                                  "stopped_early": False, "ended_at": time.time()})  # fmt: skip
        return 2
    _write_json(
        result_file,
        {
            "exit_code": result.exit_code,
            "error": result.error,
            "steps_seen": result.steps_seen,
            "stopped_early": result.stopped_early,
            # Lets the parent name the rank that failed first (the root cause;
            # its peers then fail in their collectives).
            "ended_at": time.time(),
            "config_applied": result.run_info.get("config_applied"),
        },
    )
    return result.exit_code


def _write_json(path: pathlib.Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
