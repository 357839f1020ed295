"""Following a profile while it runs: what ``perfscope watch DIR`` and the live view of ``perfscope
profile`` show, read from the files the run already writes.

The run's ranks append one line per training step to ``DIR/traces/rank*.run.jsonl``
(:mod:`perfscope.record.run_steps`); :class:`RunFollower` reads what each file gained since the last look
(whole lines only: a line being written is read next time) and :func:`rank_view` turns a rank's
steps into what a person watches: the step, the steady median step time, the phase split and the
running class. Nothing here runs in the training process: the view is another process reading
files, so the training thread pays nothing for it.

The run has ended when its ``summary.json`` is newer than every record (the analysis that follows
the script has written it), or when no process holds the folder's lock any more (``perfscope
profile`` holds an ``flock`` on the folder while it runs; Linux lists it in ``/proc/locks``) and
the records have not grown for :data:`QUIET_END_S` seconds.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np

from perfscope.analysis.run_view import PHASES, phase_shares, steady_steps
from perfscope.classes import THRESHOLDS
from perfscope.record.run_steps import SUFFIX, RunStep, decode_lines

# Steps kept per rank for the view: the steady median of the most recent ones (a long run's pace now).
KEEP_STEPS = 2000
# Seconds without growth after which a run whose lock is gone is over.
QUIET_END_S = 3.0
_RANK = re.compile(r"rank(\d+)" + re.escape(SUFFIX) + "$")
_DECODER = msgspec.json.Decoder(RunStep)


@dataclass
class _File:
    path: Path
    offset: int = 0
    partial: bytes = b""
    steps: list[RunStep] = field(default_factory=list)
    total: int = 0


class RunFollower:
    """The whole-run records of a profile's output folder, read incrementally.

    Args:
        out_dir: The folder ``perfscope profile --out`` writes (its ``traces/`` holds the records).
    """

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        self._files: dict[int, _File] = {}
        self.grew = False

    def poll(self) -> bool:
        """Read what every record gained; True when any gained a step."""
        self.grew = False
        for path in sorted((self.out_dir / "traces").glob(f"rank*{SUFFIX}")):
            m = _RANK.search(path.name)
            if m is None:
                continue
            f = self._files.setdefault(int(m.group(1)), _File(path))
            try:
                with open(path, "rb") as fh:
                    size = os.fstat(fh.fileno()).st_size
                    if size < f.offset:  # a new run rewrote the record: start over
                        f.offset, f.partial, f.steps, f.total = 0, b"", [], 0
                    fh.seek(f.offset)
                    data = fh.read(size - f.offset)
            except OSError:
                continue
            f.offset += len(data)
            data = f.partial + data
            cut = data.rfind(b"\n") + 1
            f.partial = data[cut:]
            steps, _ = decode_lines(data[:cut], _DECODER)
            if steps:
                self.grew = True
                f.total += len(steps)
                f.steps = (f.steps + steps)[-KEEP_STEPS:]
        return self.grew

    def ranks(self) -> dict[int, list[RunStep]]:
        """Each rank's most recent steps (at most :data:`KEEP_STEPS`), in step order."""
        return {rank: f.steps for rank, f in sorted(self._files.items())}

    def newest_record_mtime(self) -> float | None:
        """The modification time of the newest record (None: none yet)."""
        times = []
        for f in self._files.values():
            try:
                times.append(f.path.stat().st_mtime)
            except OSError:
                pass
        return max(times) if times else None


@dataclass(frozen=True)
class RankView:
    """What the live view shows of one rank.

    Attributes:
        rank: Its rank; step: the last finished step's number.
        median_s: The steady steps' median wall time (seconds; after start-up, outside the
            profiler's window where there are enough such steps), or None before any.
        shares: Each phase's share of those steps' time (``input``, ``forward``, ``backward``,
            ``optimizer``, ``other``), or None.
        running_class: ``io-bound`` where the input phase reaches io's threshold, else
            ``not input-bound``: which of compute, launch and comm it is, only the profile says.
    """

    rank: int
    step: int
    median_s: float | None
    shares: dict[str, float] | None
    running_class: str


def running_class(shares: dict[str, float] | None) -> str:
    """The class the whole-run record can tell (:data:`perfscope.classes.THRESHOLDS`, io): the
    training thread's DataLoader wait is in it; the rest needs the trace."""
    if not shares:
        return "no steady step yet"
    return "io-bound" if shares.get("input", 0.0) >= THRESHOLDS["io"] else "not input-bound"


def rank_view(rank: int, steps: list[RunStep]) -> RankView | None:
    """The view of one rank's steps (None before its first step)."""
    if not steps:
        return None
    steady = steady_steps(steps)
    seconds = np.array([s.own for s in steady])
    shares = phase_shares(steady)
    return RankView(rank=rank, step=steps[-1].step, median_s=float(np.median(seconds)) if len(seconds) else None,
                    shares=shares, running_class=running_class(shares))


def views(follower: RunFollower) -> list[RankView]:
    """Every rank's view, in rank order."""
    return [v for v in (rank_view(r, s) for r, s in follower.ranks().items()) if v is not None]


def slowest(found: list[RankView]) -> int | None:
    """The rank with the longest median step, where there are several ranks to compare."""
    timed = [v for v in found if v.median_s is not None]
    return max(timed, key=lambda v: v.median_s).rank if len(timed) > 1 else None


# The phases' short names on a status line (a terminal line is 80 columns or so).
SHORT = {"input": "input", "forward": "fwd", "backward": "bwd", "optimizer": "opt", "other": "other"}


def line(view: RankView, *, marked: bool = False, ranks: int = 1) -> str:
    """One rank's line: ``rank 1 step 143 | io-bound | median 55.6 ms | input 87% fwd 9% ...``."""
    head = f"rank {view.rank} " if ranks > 1 else ""
    median = f"median {view.median_s * 1e3:,.1f} ms" if view.median_s is not None else "median -"
    split = " ".join(f"{SHORT[p]} {view.shares[p]:.0%}" for p in PHASES) if view.shares else "phases -"
    return f"{head}step {view.step} | {view.running_class} | {median} | {split}" + (" <- slowest" if marked else "")


def folder_locked(out_dir: Path, locks: Path = Path("/proc/locks")) -> bool | None:
    """Whether a process holds an ``flock`` on ``out_dir`` (a ``perfscope profile`` running there);
    None where the kernel does not list its locks."""
    try:
        st = os.stat(out_dir)
        text = locks.read_text()
    except OSError:
        return None
    for row in text.splitlines():
        fields = row.split()
        if "FLOCK" not in fields:
            continue
        at = fields.index("FLOCK") + 4  # FLOCK ADVISORY WRITE PID MAJ:MIN:INODE ...
        parts = fields[at].split(":") if at < len(fields) else []
        try:
            if len(parts) == 3 and int(parts[2]) == st.st_ino and int(parts[0], 16) == os.major(st.st_dev) \
                    and int(parts[1], 16) == os.minor(st.st_dev):
                return True
        except ValueError:
            continue
    return False


def ended(out_dir: Path, follower: RunFollower, quiet_s: float) -> bool:
    """The run is over (module docstring): its summary is newer than its records, or its lock is
    gone and the records have been still for :data:`QUIET_END_S` seconds (``quiet_s``: seconds
    since they last grew)."""
    newest = follower.newest_record_mtime()
    try:
        summary = (Path(out_dir) / "summary.json").stat().st_mtime
    except OSError:
        summary = None
    if summary is not None and newest is not None and summary >= newest:
        return True
    return quiet_s >= QUIET_END_S and folder_locked(Path(out_dir)) is False
