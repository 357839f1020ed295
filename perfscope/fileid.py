"""Telling whether a file on disk is still the one an analysis read.

A summary records a fingerprint of every trace it was made from; ``perfscope report`` compares it
with the trace it finds, so the timeline of a later run's trace is never drawn under the step
times of an earlier summary (a re-run interrupted after its trace was written leaves exactly that).
The fingerprint reads the size and the first and last 64 KiB: a gzip header carries its own
timestamp and a Kineto trace its own times, so two runs' traces differ there, while a copy of an
output directory (whose file times change) keeps its fingerprints.
"""

from __future__ import annotations

import hashlib
import os

_EDGE_BYTES = 64 * 1024


def fingerprint(path: str | os.PathLike) -> str | None:
    """A short hex fingerprint of the file's size and edges; None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            digest = hashlib.sha256(str(size).encode() + b"\0" + f.read(_EDGE_BYTES))
            if size > 2 * _EDGE_BYTES:
                f.seek(size - _EDGE_BYTES)
            digest.update(f.read(_EDGE_BYTES))
    except OSError:
        return None
    return digest.hexdigest()[:32]
