"""The whole-run step record: one small line per training step of a profiled run, beside the trace.

``perfscope profile`` times every step of the run outside the profiler
(:class:`perfscope.collect.run_timer.RunTimer` is the only writer) and leaves
``<trace name>.run.jsonl`` beside the rank's trace (``rank0.pt.trace.json.gz`` ->
``rank0.run.jsonl``; a name that does not end in ``.json``, so no trace reader takes it for a
trace). The analysis reads it with :func:`read_run_steps` (the only reader) for the run-level
view (:mod:`perfscope.analysis.run_view`). Lines are appended as the run goes, so a run that dies
keeps the steps it finished; a torn or malformed line is dropped, not fatal.

Times are seconds of ``time.perf_counter_ns``; memory is bytes, read at the step's end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec

from perfscope.atomic import RecordFileError, read_bounded

SUFFIX = ".run.jsonl"
# Suffixes of trace files whose stem names the record beside them (the longest first).
_TRACE_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json", ".json.gz", ".json")
# Lines kept per run: about 150 bytes each, so at most ~30 MB for the longest run; a run past it
# keeps its first MAX_LINES steps and its record says so (``RunStep.last`` of the final line).
MAX_LINES = 200_000

Seconds = Annotated[float, msgspec.Meta(ge=0)]
Bytes = Annotated[int, msgspec.Meta(ge=0)]


class RunStep(msgspec.Struct, kw_only=True, array_like=True):
    """One finished training step (one optimizer update of the leading optimizer).

    Written as a JSON array in field order, to keep a line short.

    Attributes:
        step: The training step's number, from 1 (the profiler's ``ProfilerStep#N`` is step N).
        end: Seconds from the run's first step boundary to this step's end.
        seconds: The step's wall time, from the previous step's end to this one's.
        input: Seconds the training thread waited in DataLoader fetches.
        forward: Seconds from the end of a fetch (or the step's start, or a backward's end when
            no fetch came between) to the next ``backward`` call: the forward pass and the loss.
        backward: Seconds in ``torch.autograd.backward`` (``loss.backward()``).
        optimizer: Seconds in optimizer steps (every optimizer's, on the training thread).
        profiler: Seconds the profiler itself took at the step's boundaries (starting, stopping,
            writing the trace): perfscope's cost, part of ``seconds``.
        traced: The profiler traced the step (its warm-up or its recorded window), or perfscope
            counted its FLOPs (:mod:`perfscope.collect.flops`): either slows it.
        rss: The process's resident set at the step's end, bytes; None when not read (it is read
            at most every :data:`perfscope.collect.run_timer.MEMORY_EVERY_S`).
        device_allocated: CUDA bytes allocated at the step's end (the caching allocator's
            ``memory_allocated``); None without CUDA.
        device_reserved: CUDA bytes reserved by the caching allocator at the step's end; None
            without CUDA.
        last: The record stops here although the run went on (:data:`MAX_LINES`).
    """

    step: Annotated[int, msgspec.Meta(ge=1)]
    end: Seconds
    seconds: Seconds
    input: Seconds = 0.0
    forward: Seconds = 0.0
    backward: Seconds = 0.0
    optimizer: Seconds = 0.0
    profiler: Seconds = 0.0
    traced: bool = False
    rss: Bytes | None = None
    device_allocated: Bytes | None = None
    device_reserved: Bytes | None = None
    last: bool = False

    @property
    def other(self) -> float:
        """Seconds of the step in none of the phases (zero_grad, logging, the scheduler...)."""
        return max(self.own - self.input - self.forward - self.backward - self.optimizer, 0.0)

    @property
    def own(self) -> float:
        """The step's seconds without the profiler's own work at its boundaries."""
        return max(self.seconds - self.profiler, 0.0)


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(RunStep)


def run_steps_path(trace: Path) -> Path:
    """Where the whole-run record of the trace at ``trace`` lies (beside it)."""
    trace = Path(trace)
    name = trace.name
    for suffix in _TRACE_SUFFIXES:
        if name.endswith(suffix):
            return trace.with_name(name[: -len(suffix)] + SUFFIX)
    return trace.with_name(name + SUFFIX)


def encode_run_step(step: RunStep) -> bytes:
    """``step`` as one JSON line, newline included."""
    return _ENCODER.encode(step) + b"\n"


def decode_lines(data: bytes, decoder: msgspec.json.Decoder) -> tuple[list, int]:
    """The lines of ``data`` that ``decoder`` reads, in order, and how many it could not read: a
    torn or malformed line (a run that died mid-write, a hand edit) is dropped and counted, not
    fatal. Blank lines are neither. Shared by the JSON-lines records of the whole run (here) and of
    a trial (:mod:`perfscope.measure.protocol`)."""
    out, dropped = [], 0
    for raw in data.splitlines():
        if not raw.strip():
            continue
        try:
            out.append(decoder.decode(raw))
        except msgspec.DecodeError:  # ValidationError is a DecodeError
            dropped += 1
    return out, dropped


def decode_run_steps(data: bytes) -> list[RunStep]:
    """The valid lines of ``data`` in order (torn or malformed ones dropped)."""
    return decode_lines(data, _DECODER)[0]


class RunRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`read_run_steps` found beside a trace.

    Attributes:
        path: The record's path.
        steps: Its valid lines in order; None where there is no record or it was not read.
        dropped: Lines that are torn or malformed (not :class:`RunStep` s), left out.
        problem: Why the record was not read (too large, not a regular file, unreadable); None
            where it was read or there is none.
    """

    path: Path
    steps: list[RunStep] | None = None
    dropped: int = 0
    problem: str | None = None


def read_run_steps(trace: Path) -> RunRecord:
    """The whole-run record beside ``trace``, read with a bound
    (:func:`perfscope.atomic.read_bounded`)."""
    path = run_steps_path(trace)
    try:
        data = read_bounded(path)
    except FileNotFoundError:
        return RunRecord(path=path)
    except OSError as e:
        return RunRecord(path=path, problem=f"cannot be read ({e.strerror or e})")
    except RecordFileError as e:
        return RunRecord(path=path, problem=str(e).removeprefix(f"{path}: "))
    steps, dropped = decode_lines(data, _DECODER)
    return RunRecord(path=path, steps=steps, dropped=dropped)
