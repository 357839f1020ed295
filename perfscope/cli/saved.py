"""``perfscope report`` and ``perfscope diff``: pages drawn from saved output folders, and the
summary loader ``check`` and ``forecast`` share.

Each command takes ``open_in_browser``, the CLI's opener that never fails a command, as
:func:`perfscope.cli.tune.cmd_tune` does.
"""

from __future__ import annotations

import datetime as _dt
import sys
from pathlib import Path

from perfscope.errors import PerfscopeError
from perfscope.outputs import DEFAULT_OUT_ROOT
from perfscope.text import safe, safe_lines


def _summary_path(text: str) -> Path:
    """The summary.json named by a file or an output directory (checked to exist)."""
    path = Path(text)
    if path.is_dir():
        path = path / "summary.json"
        if not path.is_file():
            raise PerfscopeError(f"{text}: directory holds no summary.json (pass a summary.json or an output directory)")
    elif not path.exists():
        raise PerfscopeError(f"{text}: no such file or directory")
    return path


def load(text: str):
    """(path, :class:`~perfscope.record.view.Record`) of the summary a file or an output directory names.

    Raises:
        PerfscopeError: no such summary, a malformed one, or one without its steps or overall sections.
    """
    from perfscope.record import load_summary
    from perfscope.record.view import record_of

    path = _summary_path(text)
    record = record_of(load_summary(path))
    if record.steps is None or record.overall is None:
        raise PerfscopeError(f"{path}: summary lacks its steps or overall sections")
    return path, record


def _check_step(record, step: int) -> None:
    """Refuse ``--step`` where the run has no such step (naming the steps it has)."""
    steps = sorted({s.get("step") for s in record.steps if isinstance(s.get("step"), int)})
    if step not in steps:
        have = f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else (str(steps[0]) if steps else "none")
        raise PerfscopeError(f"--step {step} is not a step of this run (steps {have})")


def _warn_timeline_sources(path, record, stored, stored_problem: str | None, step: int | None) -> None:
    """Warn on stderr where the stored timeline could not be read, and, where the timeline is
    drawn from the traces, of each trace a later run replaced."""
    from perfscope.reports.traces import locate

    if stored_problem:
        print(f"perfscope: warning: {safe(stored_problem)}: the timeline is drawn from the traces", file=sys.stderr)
    if stored is None or not stored.holds(step):
        for replaced in locate(record, path.parent).replaced:
            print(f"perfscope: warning: {safe(replaced)} is no longer the trace {safe(path)} was made from (a later "
                  "run replaced it): its events are left out of the timeline", file=sys.stderr)


def cmd_report(args, open_in_browser) -> int:
    from perfscope.analysis.progress import Stages

    with Stages("report", 3) as stages:
        with stages.stage("reading the summary"):
            path, record = load(args.summary)
        if args.step is not None:
            _check_step(record, args.step)
        out = (args.out if args.out is not None else path.parent / "report.html").resolve()
        if out.is_dir():
            raise PerfscopeError(f"--out {args.out}: is a directory; give the HTML file to write")
        from perfscope.reports import write_report
        from perfscope.reports.bottleneck import timeline_of
        from perfscope.reports.timeline_record import read_beside

        with stages.stage("reading the timeline"):
            stored, stored_problem = read_beside(path, record)
            _warn_timeline_sources(path, record, stored, stored_problem, args.step)
            drawn = timeline_of(record, base_dir=path.parent, step=args.step, stored=stored, stored_problem=stored_problem)
        with stages.stage("drawing the page"):
            written = write_report(record, out, base_dir=path.parent, step=args.step, drawn=drawn)
    print(f"wrote {safe(written)}")
    if args.open:
        open_in_browser(written)
    return 0


def cmd_diff(args, open_in_browser) -> int:
    from perfscope import reports
    from perfscope.analysis.progress import Stages

    with Stages("diff", 3) as stages:
        with stages.stage("reading A"):
            path_a, a = load(args.a)
        with stages.stage("reading B"):
            path_b, b = load(args.b)
        if args.out is not None:
            out = args.out.resolve()
            if out.is_dir():
                raise PerfscopeError(f"--out {args.out}: is a directory; give the HTML file to write")
        else:
            out = (DEFAULT_OUT_ROOT / f"diff-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}.html").resolve()
        # labels escaped before they join a line: a newline in a path must not start a line of its own
        stages.print(safe_lines(reports.text_diff(a, b, safe(args.a), safe(args.b))))
        with stages.stage("drawing the page"):
            written = reports.write_diff(a, b, out, str(args.a), str(args.b))
    print(f"\nwrote {safe(written)}")
    if args.open:
        open_in_browser(written)
    return 0
