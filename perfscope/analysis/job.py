"""Which traces form one job, and which rank each is: checked before anything is compared.

Traces of different jobs (other world sizes), two files claiming one rank and step, or ranks
without step markers beside ranks with them cannot be analyzed as one run; each case is an
:class:`~perfscope.errors.AnalysisError` that names the files, never a silent merge.
"""

from __future__ import annotations

import gzip
import re
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from perfscope.analysis import evidence as ev
from perfscope.errors import AnalysisError

if TYPE_CHECKING:
    from perfscope.analysis.rank_trace import RankTrace


def _file(rt: RankTrace) -> str:
    return rt.table.path.name if rt.table.path is not None else rt.table.worker


# How much of each file's start the prescan reads: Kineto writes distributedInfo among the first keys,
# before traceEvents (a file that has it later is checked after parsing, as before).
HEAD_BYTES = 1 << 20
_DISTRIBUTED = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"world_size"\s*:\s*(\d{1,9})')


def prescan_world_sizes(files: list[Path]) -> None:
    """Stop at the first file whose world size differs from an earlier one's, reading only the
    start of each file (:data:`HEAD_BYTES`), before any is parsed: traces of several jobs in one
    folder cost a glance, not the parse of them all. Files it cannot read or place are left to the
    parse (:func:`check_world_sizes` checks every trace again).

    Raises:
        AnalysisError: two files record different world sizes (naming both).
    """
    first: tuple[int, str] | None = None
    for path in files:
        size = _head_world_size(Path(path))
        if size is None:
            continue
        if first is None:
            first = (size, Path(path).name)
        elif size != first[0]:
            desc = f"{first[1]} has world size {first[0]}, {Path(path).name} has world size {size}"
            raise AnalysisError(f"the traces come from different jobs ({desc}): analyze each job's traces separately")


def _head_world_size(path: Path) -> int | None:
    try:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as f:
            head = f.read(HEAD_BYTES)
    except (OSError, EOFError, zlib.error):
        return None
    m = _DISTRIBUTED.search(head)
    return int(m.group(1)) if m else None


def check_world_sizes(rank_traces: list[RankTrace]) -> None:
    """Every trace that records a world size records the same one.

    Raises:
        AnalysisError: two traces disagree (they come from different jobs).
    """
    sizes: dict[int, str] = {}
    for rt in rank_traces:
        w = rt.table.world_size
        if w is not None:
            sizes.setdefault(w, _file(rt))
    if len(sizes) > 1:
        desc = ", ".join(f"{f} has world size {w}" for w, f in sorted(sizes.items()))
        raise AnalysisError(f"the traces come from different jobs ({desc}): analyze each job's traces separately")


def assign_ranks(rank_traces: list[RankTrace], warnings: list[str]) -> list[int]:
    """Rank of each trace: from ``distributedInfo`` or the file name (its header says which),
    else by worker name order among the ranks no trace claims. Where several traces are compared,
    every rank not taken from ``distributedInfo`` is said in ``warnings``."""
    known = [rt.table.rank for rt in rank_traces]
    workers = sorted({rt.table.worker for rt, r in zip(rank_traces, known) if r is None})
    used = {r for r in known if r is not None}
    free = (r for r in range(len(rank_traces) + len(used)) if r not in used)
    by_worker = {w: next(free) for w in workers}
    ranks = [r if r is not None else by_worker[rt.table.worker] for rt, r in zip(rank_traces, known)]
    if len({rt.table.worker for rt in rank_traces}) > 1:
        for rt, r in zip(rank_traces, ranks):
            if rt.table.rank_source != "distributedInfo":
                how = "taken from the file name" if rt.table.rank_source == "file name" else "given by file name order"
                warnings.append(f"{_file(rt)}: no usable rank in distributedInfo; rank {r} {how}")
    return ranks


