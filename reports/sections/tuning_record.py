"""Reading a tuning record (``tune.json``, docs/tune-record.md) without trusting it, and the words
and numbers the tuning report's sections share.

The record is read once into the schema's structs (:mod:`perfscope.record.tune_schema`) by
:func:`read`, leniently: a part missing, ``null`` or of the wrong type (a hand-edited record, one
written by an older or newer perfscope, one a killed study left) reads as ``None`` and shows as
``-`` or "not available", never as an exception. Numbers still pass through ``num`` where they
are shown, because a float field may hold NaN or an infinity. Nothing here escapes: callers pass
the text through ``esc``.
"""

from __future__ import annotations

import json
import re
from urllib.parse import quote

from perfscope.record.lenient import lenient
from perfscope.record.tune_schema import Candidate, Trial, TuneRecord
from perfscope.record.values import finite_numbers
from perfscope.reports.html import num

DEFAULT_UNIT = "samples/s"
INFEASIBLE = "infeasible"
OUTCOMES = ("complete", "pruned", INFEASIBLE, "running")


def read(record) -> TuneRecord:
    """The tuning record as the schema's structs, read leniently (:func:`perfscope.record.lenient.lenient`):
    a part of the wrong type reads as absent, anything but a mapping as an empty record."""
    return record if isinstance(record, TuneRecord) else lenient(record, TuneRecord)


def word(value, default: str = "-") -> str:
    """A short text field: strings as they are, numbers and booleans as text, anything else ``default``."""
    if isinstance(value, str):
        return value if value.strip() else default
    if isinstance(value, (bool, int, float)):
        return str(value)
    return default


def value_text(value) -> str:
    """A knob value as ``best.yaml`` writes it: ``true``, ``4``, ``bf16``; ``unset`` for null."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (int, str)):
        return str(value)
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return str(value)


def changes_text(config: dict | None, empty: str = "no change") -> str:
    """``num_workers 4, pin_memory true`` for a config of changes."""
    return ", ".join(f"{k} {value_text(v)}" for k, v in config.items()) if config else empty


def amount(value) -> str:
    """A throughput (samples/s or steps/s) with a sensible number of digits; ``-`` when unknown."""
    v = num(value)
    if v is None:
        return "-"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"


def ratio(value) -> str:
    v = num(value)
    return "-" if v is None else f"{v:.2f}x"


def seconds(value) -> str:
    v = num(value)
    if v is None:
        return "-"
    return f"{v:.0f} s" if abs(v) >= 10 else f"{v:.1f} s"


def unit(record: TuneRecord) -> str:
    u = record.objective.unit if record.objective is not None else None
    return u if u is not None and u.strip() else DEFAULT_UNIT


def trials(record: TuneRecord) -> list[Trial]:
    """The record's trials in trial-number order (unnumbered ones last, in record order)."""
    return sorted(record.trials or [], key=lambda t: (t.number is None, t.number or 0))


def same_trial(a, b) -> bool:
    """Trial numbers equal (``3`` and ``3.0`` alike); never equal when either is unknown."""
    na, nb = num(a), num(b)
    return na is not None and na == nb


def find_trial(record: TuneRecord, number) -> Trial | None:
    return next((t for t in trials(record) if same_trial(t.number, number)), None)


def outcome(trial: Trial) -> str:
    """``complete`` (finished and feasible), ``pruned``, ``infeasible`` (failed, out of memory,
    timed out, unsafe numerics: anything the sampler was told is infeasible) or ``running``
    (running, waiting, or a state this version does not know).

    The tuner stores a failed run as a *complete* Optuna trial of value 0 with its ``failure`` and
    ``feasible: false``; pruned and running trials are never ``feasible`` either, so that flag only
    decides for complete trials.
    """
    state = trial.state
    if state == "failed" or trial.failure is not None or (trial.numerics is not None and trial.numerics.status == "unsafe"):
        return INFEASIBLE
    if state == "pruned":
        return "pruned"
    if state == "complete":
        return INFEASIBLE if trial.feasible is False else "complete"
    return "running"


