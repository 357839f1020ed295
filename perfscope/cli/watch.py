"""``perfscope watch DIR``: follow a profile from another terminal; and the live view of
``perfscope profile`` on a terminal (:class:`LiveView`). The reading is :mod:`perfscope.watch`;
this module draws it, with tqdm's status lines on a terminal and one printed line per change
elsewhere."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from perfscope.cli.args import number
from perfscope.errors import PerfscopeError
from perfscope.text import safe

DEFAULT_INTERVAL_S = 1.0


def add_watch_parser(sub) -> None:
    """Add ``watch`` to the ``perfscope`` sub-commands."""
    w = sub.add_parser(
        "watch",
        help="follow a running (or finished) perfscope profile: step, median step time, phases, per rank",
        description="Follow the profile writing DIR (perfscope profile --out DIR) from another terminal: about once a "
        "second, each rank's step, its steady median step time, the phase split (input, forward, backward, "
        "optimizer, other) and whether the input pipeline holds it up, the slowest rank marked. Reads the run's "
        "traces/rank*.run.jsonl only; ends when the run ends, with its verdict.",
    )
    w.add_argument("dir", metavar="DIR", help="the output directory of a perfscope profile")
    w.add_argument("--interval", type=number(0.1, 60.0, "a number of seconds"), default=DEFAULT_INTERVAL_S,
                   metavar="S", help="seconds between looks (default 1)")


class _Screen:
    """Where the lines go: tqdm status lines on a terminal, printed lines (on change) elsewhere.

    Args:
        tty: Draw status lines (else print each changed line).
        file: The terminal (default standard output).
    """

    def __init__(self, tty: bool, file=None) -> None:
        self.tty = tty
        self.file = file
        self.broken = False  # drawing failed once: pass output through, draw no more
        self._bars: list = []
        self._last: list[str] = []

    def write(self, text: str) -> None:
        """A line of the script's own output, above the status lines."""
        out = self.file or sys.stdout
        if self._bars and not self.broken:
            from tqdm import tqdm

            tqdm.write(text, file=out)
        else:
            out.write(text + "\n")
            out.flush()

    def show(self, lines: list[str]) -> None:
        if lines == self._last or self.broken:
            return
        self._last = lines
        if not self.tty:
            for text in lines:
                print(safe(text), file=self.file or sys.stdout, flush=True)
            return
        import shutil

        from tqdm import tqdm

        # A terminal that reports no size (0 x 0) gets a usual one: tqdm would draw nothing in it.
        size = shutil.get_terminal_size((120, 24))
        while len(self._bars) < len(lines):
            self._bars.append(tqdm(total=None, bar_format="{desc}", position=len(self._bars), leave=True,
                                   file=self.file or sys.stdout, ncols=size.columns,
                                   nrows=max(size.lines, len(lines) + 2)))
        for bar, text in zip(self._bars, lines):
            bar.set_description_str(safe(text), refresh=True)

    def close(self) -> None:
        for bar in self._bars:
            bar.close()
        self._bars = []


def _lines(found) -> list[str]:
    from perfscope.watch import line, slowest

    worst = slowest(found)
    return [line(v, marked=v.rank == worst, ranks=len(found)) for v in found]


def _verdict(out_dir: Path) -> str | None:
    """The finished run's verdict line, from its summary.json (None where it has none)."""
    from perfscope.record import load_summary
    from perfscope.record.view import record_of

    try:
        overall = record_of(load_summary(out_dir / "summary.json")).overall
    except (PerfscopeError, OSError):
        return None
    if overall is None:
        return None
    if not overall.verdict:
        return f"verdict: none ({overall.reason or 'no step could be classified'})"
    ms = f"; step time {overall.step_time_us / 1000:.2f} ms" if overall.step_time_us else ""
    return f"verdict: {overall.verdict}{', provisional' if overall.provisional else ''}{ms} (summary.json in {out_dir})"


