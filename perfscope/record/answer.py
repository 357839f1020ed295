"""The answer a program reads: ``perfscope analyze --json`` and ``perfscope profile --json`` print
one :class:`Answer` on standard output, built from the run's record (``summary.json``) alone.

What the console prints for a person, as one JSON document: the verdict or why there is none,
whether it is provisional, the clock its figures are on, the shares, and one advice item per
removable class with a cost (what to change, its what-if, the evidence). A figure perfscope
abstains from is ``null`` with a reason beside it, never 0. ``docs/answer.schema.json`` is the JSON
Schema generated from these structs (``python -m perfscope.record.answer``; a test fails when the
file differs).

Units: ``*_us`` microseconds, shares are fractions of ``step_time_us`` in [0, 1].
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from perfscope import steptime
from perfscope.classes import BY_NAME, CLASSES, KNOBS, REMOVABLE
from perfscope.record.schema import Cost
from perfscope.record.view import Record, record_of
from perfscope.version import __version__

SCHEMA = "perfscope.answer"
SCHEMA_VERSION = 1

NonNeg = Annotated[float, Meta(ge=0)]
Count = Annotated[int, Meta(ge=0)]

MEASURED = "measured"
WAITFREE = "waits for a core taken out"


class WhatIf(msgspec.Struct, kw_only=True):
    """The step time with one class's cost removed from every step (an upper bound of the gain)."""

    step_time_without_us: Annotated[float, Meta(ge=0, description="the run's step time without the cost")]
    saved_us_per_step: Annotated[float, Meta(description="what it saves a step")]
    speedup: Annotated[float | None, Meta(description="step time over step time without (null: nothing left)")]


class AdviceItem(msgspec.Struct, kw_only=True):
    """One removable class with a cost, largest saving first."""

    class_: Annotated[str, Meta(description="io, comm or launch")] = msgspec.field(name="class")
    share: Annotated[float, Meta(ge=0, le=1, description="its share of the step time, on the answer's basis")]
    change: Annotated[str | None, Meta(description="what to change (the knobs), fitted to the trace")]
    knobs: Annotated[list[str], Meta(description=(
        "the configuration keys `change` names (`perfscope profile --config`, `perfscope tune`), in its order; "
        "empty where it names none"))] = []
    what_if: Annotated[WhatIf | None, Meta(description="the step without it; null with `what_if_why`")]
    what_if_why: Annotated[str | None, Meta(description="why there is no what-if (null when there is one)")] = None
    evidence: Annotated[str, Meta(description="what the share measures, in words")]


class Answer(msgspec.Struct, kw_only=True):
    """``perfscope analyze --json`` and ``perfscope profile --json``: the run's answer."""

    schema: Annotated[str, Meta(description='always "perfscope.answer"')] = SCHEMA
    schema_version: Annotated[int, Meta(description="1")] = SCHEMA_VERSION
    perfscope_version: str = __version__
    mode: Annotated[str | None, Meta(description='"gpu" or "cpu"')] = None
    verdict: Annotated[str | None, Meta(description="io-bound, compute-bound, launch-bound or comm-bound; null with `reason`")]
    reason: Annotated[str | None, Meta(description="why there is no verdict (null when there is one)")] = None
    provisional: Annotated[bool, Meta(description=(
        "no step had clean evidence: the steps that waited for a core were classified with that wait taken out"))]
    basis: Annotated[str, Meta(description=(
        f'the clock of every figure below: "{MEASURED}", or "{WAITFREE}" for a provisional verdict'))]
    core_wait_share: Annotated[float | None, Meta(description=(
        "provisional: the training thread's waits for a core as a share of those steps' wall time"))] = None
    step_time_us: Annotated[NonNeg | None, Meta(description="the run's step time on the basis; null: no counted step")]
    measured_step_time_us: Annotated[NonNeg | None, Meta(description="the same steps as measured")] = None
    shares: Annotated[dict[str, float] | None, Meta(description=(
        "each class's share of the step time (io, comm, launch, compute; other on GPU runs); null without a verdict"))]
    runner_up: Annotated[str | None, Meta(description='the next class by share, or "none"')] = None
    advice: Annotated[list[AdviceItem], Meta(description="one item per removable class with a cost, largest saving first")]
    summary_advice: Annotated[str | None, Meta(description="the verdict's advice line (without a verdict: how to get one)")]
    verdict_knobs: Annotated[list[str], Meta(description=(
        "the configuration keys the verdict's advice names (empty without a verdict, or where it names none)"))] = []
    mfu: Annotated[NonNeg | None, Meta(description="model FLOPs utilisation over the same step time; null with `mfu_why`")]
    mfu_why: Annotated[str | None, Meta(description="why `mfu` is null (null when it is not)")] = None
    cost: Annotated[Cost | None, Meta(description=(
        "USD per step, per 1,000 samples and per run, and what the removable and idle shares cost a step "
        "(`--price-per-hour`); null with `cost_why`"))] = None
    cost_why: Annotated[str | None, Meta(description="why `cost` is null (null when it is not)")] = None
    energy_per_step_j: Annotated[NonNeg | None, Meta(description=(
        "joules a step for the job (NVML on GPUs, RAPL on CPUs); null with `energy_why`"))] = None
    energy_why: Annotated[str | None, Meta(description="why `energy_per_step_j` is null (null when it is not)")] = None
    steps_counted: Annotated[Count | None, Meta(description="steps the verdict is taken over")] = None
    steps_total: Annotated[Count | None, Meta(description="all steps")] = None
    warnings: Annotated[list[str], Meta(description="problems that did not stop the analysis")]
    summary_path: Annotated[str | None, Meta(description="summary.json written beside the answer")] = None
    report_path: Annotated[str | None, Meta(description="report.html written beside the answer")] = None