def _failure_bits(trial: Trial) -> list[str]:
    """``["kind: reason"]`` of a failed trial (``["failed"]`` without either), else ``[]``."""
    failure = trial.failure
    if failure is not None:
        kind, reason = word(failure.kind, ""), word(failure.reason, "")
        return [f"{kind}: {reason}" if kind and reason else kind or reason or "failed"]
    return ["failed"] if trial.state == "failed" else []


def failure_text(trial: Trial) -> str:
    """``oom: CUDA out of memory ...``; the numerics guard's finding when it found the loss unsafe."""
    bits = _failure_bits(trial)
    numerics = trial.numerics
    if numerics is not None and numerics.status == "unsafe":
        detail = word(numerics.detail, "")
        if not (bits and detail and detail in bits[0]):
            bits.append("numerics unsafe" + (f": {detail}" if detail else ""))
    return "; ".join(bits)


def last_value(trial: Trial) -> float | None:
    """Where a pruned trial stopped: the throughput so far it last reported (its ``value``), else the
    last of its ``step_values``; None when it reported nothing."""
    v = num(trial.value)
    if v is not None:
        return v
    values = finite_numbers(trial.step_values)
    return values[-1] if values else None


def best_trial(record: TuneRecord) -> Trial | None:
    """The complete feasible trial with the highest value (the study maximises)."""
    done = [t for t in trials(record) if outcome(t) == "complete" and num(t.value) is not None]
    return max(done, key=lambda t: num(t.value)) if done else None


def baseline_values(record: TuneRecord) -> dict:
    """Knob -> the baseline's value, from the searched space."""
    searched = record.space.searched if record.space is not None else None
    return {k.name: k.baseline for k in searched or [] if k.name is not None}


def confidence(record: TuneRecord) -> float:
    c = num(record.confirmation.confidence) if record.confirmation is not None else None
    return c if c is not None and 0 < c < 1 else 0.95


def min_gain(record: TuneRecord) -> float:
    g = num(record.confirmation.min_gain) if record.confirmation is not None else None
    return g if g is not None and g >= 0 else 0.0


def rounds(record: TuneRecord, candidate: Candidate | None = None) -> int | None:
    """Rounds of a candidate's confirmation (its own count: sequential rounds stop per candidate),
    else the confirmation's."""
    if candidate is not None and candidate.rounds:
        return candidate.rounds
    if record.confirmation is not None and record.confirmation.rounds is not None:
        return record.confirmation.rounds
    if candidate is not None:
        return len(finite_numbers(candidate.candidate)) or None
    return None


def candidates(record: TuneRecord) -> list[Candidate]:
    return (record.confirmation.candidates or []) if record.confirmation is not None else []


def interval_text(record: TuneRecord, low, high, n_rounds: int | None) -> str:
    """``95% interval 1.61x–2.02x, 5 rounds`` (parts that are unknown left out)."""
    lo, hi = num(low), num(high)
    bits = []
    if lo is not None and hi is not None:
        bits.append(f"{confidence(record):.0%} interval {lo:.2f}x–{hi:.2f}x")
    if n_rounds:
        bits.append(f"{n_rounds} round" + ("s" if n_rounds != 1 else ""))
    return ", ".join(bits)


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")


def local_href(path) -> str | None:
    """A relative link to a file of the output folder, or None for anything else (an absolute
    path, a URL, ``javascript:``, a protocol-relative ``//host``): the page links only to its
    neighbours. The result is percent-encoded; it still goes through ``esc`` in the attribute."""
    if not isinstance(path, str) or not path.strip():
        return None
    p = path.strip().replace("\\", "/")
    if p.startswith("/") or _SCHEME.match(p):
        return None
    return quote(p, safe="/")