def mark_cpu_ranks_of_a_gpu_run(rank_traces: list[RankTrace], warnings: list[str]) -> None:
    """A trace without GPU activity in a run whose other traces have it: its steps are
    incomplete (profiled without CUDA activity, or its GPU events were lost), not a CPU-only
    rank to classify beside GPU ones."""
    if not any(rt.mode == "gpu" for rt in rank_traces):
        return
    why = "this trace holds no GPU activity while the other traces of the run do (profiled without CUDA, or lost)"
    for rt in rank_traces:
        if rt.mode == "cpu":
            warnings.append(f"{_file(rt)}: {why}; its steps get no verdict")
            keep = rt.evidence.status == ev.OK
            rt.evidence.status[keep] = ev.INCOMPLETE
            rt.evidence.reason[keep] = why


def missing_ranks(rank_traces: list[RankTrace], ranks: list[int]) -> list[str]:
    """A note when the job's world size says more ranks ran than were analyzed."""
    world = max((rt.table.world_size for rt in rank_traces if rt.table.world_size), default=None)
    have = sorted(set(ranks))
    if world is None or len(have) >= world:
        return []
    if len(have) == 1:
        return [f"1 of the job's {world} ranks was analyzed (rank {have[0]}): analyze the traces of several ranks to "
                "compare them (stragglers, load imbalance)"]
    shown = ", ".join(map(str, have[:8])) + (", ..." if len(have) > 8 else "")
    return [f"{len(have)} of the job's {world} ranks were analyzed (ranks {shown}): comparisons between ranks, the "
            "straggler among them, cover those only"]


def windows_of_one_worker(rank_traces: list[RankTrace], ranks: list[int]) -> list[str]:
    """A note for each rank read from several files (profiling windows of one process)."""
    files: dict = {}
    for rt, r in zip(rank_traces, ranks):
        files.setdefault(r, []).append(_file(rt))
    return [f"rank {r}: {len(f)} files read as one rank (profiling windows of one process: {', '.join(f[:4])})"
            for r, f in sorted(files.items()) if len(f) > 1]


def check_markers(rank_traces: list[RankTrace], ranks: list[int]) -> None:
    """Either every rank has ``ProfilerStep#`` markers or none has.

    Raises:
        AnalysisError: some have and some have not (steps cannot be matched).
    """
    marked = {rank for rt, rank in zip(rank_traces, ranks) if rt.has_markers}
    unmarked = set(ranks) - marked
    if marked and unmarked:
        raise AnalysisError(
            f"rank {min(unmarked)} has no ProfilerStep# markers but rank {min(marked)} has; "
            "steps cannot be matched across ranks, analyze them separately"
        )


def check_steps(frame: pd.DataFrame, common_steps_only: bool, notes: list[str]) -> pd.DataFrame:
    """Check that ranks hold the same steps; returns the frame (restricted to the common steps
    when ``common_steps_only`` and they differ). ``frame`` has ``rank``, ``step`` and ``file``.

    Raises:
        AnalysisError: one rank's step in two files (naming both), or ranks disagree on steps.
    """
    dup = frame.duplicated(["rank", "step"], keep=False)
    if dup.any():
        first = frame.loc[dup].iloc[0]
        both = frame.loc[dup & (frame["rank"] == first["rank"]) & (frame["step"] == first["step"]), "file"].tolist()
        raise AnalysisError(f"{both[0]} and {both[1]} both hold step {first['step']} of rank {first['rank']}: "
                            "two traces of one rank and step (a copy, or two runs); analyze them separately")
    per_rank = frame.groupby("rank")["step"].apply(lambda s: tuple(sorted(s)))
    if per_rank.nunique() <= 1:
        return frame
    desc = "; ".join(f"rank {r}: steps {_span(v)}" for r, v in per_rank.items())
    common = set.intersection(*(set(v) for v in per_rank))
    if not common_steps_only or not common:
        raise AnalysisError(f"ranks disagree on step numbers ({desc}); profile all ranks with the same schedule or analyze them separately")
    notes.append(f"ranks captured different steps ({desc}); analyzed the {len(common)} steps all ranks hold")
    return frame[frame["step"].isin(common)]


def _span(steps: tuple) -> str:
    return f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else str(steps[0])