def answer_of(summary: dict | Record, paths: dict | None = None) -> Answer:
    """The :class:`Answer` of a run record (``summary.json`` as data, or its :class:`Record`).

    Args:
        summary: The record.
        paths: ``{"summary": Path, "report": Path}`` written beside it, or None.

    Raises:
        PerfscopeError: a malformed record (:func:`~perfscope.record.view.record_of`).
    """
    record = record_of(summary)
    overall, details = record.overall_or_empty(), record.details_or_empty()
    shares = None
    if overall.fractions is not None and overall.verdict:
        shares = {k: float(v) for k, v in msgspec.structs.asdict(overall.fractions).items() if v is not None}
    keys = details.knobs if details.knobs is not None else {c: list(KNOBS[(c, record.mode or "cpu")]) for c in CLASSES}
    mfu_value, mfu_why = _mfu(details.mfu)
    energy = details.energy
    return Answer(
        mode=record.mode, **_verdict_fields(record, keys), shares=shares,
        advice=_advice_items(shares or {}, details, record.mode or "cpu", keys),
        summary_advice=overall.advice, cost=details.cost,
        cost_why=None if details.cost is not None else "no price given (--price-per-hour USD)",
        energy_per_step_j=energy.per_step_j if energy else None, energy_why=_energy_why(energy),
        mfu=mfu_value, mfu_why=mfu_why,
        steps_counted=overall.steps_counted, steps_total=overall.steps_total, warnings=list(record.warnings or []),
        summary_path=str(paths["summary"]) if paths else None, report_path=str(paths["report"]) if paths else None,
    )


def _verdict_fields(record: Record, keys: dict) -> dict:
    """The answer's verdict, its clock and what it rests on: with a provisional verdict the step time
    is without the waits for a core (``basis`` waitfree), and the measured one is given beside it."""
    overall = record.overall_or_empty()
    provisional = bool(overall.provisional)
    step_time = overall.step_time_us  # on the verdict's clock, as the record's what-ifs are
    measured = (steptime.measured_step_time_us(steptime.verdict_rows(record.steps or [], True))
                if provisional else step_time)
    verdict = overall.verdict
    return {"verdict": verdict,
            "reason": None if verdict else (overall.reason or "no step has the evidence for a verdict"),
            "provisional": provisional, "basis": WAITFREE if provisional else MEASURED,
            "core_wait_share": overall.core_wait_share if provisional else None,
            "step_time_us": step_time, "measured_step_time_us": measured,
            "runner_up": overall.runner_up if verdict else None,
            "verdict_knobs": keys.get(verdict.removesuffix("-bound"), []) if verdict else []}


def _advice_items(shares: dict, details, mode: str, keys: dict) -> list[AdviceItem]:
    """An item per removable class with a share, the largest measured saving first."""
    what_ifs = {w.class_: w for w in details.what_if or []}
    texts = msgspec.structs.asdict(details.advice) if details.advice is not None else {}
    advice = []
    for name in REMOVABLE:
        share = shares.get(name)
        if not share or share <= 0:
            continue
        w = what_ifs.get(name)
        what_if = None if w is None else WhatIf(step_time_without_us=w.step_time_without_us,
                                                  saved_us_per_step=w.saved_us_per_step, speedup=w.speedup)
        advice.append(AdviceItem(
            class_=name, share=share, change=texts.get(name) or BY_NAME[name].advice.get(mode), knobs=keys.get(name, []),
            what_if=what_if, what_if_why=None if what_if else "no counted step to remove it from",
            evidence=f"{BY_NAME[name].means.get(mode, name)}: {share:.0%} of the step time"))
    advice.sort(key=lambda a: -(a.what_if.saved_us_per_step if a.what_if else 0.0))
    return advice


def _mfu(mfu) -> tuple[float | None, str | None]:
    """``(mfu, mfu_why)`` of the record's ``details.mfu``."""
    if mfu is None:
        return None, "no trace has FLOPs (neither counted by `perfscope profile` nor input shapes)"
    if mfu.mfu is not None:
        return mfu.mfu, None
    return None, mfu.why or "the record gives no figure and no reason (written by an older perfscope?)"


def _energy_why(energy) -> str | None:
    if energy is None:
        return "no host record (perfscope profile writes one beside the trace; it reads the energy counter)"
    return None if energy.per_step_j is not None else energy.why


def encode(answer: Answer) -> str:
    """The answer as one line of JSON."""
    return msgspec.json.encode(answer).decode()


def schema() -> dict:
    """The JSON Schema of :class:`Answer` (``docs/answer.schema.json``)."""
    return msgspec.json.schema(Answer)


if __name__ == "__main__":
    import json

    print(json.dumps(schema(), indent=2, sort_keys=True))
