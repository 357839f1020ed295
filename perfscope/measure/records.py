"""Reading a trial's measurement records while it runs and after it ends.

``perfscope.measure`` appends one :class:`~perfscope.measure.protocol.StepLine` per finished
step to ``rank<R>.steps.jsonl``. These helpers read them
incrementally, align the ranks' measured steps, and compute the samples a window drew from
DataLoader queues filled before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from perfscope.measure.protocol import StepLine, decode_step_lines, read_step_lines


class StepReader:
    """Reads the complete lines a rank has appended to its steps file so far.

    Attributes:
        path: The steps file (``rank<R>.steps.jsonl``).
        measured: The measured steps' lines read so far, in order.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.measured: list[StepLine] = []

    def poll(self) -> None:
        """Read what was appended since the last poll (a torn last line waits for its end)."""
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
        self.measured.extend(line for line in decode_step_lines(data[: end + 1]) if line.measured)


def new_measured(readers: Sequence[StepReader], done: int) -> list[tuple[int | None, float, float | None]]:
    """(samples over all ranks or None, longest rank's seconds, joules over all ranks or None) of
    the measured steps every rank has finished beyond the first ``done``. Each rank reads its own
    counter: its GPU's (NVML), or its machine's (RAPL, read once per rank on the machine)."""
    for reader in readers:
        reader.poll()
    complete = min(len(r.measured) for r in readers)
    out = []
    for i in range(done, complete):
        lines = [r.measured[i] for r in readers]
        longest = max(1e-9, max(line.seconds for line in lines))
        samples = [line.samples for line in lines]
        known = all(n is not None and n > 0 for n in samples)
        joules = [line.energy_j for line in lines]
        out.append((sum(samples) if known else None, longest,
                    sum(joules) if all(j is not None for j in joules) else None))
    return out


def drawn_from_queues(steps_file: Path, batch_size: int | None, measure_steps: int) -> int:
    """Samples one rank's measured window took from batches that were ready before it began.

    The measurement records the batches ready in the DataLoader's queues at each step's first
    fetch (``ready``). When the queue is lower at the step after the window than at its first
    step, the window consumed that many batches that had been loaded before it, for free; the
    sustained rate counts only what the workers produced during the window. 0 when unknown
    (``batch_size``: the DataLoader's, None when the run did not show it).
    """
    lines = read_step_lines(steps_file)
    measured = [line for line in lines if line.measured][:measure_steps]
    batch = batch_size
    if not measured or not isinstance(batch, int) or isinstance(batch, bool) or batch <= 0:
        return 0
    after = next((line for line in lines if line.step == measured[-1].step + 1), None)
    first, last = measured[0].ready, (after or measured[-1]).ready
    if first is None or last is None:
        return 0
    return max(0, first - last) * batch
