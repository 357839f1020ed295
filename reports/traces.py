"""Finding the traces a summary was made from, for the sections that need events (the timeline).

A summary records each trace's path and fingerprint (:mod:`perfscope.fileid`). The report looks
first in the output directory's ``traces/`` folder (where ``perfscope profile`` writes them, and
where a moved output directory still has them), then at the recorded path; a file whose
fingerprint is not the recorded one is another run's and is not used. Only one rank is loaded:
the lowest rank whose traces are found, in full; of up to ``MAX_OTHER_RANKS`` more
(``reports.sections.timeline``) the representative step only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from perfscope.errors import PerfscopeError
from perfscope.fileid import fingerprint
from perfscope.record.schema import TraceEntry
from perfscope.record.view import Record


def _candidates(recorded: str, base_dir: Path | None) -> list[Path]:
    p = Path(recorded)
    out = []
    if base_dir is not None:
        out.append(base_dir / "traces" / p.name)
        if not p.is_absolute():
            out.append(base_dir / p)
    out.append(p)
    return out


@dataclass
class Found:
    """The trace files of the rank the timeline shows, loaded on first use."""

    rank: object = None
    files: list = field(default_factory=list)
    problem: str | None = None
    replaced: list = field(default_factory=list)  # recorded paths whose file is now another one
    tables: dict = field(default_factory=dict)  # already-built tables by resolved path
    timelines: dict = field(default_factory=dict)  # their (StepWindows, partition sets), same keys
    _prepared: list | None = None

    def prepared(self) -> list:
        if self._prepared is None:
            from perfscope.trace.load import read_table
            from perfscope.reports.timeline_data import prepare

            loaded = []
            for f in self.files:
                key = str(Path(f).resolve())
                table = self.tables.get(key)
                if table is None:
                    loaded.append(prepare(read_table(f)))
                else:
                    loaded.append(prepare(table, *self.timelines.get(key, (None, None))))
            self._prepared = loaded
        return self._prepared


def locate(record: Record, base_dir: Path | None) -> Found:
    """The traces of the lowest rank that are still on disk (``problem`` says why when none is)."""
    return locate_ranks(record, base_dir)[0]


def locate_ranks(record: Record, base_dir: Path | None) -> list[Found]:
    """The traces of every rank still on disk, lowest rank first; one :class:`Found` with the
    ``problem`` when none is."""
    by_rank: dict = {}
    missing, replaced = [], []
    for t in record.traces or []:
        if t.path is None:
            continue
        on_disk, hit = _on_disk(t, base_dir)
        if hit is None:
            (replaced if on_disk else missing).append(t.path)
        else:
            by_rank.setdefault(t.rank, []).append(hit)
    if not by_rank:
        return [_none_found(missing, replaced)]
    order = sorted(by_rank, key=lambda r: (not isinstance(r, int), r if isinstance(r, int) else 0))
    return [Found(rank=r, files=by_rank[r], replaced=replaced) for r in order]


def _on_disk(t: TraceEntry, base_dir: Path | None) -> tuple[list[Path], Path | None]:
    """The files at a recorded trace's path, and the one that is the trace analyzed (None when
    none is: a file there that is not the one analyzed, a later run's, must not be drawn as it)."""
    on_disk = [c for c in _candidates(t.path, base_dir) if c.is_file()]
    recorded = t.fingerprint
    return on_disk, next((c for c in on_disk if recorded is None or fingerprint(c) == recorded), None)


def _none_found(missing: list[str], replaced: list[str]) -> Found:
    """Why no trace can be drawn: replaced by a later run's, gone, or never recorded."""
    if replaced:
        return Found(problem=f"{replaced[0]} is no longer the trace this summary was made from (a later run "
                     "replaced it); run `perfscope analyze` on it to see that run", replaced=replaced)
    what = f"{missing[0]} is gone" if missing else "the summary records no trace paths"
    return Found(problem=f"none of the traces were found: {what}")


def load(found: Found, tables: dict | None = None, timelines: dict | None = None) -> Found:
    """Read the traces now, turning a read failure into ``found.problem``.

    ``tables`` (resolved path -> ``TraceTable``) are used instead of reading those files again,
    with their ``timelines`` (resolved path -> ``(StepWindows, partition sets)``) where given.
    """
    if found.problem:
        return found
    found.tables = dict(tables or {})
    found.timelines = dict(timelines or {})
    try:
        found.prepared()
    except (PerfscopeError, OSError, ValueError) as e:
        found.problem = f"reading them failed: {e}"
    return found
