"""``perfscope merge OUT_DIR_OR_TRACES``: the ranks' traces in one file for Perfetto."""

from __future__ import annotations

from pathlib import Path

from perfscope.cli.args import out_path
from perfscope.errors import PerfscopeError
from perfscope.text import safe


def add_merge_parser(sub) -> None:
    """Add ``merge`` to the ``perfscope`` sub-commands."""
    m = sub.add_parser(
        "merge",
        help="put every rank's trace in one file on one clock, for Perfetto or chrome://tracing",
        description="Merge the traces of a run (an output directory, its traces/ folder, or trace files) into one "
        "Chrome-trace file: each rank's processes named and ordered by rank, clocks moved onto one base (and the "
        "node clock offsets the run's summary.json proves taken out). Writes merged.perfscope-view.json.gz into "
        "the output directory given (or the one a traces/ folder belongs to), else into a new perfscope-out/merge-* "
        "folder, or to --out; never into a folder of traces by default. Open it at ui.perfetto.dev. perfscope "
        "analyze leaves that file out. See docs/report.md (Viewers).",
    )
    m.add_argument("paths", nargs="+", metavar="PATH", help="output directory, traces folder, or trace files")
    m.add_argument("--out", type=out_path, default=None, metavar="FILE", help="the merged file to write")
    m.add_argument("--force", action="store_true",
                   help="replace --out even when it is not a view perfscope merge wrote")


def _node_offsets(folder: Path) -> dict[int, float]:
    """rank -> µs to take out, from a summary.json beside the traces (``details.nodes``)."""
    from perfscope.record import load_summary
    from perfscope.record.view import record_of

    for candidate in (folder / "summary.json", folder.parent / "summary.json"):
        if candidate.is_file():
            try:
                details = record_of(load_summary(candidate)).details
            except PerfscopeError:
                return {}
            nodes = details.nodes if details is not None else None
            return _offsets_by_rank((nodes.nodes if nodes is not None else None) or [])
    return {}


def _offsets_by_rank(nodes: list) -> dict[int, float]:
    """rank -> µs of its node's clock offset, for the nodes (``details.nodes.nodes``, NodeRow structs) with one."""
    return {r: n.clock_offset_us for n in nodes if n.clock_offset_us for r in n.ranks or [] if r is not None}


def _recorded_traces(out_dir: Path) -> list[Path]:
    """The trace files an output directory's summary.json was made from, where they still are."""
    from perfscope.record import load_summary
    from perfscope.record.view import record_of

    found = []
    for t in record_of(load_summary(out_dir / "summary.json")).traces or []:
        if t.path is None:
            continue
        recorded = Path(t.path)
        hit = next((p for p in (recorded, out_dir / recorded, out_dir / "traces" / recorded.name) if p.is_file()), None)
        if hit is not None:
            found.append(hit)
    if not found:
        raise PerfscopeError(f"{out_dir}: none of the traces its summary.json was made from are there any more")
    return found


def _is_merged_view(path: Path) -> bool:
    """Whether ``path`` is a file ``perfscope merge`` wrote (its header key), which it may replace."""
    from perfscope.errors import TraceFormatError
    from perfscope.trace.header import MERGED_KEY
    from perfscope.trace.merge import load_trace

    if not path.is_file():
        return False
    try:
        return load_trace(path).get(MERGED_KEY) is not None
    except (TraceFormatError, OSError, AttributeError):
        return False


def _input_traces(paths: list[str]) -> list[Path]:
    """The trace files named by ``paths`` (files, folders of traces, perfscope output folders),
    resolved, each once, in order, an earlier merged view left out."""
    from perfscope.trace import find_trace_files
    from perfscope.trace.merge import MERGED_NAME

    files: list[Path] = []
    for text in paths:
        path = Path(text)
        if path.is_dir() and (path / "traces").is_dir():
            path = path / "traces"
        elif path.is_dir() and (path / "summary.json").is_file():  # perfscope analyze's output: its traces
            files += _recorded_traces(path)
            continue
        files += find_trace_files(path)
    return sorted(dict.fromkeys(p.resolve() for p in files if p.name != MERGED_NAME))


def _output_dir(path: Path) -> Path | None:
    """The perfscope output directory ``path`` is or whose ``traces/`` folder it is; None for
    anything else (a folder of traces, a file)."""
    if path.is_dir() and ((path / "traces").is_dir() or (path / "summary.json").is_file()):
        return path
    if path.is_dir() and path.name == "traces" and (path.parent / "summary.json").is_file():
        return path.parent
    return None


def _default_out(paths: list[str]) -> Path:
    """Where the merged view goes without ``--out``: the output directory the first path names
    (:func:`_output_dir`), else a new ``perfscope-out/merge-<time>`` folder -- never a folder of
    traces, which may be shared, read-only, or read again by ``perfscope analyze``."""
    from perfscope.outputs import output_dir

    found = _output_dir(Path(paths[0]))
    return found if found is not None else output_dir(None, "merge")


def run(args) -> int:
    """Merge, write, say what was done; 0 on success."""
    from perfscope.outputs import checked_output_file
    from perfscope.trace.merge import MERGED_NAME, merge_traces, write_merged

    files = _input_traces(args.paths)
    if args.out is not None:  # refused before anything is read: a bad path is bad input
        checked_output_file(args.out, "--out", files)
    if len(files) < 1:
        raise PerfscopeError("no trace files to merge")
    folder = files[0].parent
    out = checked_output_file(args.out if args.out is not None else _default_out(args.paths) / MERGED_NAME,
                              "--out", files)
    replaced = out.exists()
    if replaced and not args.force and not _is_merged_view(out):
        raise PerfscopeError(f"--out {safe(out)}: exists and is not a view perfscope merge wrote; not replaced "
                             "(give --force to replace it)")
    merged, lines = merge_traces(files, _node_offsets(folder))
    written = write_merged(merged, out)
    for line in lines:
        print(safe(line))
    print(f"{'replaced' if replaced else 'wrote'} {safe(written)}: open it at ui.perfetto.dev (Open trace file)")
    return 0
