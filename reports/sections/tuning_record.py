"""Reading a tuning record (``tune.json``, docs/tune.md) without trusting it, and the words and
numbers the tuning report's sections share.

Every accessor tolerates a missing part, a ``null`` and a value of the wrong type (a hand-edited
record, one written by an older or newer perfscope): what cannot be read shows as ``-`` or "not
available", never as an exception. Nothing here escapes: callers pass the text through ``esc``.
"""

from __future__ import annotations

import json
import re
from urllib.parse import quote

from perfscope.reports.html import num

DEFAULT_UNIT = "samples/s"
INFEASIBLE = "infeasible"
OUTCOMES = ("complete", "pruned", INFEASIBLE, "running")


def obj(value) -> dict:
    return value if isinstance(value, dict) else {}


def seq(value) -> list:
    return value if isinstance(value, list) else []


def dicts(value) -> list[dict]:
    return [x for x in seq(value) if isinstance(x, dict)]


def numbers(value) -> list[float]:
    """The finite numbers of a list (anything else dropped)."""
    return [v for v in (num(x) for x in seq(value)) if v is not None]


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


def changes_text(config, empty: str = "no change") -> str:
    """``num_workers 4, pin_memory true`` for a config of changes."""
    items = obj(config)
    return ", ".join(f"{k} {value_text(v)}" for k, v in items.items()) if items else empty


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


def unit(record: dict) -> str:
    u = obj(record.get("objective")).get("unit")
    return u if isinstance(u, str) and u.strip() else DEFAULT_UNIT


def trials(record: dict) -> list[dict]:
    """The record's trials in trial-number order (unnumbered ones last, in record order)."""
    rows = dicts(record.get("trials"))
    return sorted(rows, key=lambda t: (num(t.get("number")) is None, num(t.get("number")) or 0.0))


def same_trial(a, b) -> bool:
    """Trial numbers equal (``3`` and ``3.0`` alike); never equal when either is unknown."""
    na, nb = num(a), num(b)
    return na is not None and na == nb


def find_trial(record: dict, number) -> dict | None:
    return next((t for t in trials(record) if same_trial(t.get("number"), number)), None)


def outcome(trial: dict) -> str:
    """``complete`` (finished and feasible), ``pruned``, ``infeasible`` (failed, out of memory,
    timed out, unsafe numerics: anything the sampler was told is infeasible) or ``running``
    (running, waiting, or a state this version does not know).

    The tuner stores a failed run as a *complete* Optuna trial of value 0 with its ``failure`` and
    ``feasible: false``; pruned and running trials are never ``feasible`` either, so that flag only
    decides for complete trials.
    """
    state = trial.get("state")
    if state == "failed" or obj(trial.get("failure")) or obj(trial.get("numerics")).get("status") == "unsafe":
        return INFEASIBLE
    if state == "pruned":
        return "pruned"
    if state == "complete":
        return INFEASIBLE if trial.get("feasible") is False else "complete"
    return "running"


def _failure_bits(trial: dict) -> list[str]:
    """``["kind: reason"]`` of a failed trial (``["failed"]`` without either), else ``[]``."""
    failure = obj(trial.get("failure"))
    if failure:
        kind, reason = word(failure.get("kind"), ""), word(failure.get("reason"), "")
        return [f"{kind}: {reason}" if kind and reason else kind or reason or "failed"]
    return ["failed"] if trial.get("state") == "failed" else []


def failure_text(trial: dict) -> str:
    """``oom: CUDA out of memory ...``; the numerics guard's finding when it found the loss unsafe."""
    bits = _failure_bits(trial)
    numerics = obj(trial.get("numerics"))
    if numerics.get("status") == "unsafe":
        detail = word(numerics.get("detail"), "")
        if not (bits and detail and detail in bits[0]):
            bits.append("numerics unsafe" + (f": {detail}" if detail else ""))
    return "; ".join(bits)


def last_value(trial: dict) -> float | None:
    """Where a pruned trial stopped: the throughput so far it last reported (its ``value``), else the
    last of its ``step_values``; None when it reported nothing."""
    v = num(trial.get("value"))
    if v is not None:
        return v
    values = numbers(trial.get("step_values"))
    return values[-1] if values else None


def best_trial(record: dict) -> dict | None:
    """The complete feasible trial with the highest value (the study maximises)."""
    done = [t for t in trials(record) if outcome(t) == "complete" and num(t.get("value")) is not None]
    return max(done, key=lambda t: num(t.get("value"))) if done else None


def baseline_values(record: dict) -> dict:
    """Knob -> the baseline's value, from the searched space."""
    space = obj(record.get("space"))
    return {str(k["name"]): k.get("baseline") for k in dicts(space.get("searched")) if "name" in k}


def confidence(record: dict) -> float:
    c = num(obj(record.get("confirmation")).get("confidence"))
    return c if c is not None and 0 < c < 1 else 0.95


def min_gain(record: dict) -> float:
    g = num(obj(record.get("confirmation")).get("min_gain"))
    return g if g is not None and g >= 0 else 0.0


def rounds(record: dict, candidate: dict | None = None) -> int | None:
    """Rounds of a candidate's confirmation (its own count: sequential rounds stop per candidate),
    else the confirmation's."""
    own = num(obj(candidate).get("rounds")) if candidate is not None else None
    if own:
        return int(own)
    conf = obj(record.get("confirmation"))
    n = num(conf.get("rounds"))
    if n is not None:
        return int(n)
    if candidate is not None:
        k = len(numbers(candidate.get("candidate")))
        return k or None
    return None


def candidates(record: dict) -> list[dict]:
    return dicts(obj(record.get("confirmation")).get("candidates"))


def interval_text(record: dict, low, high, n_rounds: int | None) -> str:
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
