"""A run's output directory: made (never shared by default), checked writable, given
``summary.json``, ``report.html`` and ``timeline.json`` as one unit, removed again when a run left
it empty."""

from __future__ import annotations

import datetime as _dt
import os
import tempfile
from pathlib import Path

from perfscope.atomic import write_files_atomic
from perfscope.errors import PerfscopeError

DEFAULT_OUT_ROOT = Path("perfscope-out")  # where every command's default output goes


def ensure_writable_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` if needed and check that files can be written in it.

    Raises:
        PerfscopeError: it cannot be created or written (one line saying which and why).
    """
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise PerfscopeError(f"cannot write to output directory {path}: {e.strerror or e}") from None
    return path


def output_dir(explicit: Path | None, name: str) -> Path:
    """The output directory, created: ``explicit`` as given, else a new one under perfscope-out/.

    Absolute, so a script that changes directory still writes where the user looked. A default
    directory is never shared: two runs started in the same second get ``-2``, ``-3``... suffixes.

    Raises:
        PerfscopeError: it cannot be created or written, or 999 directories of that name exist.
    """
    if explicit is not None:
        return ensure_writable_dir(explicit.resolve())
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = (DEFAULT_OUT_ROOT / f"{name}-{stamp}").resolve()
    for n in range(1, 1000):
        candidate = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            candidate.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            continue
        except OSError as e:
            raise PerfscopeError(f"cannot create output directory {candidate}: {e.strerror or e}") from None
        return ensure_writable_dir(candidate)
    raise PerfscopeError(f"too many output directories named {base}-N; pass --out")


def remove_if_empty(out: Path) -> None:
    """Remove an output directory (and its ``traces/``) that a run left empty."""
    for d in (out / "traces", out):
        try:
            d.rmdir()  # only ever removes an empty directory
        except FileNotFoundError:
            continue  # no traces/ (an analysis makes none): the folder itself may still be empty
        except OSError:
            return


def write_outputs(summary: dict, out_dir: str | os.PathLike, tables: dict | None = None,
                  timelines: dict | None = None) -> dict[str, Path]:
    """Write ``summary.json``, ``report.html`` and, when the traces give one, ``timeline.json`` (the
    timeline's drawings, so the report renders again without the traces:
    :mod:`perfscope.reports.timeline_record`) into ``out_dir`` as one unit
    (:func:`perfscope.atomic.write_files_atomic`: all are complete before any replaces an earlier
    file). The timeline uses ``tables`` -- the analysis's trace tables by path -- and their
    ``timelines`` (``Analysis.timelines``), and reads any other trace it needs from disk. An
    earlier ``timeline.json`` there is removed when this run has none.

    Returns:
        The written paths by name (``"summary"``, ``"report"``, ``"timeline"`` when written).

    Raises:
        PerfscopeError: the directory cannot be written, or the files cannot be (a full disk);
            the earlier outputs in it are then unchanged, and the message says so.
    """
    from perfscope.reports import render_report
    from perfscope.reports.bottleneck import timeline_of
    from perfscope.reports.timeline_record import FILE_NAME, TimelineRecord, encode

    out = ensure_writable_dir(out_dir)
    paths = {"summary": out / "summary.json", "report": out / "report.html"}
    drawn = timeline_of(summary, base_dir=out, tables=tables, timelines=timelines)
    html = render_report(summary, base_dir=out, drawn=drawn)
    from perfscope.record import encode as dump_summary  # the record's schema: not for --help or a refused command

    files = {paths["summary"]: dump_summary(summary), paths["report"]: html.encode("utf-8")}
    if isinstance(drawn, TimelineRecord):
        paths["timeline"] = out / FILE_NAME
        files[paths["timeline"]] = encode(drawn)
    try:
        write_files_atomic(files)
        if "timeline" not in paths:
            (out / FILE_NAME).unlink(missing_ok=True)  # an earlier run's drawings are not this summary's
    except OSError as e:
        raise PerfscopeError(f"cannot write the outputs to {out}: {e.strerror or e}; "
                             "any earlier ones there are unchanged") from None
    return paths


def checked_output_file(path: Path, option: str, inputs: list[Path] = ()) -> Path:
    """``path`` as a file a command may write (atomically, by renaming a new file over it).

    Raises:
        PerfscopeError: it is a directory, or exists as anything but a regular file (a device, a
            FIFO, a symbolic link: renaming over it would replace the node, not write into it),
            or it is one of the command's ``inputs`` (writing would destroy what was read).
    """
    path = Path(path)
    if path.is_symlink():
        raise PerfscopeError(f"{option} {path}: is a symbolic link; give the file itself")
    if path.exists():
        if path.is_dir():
            raise PerfscopeError(f"{option} {path}: is a directory; give the file to write")
        if not path.is_file():
            raise PerfscopeError(f"{option} {path}: is not a regular file (a device or a pipe); give a file to write")
        for p in inputs:
            try:
                if path.samefile(p):
                    raise PerfscopeError(f"{option} {path}: is one of the inputs; give another file to write")
            except OSError:
                continue
    return path
