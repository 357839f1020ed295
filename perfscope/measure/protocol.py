"""The records a measured run leaves for the tuner, each with one writer and one reader.

``rank<R>.steps.jsonl``: one :class:`StepLine` per finished step, appended and flushed as the
step ends (the recorder in :mod:`perfscope.measure.hooks` writes it with :func:`encode_step_line`;
the tuner reads it while the script runs with :func:`decode_step_lines`, which drops a line that
is torn or not of this shape). ``rank<R>.json``: the measurement runner (:mod:`perfscope.measure.runner`) writes one :class:`RankResult` per rank
when the script ends (or why it could not run); the trial (:mod:`perfscope.tuner.trial`) reads
them with :func:`read_rank_result`, which validates once: a file that is missing (the rank died
before it wrote one), unreadable or not of this shape reads as None, and the trial says what it
could not measure. Losses are written as Python's ``json`` writes them (``NaN`` and ``Infinity``
stay), since a loss that became NaN is what the numerics guard looks for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from perfscope.atomic import RecordFileError, read_bounded, write_text_atomic
from perfscope.record.run_steps import decode_lines


class RankResult(msgspec.Struct, kw_only=True):
    """One rank's measured run.

    Attributes:
        exit_code: The script's exit status (2: perfscope could not run it).
        error: One line when the script failed, else None.
        error_kind: ``oom`` (:data:`perfscope.errors.OOM_MESSAGE` matched) or ``error``; None.
        steps_seen: Training steps counted.
        stopped_early: perfscope ended the script after its window.
        losses: The loss of every step from step 1 (None where none was seen).
        loss_source: Where the losses were read (``perfscope.measure.losses``), or None.
        trace: Path of the trace of the profiled steps, or None.
        config_applied: The patching report of the configuration (``PatchReport.to_dict``), or None.
        facts: What the run showed about itself (``perfscope.measure.facts.run_facts``), or None.
        warmup_steps_used: Warm-up steps after the runner lengthened it (loader queues to drain).
        window: The measured window's record (``perfscope.measure.window``), None when fixed.
    """

    exit_code: int
    error: str | None = None
    error_kind: Literal["oom", "error"] | None = None
    steps_seen: int = 0
    stopped_early: bool = False
    losses: list[float | None] = msgspec.field(default_factory=list)
    loss_source: str | None = None
    trace: str | None = None
    config_applied: dict | None = None
    facts: dict | None = None
    warmup_steps_used: int | None = None
    window: dict | None = None


class StepLine(msgspec.Struct, kw_only=True):
    """One finished step of one rank.

    Attributes:
        step: The step's number, from 1.
        seconds: Its wall time, boundary to boundary (``perf_counter``).
        samples: Samples its DataLoader fetches yielded (leading dimension of the batch's first
            tensor), or None when a fetch's batch size could not be told.
        data_wait_s: Seconds the main thread waited in DataLoader fetches during the step.
        measured: Inside the measured window.
        ready: Batches ready in the DataLoader's queues at the step's first fetch, or None.
        warmup: A warm-up step (before the window).
        profiled: A step after the window (profiled, or the one step after it).
        energy_j: The energy counter's rise over the step (joules; ``--energy`` only,
            :mod:`perfscope.collect.energy`), or None.
    """

    step: Annotated[int, msgspec.Meta(ge=1)]
    seconds: Annotated[float, msgspec.Meta(ge=0)]
    samples: Annotated[int, msgspec.Meta(ge=0)] | None = None
    data_wait_s: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    measured: bool = False
    ready: Annotated[int, msgspec.Meta(ge=0)] | None = None
    warmup: bool = False
    profiled: bool = False
    energy_j: Annotated[float, msgspec.Meta(ge=0)] | None = None


_STEP_ENCODER = msgspec.json.Encoder()
_STEP_DECODER = msgspec.json.Decoder(StepLine)


def steps_path(record_dir: Path, rank: int) -> Path:
    """Where rank ``rank``'s step lines lie in a trial's record folder."""
    return Path(record_dir) / f"rank{rank}.steps.jsonl"


def encode_step_line(line: StepLine) -> bytes:
    """``line`` as one JSON line, newline included."""
    return _STEP_ENCODER.encode(line) + b"\n"


def decode_step_lines(data: bytes) -> list[StepLine]:
    """The valid step lines of ``data`` (complete lines only; torn or malformed ones dropped)."""
    return decode_lines(data, _STEP_DECODER)[0]


def read_step_lines(path: Path) -> list[StepLine]:
    """Every valid line of a steps file; [] when it is missing, unreadable or past its bound
    (:func:`perfscope.atomic.read_bounded`)."""
    try:
        return decode_step_lines(read_bounded(path))
    except (OSError, RecordFileError):
        return []


def result_path(record_dir: Path, rank: int) -> Path:
    """Where rank ``rank``'s record lies in a trial's record folder."""
    return Path(record_dir) / f"rank{rank}.json"


def write_rank_result(record_dir: Path, rank: int, result: RankResult) -> Path:
    """Write ``result`` atomically (OSError when the folder cannot take it)."""
    return write_text_atomic(result_path(record_dir, rank), json.dumps(msgspec.to_builtins(result)))


def read_rank_result(record_dir: Path, rank: int) -> RankResult | None:
    """Rank ``rank``'s record, validated; None when it is missing, unreadable or malformed."""
    try:
        raw = json.loads(read_bounded(result_path(record_dir, rank)))
        return msgspec.convert(raw, RankResult)
    except (OSError, ValueError, msgspec.ValidationError, RecordFileError):
        return None
