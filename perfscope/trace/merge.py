"""``perfscope merge``: every rank's trace in one Chrome-trace file on one clock, for viewing in
Perfetto or chrome://tracing (which open one file at a time).

- **Clock.** Kineto writes ``ts`` in microseconds relative to ``baseTimeNanoseconds``; each file's
  events are moved onto the first file's base (``ts + (base - first base) / 1000``), and where the
  run's ``summary.json`` proves a node's clock offset (``details.nodes``, ``docs/multinode.md``)
  that offset is taken out too.
- **Processes.** Process ids of different ranks collide (device 0 on every rank, or the same OS
  pid on two nodes): each rank's pids become ``(rank + 1) * PID_STRIDE + k`` (``k`` the pid's
  order of appearance), and its processes are named ``rank R: <name>`` and sorted by rank.
- **Flows** (``ph`` ``s``/``t``/``f``: launch -> kernel arrows) keep their ``id`` per rank as
  ``"R:id"``, so arrows never join events of two ranks.

The merged file is named :data:`MERGED_NAME` and carries the header key ``perfscope_merged``:
``perfscope analyze`` of a folder leaves it out (by name, :data:`perfscope.trace.reader.NOT_TRACES`,
and under any name by that key), and a later merge leaves it out too: it is a view, not a rank.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson

from perfscope.atomic import write_bytes_atomic
from perfscope.errors import TraceFormatError
from perfscope.trace.header import MERGED_KEY

MERGED_NAME = "merged.perfscope-view.json.gz"
PID_STRIDE = 1_000_000
_FLOW = frozenset({"s", "t", "f"})


def load_trace(path: Path) -> dict:
    """One trace file as its JSON object (gunzipped when gzip).

    Raises:
        TraceFormatError: not readable JSON, or no ``traceEvents`` array.
    """
    raw = path.read_bytes()
    try:
        data = orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except (orjson.JSONDecodeError, OSError, EOFError) as e:
        raise TraceFormatError(f"{path}: not a readable trace ({e})") from None
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceFormatError(f"{path}: no traceEvents array")
    return data


def _rank(data: dict, position: int) -> int:
    info = data.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, dict) else None
    return rank if type(rank) is int and rank >= 0 else position


def merge_traces(files: list[Path], node_offsets_us: dict[int, float] | None = None) -> tuple[dict, list[str]]:
    """The merged trace of ``files`` and the lines saying what was done.

    Args:
        files: Trace files (``.json``/``.json.gz``), one per rank.
        node_offsets_us: rank -> clock offset (µs) to take out of that rank's events.

    Raises:
        TraceFormatError: a file is no trace, or two files claim one rank.
    """
    loaded, lines = _rank_traces(files)
    ranks = [_rank(d, i) for i, (_, d) in enumerate(loaded)]
    if len(set(ranks)) != len(ranks):
        dup = sorted({r for r in ranks if ranks.count(r) > 1})
        raise TraceFormatError(f"several traces claim rank {dup[0]}: merge the traces of one run")
    bases = [d.get("baseTimeNanoseconds") if type(d.get("baseTimeNanoseconds")) is int and
             d["baseTimeNanoseconds"] > 0 else None for _, d in loaded]
    first = next((b for b in bases if b is not None), None)
    events: list = []
    for (path, data), rank, base in sorted(zip(loaded, ranks, bases), key=lambda x: x[1]):
        # a file without a base time keeps its times as written: there is nothing to move them by
        shift = ((base - first) / 1000.0 if base is not None and first is not None else 0.0)
        shift -= (node_offsets_us or {}).get(rank, 0.0)
        kept = _add_rank(events, data["traceEvents"], rank, shift)
        dropped = len(data["traceEvents"]) - kept
        moved = f"clock moved {shift:+.1f} µs" if base is not None else "no baseTimeNanoseconds: times kept as written"
        lines.append(f"rank {rank}: {path.name}, {kept:,} events" + (f" ({dropped:,} not events, left out)" if dropped
                                                                       else "") + f", {moved}")
    merged = {"traceEvents": events, "baseTimeNanoseconds": first or 0, "displayTimeUnit": "ms",
              MERGED_KEY: {"ranks": sorted(ranks), "files": [str(f) for f, _ in loaded]}}
    return merged, lines


def _rank_traces(files: list[Path]) -> tuple[list[tuple[Path, dict]], list[str]]:
    """The files' traces, less views an earlier merge wrote (a line says each was left out).

    Raises:
        TraceFormatError: a file is no trace, or only merged views are left.
    """
    loaded, lines = [], []
    for f in files:
        data = load_trace(f)
        if data.get(MERGED_KEY) is not None:  # an earlier merge's view, whatever its name
            lines.append(f"left out {f.name}: a view merged earlier, not a rank's trace")
            continue
        loaded.append((f, data))
    if not loaded:
        raise TraceFormatError("no rank trace to merge (only merged views)")
    return loaded, lines


def _add_rank(events: list, rank_events: list, rank: int, shift: float) -> int:
    """Append one rank's events to ``events``: its processes renumbered and named after the rank,
    times moved by ``shift`` µs, flow ids made the rank's own, its processes sorted in rank order.
    Returns how many of ``rank_events`` were events (objects)."""
    kept = 0
    pids: dict = {}
    named = set()
    for e in rank_events:
        if not isinstance(e, dict):
            continue
        kept += 1
        e = dict(e)
        if "pid" in e:
            key = str(e["pid"])
            e["pid"] = pids.setdefault(key, (rank + 1) * PID_STRIDE + len(pids))
        if isinstance(e.get("ts"), (int, float)) and not isinstance(e.get("ts"), bool):
            e["ts"] = e["ts"] + shift
        if e.get("ph") in _FLOW and "id" in e:
            e["id"] = f"{rank}:{e['id']}"
        if e.get("ph") == "M" and e.get("name") == "process_name" and isinstance(e.get("args"), dict):
            e["args"] = {**e["args"], "name": f"rank {rank}: {e['args'].get('name', '')}"}
            named.add(e.get("pid"))
        if e.get("ph") == "M" and e.get("name") == "process_sort_index":
            continue  # replaced below: ranks in order
        events.append(e)
    for key, pid in pids.items():
        if pid not in named:
            events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"rank {rank}: {key}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
    return kept


def write_merged(merged: dict, path: Path) -> Path:
    """Write the merged trace gzipped, atomically."""
    return write_bytes_atomic(path, gzip.compress(orjson.dumps(merged), compresslevel=6))
