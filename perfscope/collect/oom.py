"""What held the GPU's memory when the script ran out of it.

:class:`OomWatch` is armed at the first step boundary where the script has initialised CUDA
(perfscope never initialises it): it turns on the caching allocator's history
(``torch.cuda.memory._record_memory_history``, at most :data:`MAX_ENTRIES` events, each with the
Python stack that made it) and attaches an out-of-memory observer. When an allocation fails the
observer takes the allocator's snapshot and writes, beside the traces:

- ``oom-rank<R>.json``: the request, the device's memory, and the :data:`LARGEST` largest live
  allocations with the frames that made them (read by ``perfscope profile`` into
  ``run.oom``; plain JSON, validated when read);
- ``oom-rank<R>.pickle``: torch's own snapshot, for ``torch.cuda.memory``'s viewer
  (https://pytorch.org/memory_viz). perfscope never loads it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from perfscope.atomic import write_text_atomic

MAX_ENTRIES = 100_000  # allocator events kept (a ring): the last ones before the failure
LARGEST = 20  # live allocations listed
FRAMES = 6  # frames kept of each allocation's stack (innermost first)


def _cuda():
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    try:
        return cuda if cuda is not None and cuda.is_initialized() else None
    except Exception:  # noqa: BLE001
        return None


def largest_live(snapshot: dict, n: int = LARGEST) -> list[dict]:
    """The ``n`` largest live allocations of an allocator snapshot (``torch.cuda.memory._snapshot``):
    ``bytes``, ``requested_bytes``, ``device`` and ``frames`` (``file:line function``, innermost
    first, at most :data:`FRAMES`)."""
    live = []
    for seg in snapshot.get("segments") or []:
        for block in seg.get("blocks") or []:
            if block.get("state") != "active_allocated":
                continue
            frames = [f"{f.get('filename')}:{f.get('line')} {f.get('name')}" for f in block.get("frames") or []
                      if isinstance(f, dict)][:FRAMES]
            live.append({"bytes": int(block.get("size") or 0), "requested_bytes": int(block.get("requested_size") or 0),
                         "device": seg.get("device"), "frames": frames})
    return sorted(live, key=lambda b: -b["bytes"])[:n]


class OomWatch:
    """See the module docstring.

    Args:
        out_dir: Where the files go (the run's trace folder).
        rank: The rank, for the file names.

    Attributes:
        record: What was written at the failure (the JSON's content), or None.
    """

    def __init__(self, out_dir: Path, rank: int) -> None:
        self.out_dir = Path(out_dir)
        self.rank = rank
        self.armed = False
        self.record: dict | None = None

    def arm(self) -> None:
        """Turn the history and the observer on, once CUDA is in use (a cheap check before)."""
        if self.armed:
            return
        cuda = _cuda()
        if cuda is None:
            return
        self.armed = True
        try:
            cuda.memory._record_memory_history(context="alloc", stacks="python", max_entries=MAX_ENTRIES)
            sys.modules["torch"]._C._cuda_attach_out_of_memory_observer(self._observed)
        except Exception:  # noqa: BLE001 - a torch without them: no record, the run goes on
            return

    def _observed(self, device: int, requested: int, allocated: int, free: int) -> None:
        """The allocator's out-of-memory callback: keep what held the memory (never raises)."""
        if self.record is not None:
            return
        try:
            cuda = sys.modules["torch"].cuda
            snapshot = cuda.memory._snapshot()
            record = {"device": int(device), "requested_bytes": int(requested), "allocated_bytes": int(allocated),
                      "free_bytes": int(free), "reserved_bytes": sum(int(s.get("total_size") or 0)
                                                                     for s in snapshot.get("segments") or []),
                      "largest": largest_live(snapshot)}
            write_text_atomic(self.out_dir / f"oom-rank{self.rank}.json", json.dumps(record))
            cuda.memory._dump_snapshot(str(self.out_dir / f"oom-rank{self.rank}.pickle"))
            self.record = record
        except Exception:  # noqa: BLE001 - the script's own error is what the user sees first
            return

    def close(self) -> None:
        """Stop recording the history (the script has ended)."""
        cuda = _cuda()
        if self.armed and cuda is not None:
            try:
                cuda.memory._record_memory_history(enabled=None)
            except Exception:  # noqa: BLE001
                pass
