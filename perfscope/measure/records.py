"""Reading a trial's measurement records while it runs and after it ends.

``perfscope.measure`` appends one JSON line per finished step to ``rank<R>.steps.jsonl``
(fields: step, seconds, samples, data_wait_s, measured, warmup, ready). These helpers read them
incrementally, align the ranks' measured steps, and compute the samples a window drew from
DataLoader queues filled before it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path


class StepReader:
    """Reads the complete lines a rank has appended to its steps file so far."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.measured: list[dict] = []

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n")
        if end < 0:
            return
        self.offset += end + 1
        for line in data[: end + 1].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("measured"):
                self.measured.append(record)


def new_measured(readers: Sequence[StepReader], done: int) -> list[tuple[int | None, float]]:
    """(samples over all ranks or None, longest rank's seconds) of the measured steps every rank
    has finished beyond the first ``done``."""
    for reader in readers:
        reader.poll()
    complete = min(len(r.measured) for r in readers)
    out = []
    for i in range(done, complete):
        records = [r.measured[i] for r in readers]
        longest = max(1e-9, max(float(rec.get("seconds") or 0.0) for rec in records))
        samples = [rec.get("samples") for rec in records]
        known = all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in samples)
        out.append((sum(samples) if known else None, longest))
    return out


def drawn_from_queues(steps_file: Path, batch_size: int | None, measure_steps: int) -> int:
    """Samples one rank's measured window took from batches that were ready before it began.

    The measurement records the batches ready in the DataLoader's queues at each step's first
    fetch (``ready``). When the queue is lower at the step after the window than at its first
    step, the window consumed that many batches that had been loaded before it, for free; the
    sustained rate counts only what the workers produced during the window. 0 when unknown
    (``batch_size``: the DataLoader's, None when the run did not show it).
    """
    records = [r for r in read_jsonl(steps_file) if isinstance(r.get("step"), int)]
    measured = [r for r in records if r.get("measured")][:measure_steps]
    batch = batch_size
    if not measured or not isinstance(batch, int) or isinstance(batch, bool) or batch <= 0:
        return 0
    after = next((r for r in records if r["step"] == measured[-1]["step"] + 1), None)
    first, last = measured[0].get("ready"), (after or measured[-1]).get("ready")
    if not isinstance(first, int) or not isinstance(last, int):
        return 0
    return max(0, first - last) * batch


def read_jsonl(path: Path) -> list[dict]:
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


