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

The merged file is named :data:`MERGED_NAME`, which ``perfscope analyze`` of a folder leaves out
(:data:`perfscope.trace.reader.NOT_TRACES`): it is a view, not another rank.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson

from perfscope.atomic import write_bytes_atomic
from perfscope.errors import TraceFormatError

MERGED_NAME = "merged.perfscope-view.json.gz"
PID_STRIDE = 1_000_000
_FLOW = frozenset({"s", "t", "f"})


def _load(path: Path) -> dict:
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
    loaded = [(f, _load(f)) for f in files]
    ranks = [_rank(d, i) for i, (_, d) in enumerate(loaded)]
    if len(set(ranks)) != len(ranks):
        dup = sorted({r for r in ranks if ranks.count(r) > 1})
        raise TraceFormatError(f"several traces claim rank {dup[0]}: merge the traces of one run")
    bases = [d.get("baseTimeNanoseconds") if type(d.get("baseTimeNanoseconds")) is int else 0 for _, d in loaded]
    first = bases[0]
    events: list = []
    lines = []
    for (path, data), rank, base in sorted(zip(loaded, ranks, bases), key=lambda x: x[1]):
        shift = (base - first) / 1000.0 - (node_offsets_us or {}).get(rank, 0.0)
        pids: dict = {}
        named = set()
        for e in data["traceEvents"]:
            if not isinstance(e, dict):
                continue
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
        lines.append(f"rank {rank}: {path.name}, {len(data['traceEvents']):,} events, clock moved {shift:+.1f} µs")
    merged = {"traceEvents": events, "baseTimeNanoseconds": first, "displayTimeUnit": "ms",
              "perfscope_merged": {"ranks": sorted(ranks), "files": [str(f) for f in files]}}
    return merged, lines


def write_merged(merged: dict, path: Path) -> Path:
    """Write the merged trace gzipped, atomically."""
    return write_bytes_atomic(path, gzip.compress(orjson.dumps(merged), compresslevel=6))
