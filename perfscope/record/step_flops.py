"""The FLOPs of one training step as ``perfscope profile`` counted them, kept in the trace header.

``perfscope profile`` counts one step before the profiled window with
``torch.utils.flop_counter.FlopCounterMode`` (:mod:`perfscope.collect.flops`, the only writer) and
writes the count, with what the machine's peak rate depends on, under :data:`FLOPS_KEY`; the
trace reader reads it back with :func:`parse` (the only reader), so ``perfscope analyze`` of the
trace later gives the model FLOPs utilisation too (:mod:`perfscope.analysis.mfu`). This module
owns the format and imports nothing heavy: it is loaded into the profiled script's process.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

FLOPS_KEY = "perfscope_flops"
VERSION = 1
MAX_FLOPS = 1e24  # a step beyond a yottaFLOP is not a measurement

Count = Annotated[float, msgspec.Meta(ge=0, le=MAX_FLOPS)]


class CpuFacts(msgspec.Struct, kw_only=True):
    """What a CPU's peak rate is estimated from (``docs/metrics.md``, Model FLOPs utilisation).

    Attributes:
        model: ``model name`` of ``/proc/cpuinfo``.
        vendor: ``vendor_id`` (``GenuineIntel``, ``AuthenticAMD``...).
        cores: Physical cores among the CPUs the process may run on (``sched_getaffinity``).
        ghz: The cores' clock, GHz: ``cpuinfo_max_freq`` where the kernel gives it, else the
            ``cpu MHz`` of ``/proc/cpuinfo`` (``ghz_source`` says which).
        flags: The vector flags of ``/proc/cpuinfo`` that set the rate (avx2, fma, avx512f,
            avx512_bf16, amx_bf16, asimd, sve).
    """

    model: str | None = None
    vendor: str | None = None
    cores: Annotated[int, msgspec.Meta(ge=1, le=1 << 16)] | None = None
    ghz: Annotated[float, msgspec.Meta(gt=0, le=20)] | None = None
    ghz_source: str | None = None
    flags: list[str] = msgspec.field(default_factory=list)


class StepFlops(msgspec.Struct, kw_only=True):
    """One counted step.

    Attributes:
        version: :data:`VERSION`.
        step: The training step counted (a start-up step before the window), or None.
        flops: Its floating-point operations (forward, backward and optimizer, as
            ``FlopCounterMode`` counts them: matrix products, convolutions, attention), or None
            when not counted.
        by_dtype: FLOPs per dtype of the operators' first input (``torch.bfloat16``...).
        by_operator: FLOPs of the operators with most (``aten.mm``...), at most 12.
        skipped: Why the step was not counted, or None.
        device: The CUDA device's name where the script used CUDA, else None.
        cpu: The CPU's facts.
    """

    version: int = VERSION
    step: Annotated[int, msgspec.Meta(ge=1)] | None = None
    flops: Count | None = None
    by_dtype: dict[str, Count] = msgspec.field(default_factory=dict)
    by_operator: dict[str, Count] = msgspec.field(default_factory=dict)
    skipped: str | None = None
    device: str | None = None
    cpu: CpuFacts | None = None


def encode(record: StepFlops) -> str:
    """The header value's JSON text."""
    return msgspec.json.encode(record).decode()


def parse(value) -> tuple[StepFlops | None, list[str]]:
    """The record under :data:`FLOPS_KEY` (any JSON value), validated; (None, [why]) when it is
    not perfscope's FLOP record of this version."""
    if not isinstance(value, dict) or value.get("version") != VERSION:
        return None, ["not perfscope's FLOP record (version 1)"]
    try:
        return msgspec.convert(value, StepFlops), []
    except msgspec.ValidationError as exc:
        return None, [f"not perfscope's FLOP record ({str(exc)[:120]})"]