def follow(out_dir: Path, *, interval_s: float = DEFAULT_INTERVAL_S, tty: bool | None = None,
           clock=time.monotonic, sleep=time.sleep) -> int:
    """Draw the run writing ``out_dir`` until it ends; returns 0.

    Raises:
        PerfscopeError: ``out_dir`` is not a folder.
    """
    from perfscope.watch import RunFollower, ended, views

    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise PerfscopeError(f"{out_dir}: not a folder (give the --out folder of a perfscope profile)")
    screen = _Screen(sys.stdout.isatty() if tty is None else tty)
    follower = RunFollower(out_dir)
    still_since = clock()
    try:
        while True:
            if follower.poll():
                still_since = clock()
            found = views(follower)
            screen.show(_lines(found) if found else [f"waiting for the first step in {out_dir}/traces ..."])
            if ended(out_dir, follower, clock() - still_since):
                break
            sleep(interval_s)
    finally:
        screen.close()
    verdict = _verdict(out_dir)
    if verdict:
        print(safe(verdict), flush=True)
    return 0


def run(args) -> int:
    """``perfscope watch``."""
    return follow(Path(args.dir), interval_s=args.interval)


class LiveView:
    """The live view of ``perfscope profile`` on a terminal (a context manager around the run).

    The script's own output (file descriptors 1 and 2, inherited by its ranks and workers) is
    passed through a pipe to a thread of this process that prints it above the status lines
    (``tqdm.write``) and, about every ``interval_s``, redraws those from the run's records
    (:mod:`perfscope.watch`): the lines stay at the bottom while the script prints. The training
    thread does nothing for it; the relay thread waits on the pipe and reads a few files a second.
    Whatever goes wrong in the drawing, the thread goes on passing the output through, so the
    script never blocks on a full pipe.

    Args:
        out_dir: The run's output folder.
        interval_s: Seconds between redraws.
    """

    def __init__(self, out_dir: Path, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.out_dir = Path(out_dir)
        self.interval_s = interval_s
        self._saved: tuple[int, int] | None = None
        self._read_fd: int | None = None
        self._thread = None
        self._stop = None
        self._term = None

    def __enter__(self) -> LiveView:
        import threading

        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = (os.dup(1), os.dup(2))
        self._term = os.fdopen(os.dup(self._saved[0]), "w", encoding="utf-8", errors="replace", buffering=1)
        self._read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._relay, name="perfscope-live", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self._saved[0], 1)  # the pipe's last write end here closes: the relay reads its end
        os.dup2(self._saved[1], 2)
        self._stop.set()
        self._thread.join(timeout=10)
        for fd in (*self._saved, self._read_fd):
            os.close(fd)
        self._term.close()

    def _relay(self) -> None:
        import select

        screen = _Screen(True, file=self._term)
        follower = None
        pending, next_look = b"", 0.0
        while True:
            ready, _, _ = select.select([self._read_fd], [], [], 0.2)
            data = os.read(self._read_fd, 65536) if ready else b""
            if ready and not data:
                break  # every writer closed the pipe
            pending += data
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                self._pass(screen, raw.decode("utf-8", "replace").rsplit("\r", 1)[-1])
            if self._stop.is_set() and not data:
                break  # restored; a leftover worker may hold the pipe open: what it had is read
            if time.monotonic() >= next_look:
                next_look = time.monotonic() + self.interval_s
                try:
                    from perfscope.watch import RunFollower, views

                    follower = follower or RunFollower(self.out_dir)
                    follower.poll()
                    found = views(follower)
                    if found:
                        screen.show(_lines(found))
                except Exception:  # noqa: BLE001 - the view is a courtesy: the output must keep flowing
                    screen.broken = True
        if pending:
            self._pass(screen, pending.decode("utf-8", "replace"))
        try:
            screen.close()
        except Exception:  # noqa: BLE001 - a terminal gone by now
            pass

    def _pass(self, screen: _Screen, text: str) -> None:
        """One line of the script's output to the terminal; where drawing fails, as plain bytes,
        and where the terminal is gone, dropped: never left in the pipe for the script to block on."""
        try:
            screen.write(text)
        except Exception:  # noqa: BLE001
            screen.broken = True
            try:
                os.write(self._saved[0], (text + "\n").encode("utf-8", "replace"))
            except OSError:
                pass


def live_view(args, out_dir: Path):
    """The live view for ``perfscope profile`` (:class:`LiveView`) where standard output is a
    terminal, unless ``--no-live`` or ``--json``; a context that does nothing otherwise."""
    import contextlib

    from perfscope import collect

    if args.no_live or args.json or not sys.stdout.isatty() or collect.is_distributed_worker():
        return contextlib.nullcontext()
    return LiveView(out_dir)
